"""The ESSA study (``studies.essa``): its tasks (its own and its scaling block's), models, run configurations
(the reference run, one per swept value, the GRPO baseline), runs, sweeps, and the settings layers of its runs."""

from __future__ import annotations

from typing import Any

from esrepro.pipeline.names import ESSA_GRPO, ESSA_REF, ESSA_STUDY, ESSA_SWEEPS, StudyMethod
from esrepro.settings.layers import Layer
from esrepro.settings.pipeline import ESSAStudy


def _engine_for(setting: str, value: Any) -> dict:
    """What a swept value needs of the engines (ESSA Fig. 9: INT8 and INT4 through bitsandbytes, inference on
    vLLM, Sec. 4.3): INT4 runs on the study's backend (on vLLM, the base quantised to NF4 as it loads by vLLM's
    bitsandbytes plugin); INT8 on the transformers backend, which quantises LLM.int8() as it loads: vLLM 0.32.0's
    bitsandbytes plugin reads 8-bit weights only from a checkpoint saved quantised (esrepro.essa.vllm_engine)."""
    return {"backend": "hf"} if setting == "precision" and value == "int8" else {}


class ESSAStudyMixin:
    """:class:`~esrepro.pipeline.Pipeline`'s ESSA study (``self.cfg.studies.essa``)."""

    def essa_study(self) -> ESSAStudy | None:
        """``studies.essa``, if this config has it."""
        return self.cfg.studies.essa

    def essa_tasks(self) -> list[str]:
        """The tasks the ESSA study trains on: its own, then its scaling block's (ESSA Fig. 6)."""
        study = self.essa_study()
        if study is None:
            return []
        return [study.task] + ([study.scaling.task] if study.scaling is not None else [])

    def essa_models(self, task: str | None = None) -> list[str]:
        """The models of the ESSA study's runs on ``task`` (the study's own task when None)."""
        study = self.essa_study()
        if study is None:
            return []
        if task is not None and task != study.task:
            return list(study.scaling.models) if study.scaling is not None and study.scaling.task == task else []
        return list(study.models)

    def essa_methods(self, task: str | None = None, model: str | None = None) -> dict[str, StudyMethod]:
        """The ESSA study's runs on ``task`` (its own task when None) by method name: the reference, one per
        swept value, the GRPO baseline; on the scaling task the reference, one per engine count and the baseline
        (unless its ``grpo`` is null). With ``model``: that model's runs (``sweep_models``), else every model's."""
        study = self.essa_study()
        if study is None or (task is not None and task not in self.essa_tasks()):
            return {}
        scaling = task is not None and task != study.task

        def runs(key: str) -> bool:
            return scaling or model is None or model in study.sweep_models.get(key, [model])

        out = {ESSA_REF: StudyMethod(ESSA_STUDY, "essa", {})}
        for key, setting, prefix in ESSA_SWEEPS:
            if (scaling and key != "engines") or not runs(key):
                continue
            for value in getattr(study.scaling if scaling else study, key):
                extra = dict(study.resample_settings) if key == "resample" and not scaling else {}
                out[f"{prefix}{value}"] = StudyMethod(ESSA_STUDY, "essa", {**extra, setting: value,
                                                                            **_engine_for(setting, value)})
        if study.grpo is not None and not (scaling and study.scaling.grpo is None) and runs("grpo"):
            out[ESSA_GRPO] = StudyMethod(ESSA_STUDY, str(study.grpo.get("algorithm", "grpo")), {})
        return out

    def essa_sweep(self, key: str) -> list[tuple[Any, str]]:
        """(value, method) of one sweep (a key of :data:`ESSA_SWEEPS`: ``populations``, ``ranks``, ``engines``,
        ``precisions``, ``resample``), without the reference run (the figures add it at its own value)."""
        study = self.essa_study()
        prefix = {k: p for k, _, p in ESSA_SWEEPS}[key]
        return [(v, f"{prefix}{v}") for v in getattr(study, key)] if study else []

    def essa_runs(self, task: str | None = None) -> list[tuple[str, str, int]]:
        """(model, method, seed) of every ESSA study run on ``task`` (its own task when None), the GRPO baseline
        included."""
        study = self.essa_study()
        if study is None:
            return []
        return [(m, meth, s) for m in self.essa_models(task) for meth in self.essa_methods(task, m)
                for s in study.seeds]

    def _essa_layers(self, model: str, task: str, method: str, found: StudyMethod) -> list[Layer]:
        study = self.essa_study()
        assert study is not None
        scaling = study.scaling if task != study.task else None
        if found.algorithm == "essa":
            axis = next((k for k, setting, _ in ESSA_SWEEPS if setting in found.swept), None)
            block = "studies.essa.scaling" if scaling is not None else "studies.essa"
            return [
                Layer(self.source, "defaults.essa", dict(self.cfg.defaults.essa)),
                Layer(self.source, "studies.essa.settings", dict(study.settings)),
                *([Layer(self.source, "studies.essa.scaling.settings", dict(scaling.settings))] if scaling else []),
                self._registry_layer(model, "essa"),
                Layer(self.source, f"{block}.{axis}" if axis else block, {**found.swept, "algorithm": "essa"}),
            ]
        ref = self.method_settings(model, task, ESSA_REF)
        return [
            Layer(self.source, "defaults.grpo", dict(self.cfg.defaults.grpo)),
            Layer(self.source, "studies.essa (the reference run's fitness_examples)",
                  {"train_examples": ref.fitness_examples}),
            Layer(self.source, "studies.essa.grpo", dict(study.grpo or {})),
            *([Layer(self.source, "studies.essa.scaling.grpo", dict(scaling.grpo or {}))] if scaling else []),
            self._registry_layer(model, "grpo"),
            Layer(self.source, "studies.essa", {"algorithm": found.algorithm}),
        ]
