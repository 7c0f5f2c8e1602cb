"""The phases a real RL run enters, in order, observed by wrapping the functions that begin them (and the code's own
:func:`esrepro.rl.phases.enter` marks): what tests compare with :func:`esrepro.rl.phases.grpo_order` /
:func:`~esrepro.rl.phases.ppo_order`, and what benchmarks/gpu_check.py measures phase by phase on a GPU.

The wrapped functions (each calls through to the original):

- esrepro.rl.meta_load.shard_reference and TRL's ``prepare_fsdp`` (as grpo_trainer imports it): ``shard reference``
  (``prepare_fsdp`` only when it is given a model not yet sharded: it leaves the reference that
  :func:`esrepro.rl.meta_load.sharded_reference_trainer` sharded before vLLM started as it is, a phase of nothing);
- TRL's ``VLLMGeneration.__init__`` (as grpo_trainer imports it): ``start vLLM``;
- accelerate's ``fsdp2_prepare_model`` (as accelerate.accelerator imports it): ``shard policy``;
- ``GRPOTrainer._generate`` and esrepro.rl.ppo._generate_padded: ``rollout``;
- ``GRPOTrainer._get_per_token_logps_and_entropies`` and esrepro.rl.ppo._response_logp: ``reference forward`` for
  the frozen reference, ``policy forward and backward`` with gradients, ``old log-probabilities`` without;
- ``GRPOTrainer._save_checkpoint`` (and transformers' own) and esrepro.rl.ppo_state.save: ``resume-state save``.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from esrepro.rl import phases as PH


@dataclass
class PhaseTrace:
    """The phases entered (consecutive repeats collapsed) and, with ``memory`` (a peak reading, e.g.
    ``torch.cuda.max_memory_allocated``) and ``reset`` (its reset), each phase's largest peak in bytes."""

    memory: Callable[[], int] | None = None
    reset: Callable[[], None] | None = None
    order: list[str] = field(default_factory=list)
    peaks: dict[str, int] = field(default_factory=dict)

    def enter(self, name: str) -> None:
        if self.order and self.order[-1] == name:
            return
        self._close()
        self.order.append(name)

    def _close(self) -> None:
        if self.order and self.memory is not None:
            name = self.order[-1]
            self.peaks[name] = max(self.peaks.get(name, 0), int(self.memory()))
            if self.reset is not None:
                self.reset()

    @contextlib.contextmanager
    def installed(self) -> Iterator["PhaseTrace"]:
        """Wrap the phase-beginning functions for the duration; the run starts in ``load``."""
        import accelerate.accelerator as acc
        import torch
        import transformers
        import trl.trainer.grpo_trainer as grpo_trainer
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from esrepro.rl import meta_load, ppo, ppo_state

        def sharded(args: tuple) -> bool:  # TRL 1.16's own test in prepare_fsdp, which then returns the model
            return bool(args) and isinstance(args[0], (FSDP, FSDPModule))

        def frozen(model: Any) -> bool:
            return not any(p.requires_grad for p in model.parameters())

        def scoring(trainer_or_none: Any, model: Any) -> str:
            ref = getattr(trainer_or_none, "ref_model", None) if trainer_or_none is not None else None
            if (ref is not None and model is ref) or (trainer_or_none is None and frozen(model)):
                return PH.REFERENCE_FORWARD
            return PH.POLICY_PASS if torch.is_grad_enabled() else PH.OLD_LOGPS

        patches: list[tuple[Any, str, Callable[[Callable], Callable]]] = [
            (meta_load, "shard_reference", lambda f: self._marked(f, PH.SHARD_REFERENCE)),
            (grpo_trainer, "prepare_fsdp", lambda f: self._marked(f, PH.SHARD_REFERENCE, unless=sharded)),
            (grpo_trainer.VLLMGeneration, "__init__", lambda f: self._marked(f, PH.START_VLLM)),
            (acc, "fsdp2_prepare_model", lambda f: self._marked(f, PH.SHARD_POLICY)),
            (grpo_trainer.GRPOTrainer, "_generate", lambda f: self._marked(f, PH.ROLLOUT)),
            (grpo_trainer.GRPOTrainer, "_get_per_token_logps_and_entropies",
             lambda f: self._classified(f, lambda args: scoring(args[0], args[1]))),
            (transformers.Trainer, "_save_checkpoint", lambda f: self._marked(f, PH.SAVE)),
            (grpo_trainer.GRPOTrainer, "_save_checkpoint", lambda f: self._marked(f, PH.SAVE)),
            (ppo, "_generate_padded", lambda f: self._marked(f, PH.ROLLOUT)),
            (ppo, "_response_logp", lambda f: self._classified(f, lambda args: scoring(None, args[0]))),
            (ppo_state, "save", lambda f: self._marked(f, PH.SAVE)),
        ]
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
        self.order, self.peaks = [PH.LOAD], {}
        if self.reset is not None:
            self.reset()
        PH.listen(self.enter)
        try:
            for owner, name, wrap in patches:
                setattr(owner, name, wrap(owner.__dict__[name]))
            yield self
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)
            PH.listen(None)
            self._close()

    def _marked(self, fn: Callable, name: str, unless: Callable[[tuple], bool] | None = None) -> Callable:
        """``fn`` entering phase ``name`` first, unless ``unless(args)`` says the call does nothing."""
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if unless is None or not unless(args):
                self.enter(name)
            return fn(*args, **kwargs)

        return run

    def _classified(self, fn: Callable, classify: Callable[[tuple], str]) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            self.enter(classify(args))
            return fn(*args, **kwargs)

        return run
