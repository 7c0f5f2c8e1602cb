"""The run plan's tasks: which models and seeds are trained on which task, which tasks are evaluated (and on
whose runs), and each task's options, evaluation and KL settings."""

from __future__ import annotations

from esrepro.settings.layers import Layer, resolve
from esrepro.settings.methods import SnapshotRef
from esrepro.settings.pipeline import EvalSettings, KLSettings


class TasksMixin:
    """:class:`~esrepro.pipeline.Pipeline`'s training and evaluation plan (``self.cfg``, ``self.models``)."""

    def train_methods(self, task: str) -> list[str]:
        """Methods trained on ``task`` (``train.<task>.methods``), in table order."""
        block = self.cfg.train.get(task)
        return list(block.methods) if block else []

    # --- v2: per-task models, extra seeds, every model a run touches --------------------
    def train_models(self, task: str) -> list[str]:
        """Models trained on ``task``: ``train.<task>.models``, else the config's models."""
        block = self.cfg.train.get(task)
        return list(block.models) if block is not None and block.models else list(self.models)

    def eval_models(self, task: str) -> list[str]:
        """Models evaluated only (as base models) on ``task``'s evaluation sets (``train.<task>.eval_models``)."""
        block = self.cfg.train.get(task)
        return list(block.eval_models) if block is not None else []

    def snapshots(self, task: str) -> dict[str, SnapshotRef]:
        """Kept snapshots of ``task``'s runs evaluated as runs of their own (``train.<task>.snapshots``)."""
        block = self.cfg.train.get(task)
        return dict(block.snapshots) if block is not None else {}

    def start_of(self, model: str, task: str, method: str) -> SnapshotRef | None:
        """The weights a run of ``method`` on ``task`` starts from (``start_from``); None: the base model."""
        if method not in self.train_methods(task) or self.is_rl(task, method):
            return None
        return getattr(self.method_settings(model, task, method), "start_from", None)

    def stability_seeds(self, task: str, model: str, method: str) -> list[int]:
        """Extra seeds the ``stability`` block asks for this run (empty when none)."""
        st = self.cfg.stability
        if st is None or st.task != task or model not in st.models or method not in st.methods:
            return []
        return st.seeds_of_method(method)

    def claims_seeds(self, task: str, model: str, method: str) -> list[int]:
        """Extra seeds ``claims.seeds`` asks for this run: Table 1's ES and RL runs get the config's seeds, then the
        next unused ones, up to that many (empty when none)."""
        want, have = self.cfg.claims.seeds, list(self.seeds)
        t1 = self.cfg.report.table1.task
        if want <= len(have) or task != t1 or model not in self.train_models(task) or \
                method not in self.train_methods(task) or not (method == "es" or self.is_rl(task, method)):
            return []
        free = (s for s in range(want + len(have)) if s not in have)
        return [next(free) for _ in range(want - len(have))]

    def all_models(self) -> list[str]:
        """Every model a job of this config touches: the config's, each training task's and each study's."""
        out = list(self.models)
        out += [m for task in self.cfg.train for m in self.train_models(task) + self.eval_models(task)]
        out += [m for s in self.studies().values() for m in s.models]
        if self.cfg.stability is not None:
            out += list(self.cfg.stability.models)
        out += [m for task in self.essa_tasks() for m in self.essa_models(task)]
        return list(dict.fromkeys(m for m in out if m in self.registry))

    def evaluated_tasks(self) -> list[str]:
        """Tasks evaluated: every ``evaluate`` entry, then every training task that no entry evaluates through
        ``train_task`` (on its own test split, with ``defaults.evaluate``)."""
        out = list(self.cfg.evaluate)
        covered = {self.train_task_of(t) for t in out}
        return out + [t for t in self.cfg.train if t not in covered and t not in out]

    def eval_sets_of(self, train_task: str) -> list[str]:
        """The evaluated tasks whose runs are ``train_task``'s (its test sets)."""
        return [t for t in self.evaluated_tasks() if self.train_task_of(t) == train_task]

    # --- evaluation, KL, task options -------------------------------------------------
    def task_options(self, task: str) -> dict:
        """A task's options (``task_options.<task>``), for training and evaluation alike."""
        return dict(self.cfg.task_options.get(task, {}))

    def eval_settings(self, task: str) -> EvalSettings:
        """``evaluate.<task>`` over ``defaults.evaluate`` (a training task without an entry: the defaults alone)."""
        return resolve(EvalSettings, [Layer(self.source, "defaults.evaluate", dict(self.cfg.defaults.evaluate)),
                                      Layer(self.source, f"evaluate.{task}", dict(self.cfg.evaluate.get(task) or {}))])

    def kl_settings(self, task: str) -> KLSettings:
        """``kl.<task>`` over ``defaults.kl``."""
        return resolve(KLSettings, [Layer(self.source, "defaults.kl", dict(self.cfg.defaults.kl)),
                                    Layer(self.source, f"kl.{task}", dict(self.cfg.kl[task] or {}))])

    def train_task_of(self, task: str) -> str:
        """The training task whose runs are evaluated on ``task`` (itself unless ``evaluate.<task>.train_task``)."""
        return (self.cfg.evaluate.get(task) or {}).get("train_task") or task
