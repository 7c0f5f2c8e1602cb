"""One engine evaluating population members: in-process (serial) or as a Ray actor (one per GPU or CPU process)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from esrepro.population.spec import EngineRecipe, IndexedScoring, Scoring

#: Phases only the batched path reports (members as adapters): loading the adapters, and grading apart from generation.
BATCHED_PHASES = ("load", "grading")

#: A step every engine applies in the same order: ("members", seeds, sigma) or ("update", seeds, weights, alpha).
Op = tuple


class PopulationWorker:
    """An engine, the training prompts and the grader; evaluates the members it is given.

    With ``restore: subtract`` every engine perturbs and restores *every* member of an
    iteration, in order (generating only for its own), so its weights follow exactly the
    float sequence of a single engine running the whole population: subtract-restore is not
    exact, and engines that skipped members would drift apart. With exact restore only a
    worker's own members are applied.
    """

    def __init__(self, engine: EngineRecipe, scoring: Scoring) -> None:
        self.spec = engine
        self.engine = engine.build()
        self.prompts, self.mean_reward = scoring.build()
        self.max_new_tokens = scoring.max_new_tokens
        # ESSA scores chosen examples: IndexedScoring builds a per-example scorer instead of a mean
        self.example_scores = self.mean_reward if isinstance(scoring, IndexedScoring) else None

    def _clock(self) -> float:
        """``time.perf_counter()`` once the engine's queued device work is done (GPU kernels run asynchronously)."""
        self.engine.synchronize()
        return time.perf_counter()

    def noise_device(self) -> str:
        """The device the engine's noise is generated on (engines and resumes of one run must share it)."""
        return self.engine.noise_device()

    def decoding(self) -> dict:
        """The engine's greedy decoding rule, as manifests record it (esrepro.models.decoding)."""
        return self.engine.decoding.as_dict()

    def pid(self) -> int:
        """The worker's process id (tests kill it to check recovery)."""
        return os.getpid()

    def members(self, seeds: Sequence[int], sigma: float, mine: Sequence[int],
                batch: Sequence[int] | None = None) -> tuple[list[float], dict]:
        """Mean rewards of members ``mine`` (indices into ``seeds``) and seconds per phase; each member is scored
        on the training prompts ``batch`` (indices; None: all of them). An engine with ``generate_members``
        (members as adapters) scores them all in one generation; any other perturbs, generates and restores each."""
        own = set(mine)
        prompts = self.prompts if batch is None else [self.prompts[i] for i in batch]
        if hasattr(self.engine, "generate_members"):
            return self._members_batched([seeds[i] for i in mine], sigma, prompts, batch)
        every = self.spec.restore == "subtract"
        rewards: dict[int, float] = {}
        t = {"perturb": 0.0, "generation": 0.0, "restore": 0.0, "tokens": 0}
        for i, seed in enumerate(seeds):
            if i not in own and not every:
                continue
            t0 = self._clock()
            self.engine.perturb(seed, sigma)
            t1 = self._clock()
            if i in own:
                responses = self.engine.generate(prompts, self.max_new_tokens)
                rewards[i] = self.mean_reward(responses, batch)
            t2 = self._clock()
            self.engine.restore(seed, sigma)
            t3 = self._clock()
            t["perturb"] += t1 - t0
            t["generation"] += t2 - t1
            t["restore"] += t3 - t2
        return [rewards[i] for i in mine], t

    def _members_batched(self, seeds: list[int], sigma: float, prompts: list[str],
                         batch: Sequence[int] | None) -> tuple[list[float], dict]:
        """An engine whose members are adapters of its unchanged weights (low-rank ES on vLLM) scores them all in one
        generation. Its phases: ``perturb`` (writing the members' adapters), ``load`` (the engine loading them, where
        it has ``load_members``), ``generation`` (the one generate call), ``grading`` (the rewards of the responses)
        and ``restore`` (dropping the adapters)."""
        t = {"perturb": 0.0, "load": 0.0, "generation": 0.0, "grading": 0.0, "restore": 0.0, "tokens": 0}
        if not seeds:
            return [], t
        t0 = self._clock()
        handles = self.engine.prepare_members(seeds, sigma)
        t1 = t2 = t3 = self._clock()
        try:
            if hasattr(self.engine, "load_members"):
                self.engine.load_members(handles)
            t2 = t3 = self._clock()
            per_member = self.engine.generate_members(handles, prompts, self.max_new_tokens)
            t3 = self._clock()
            rewards = [self.mean_reward(r, batch) for r in per_member]
        finally:
            t4 = self._clock()
            self.engine.release_members(handles)
        t["perturb"], t["load"], t["generation"], t["grading"] = t1 - t0, t2 - t1, t3 - t2, t4 - t3
        t["restore"] = self._clock() - t4
        return rewards, t

    def update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> float:
        """Apply the ES update; returns its seconds."""
        t0 = self._clock()
        self.engine.apply_update(seeds, weights, alpha)
        return self._clock() - t0

    def replay(self, ops: Sequence[Op]) -> None:
        """Bring a fresh engine to the others' state: repeat every weight change since the loaded state."""
        for op in ops:
            if op[0] == "members":
                _, seeds, sigma = op
                if self.spec.restore == "subtract":
                    for seed in seeds:
                        self.engine.perturb(seed, sigma)
                        self.engine.restore(seed, sigma)
            elif op[0] == "update":
                self.engine.apply_update(*op[1:])
            else:
                raise ValueError(f"unknown op {op[0]!r}")

    def checksum(self) -> str:
        return self.engine.checksum()

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy responses of the current (unperturbed) weights, e.g. for periodic evaluation."""
        return self.engine.generate(prompts, max_new_tokens)

    def save(self, path: str) -> None:
        """Write the current weights as an HF checkpoint into ``path``."""
        self.engine.save(Path(path))

    def save_state(self, path: str) -> None:
        """Write the resume tensors (weights and fp32 masters) to ``path``."""
        self.engine.save_state(path)

    def load_state(self, path: str) -> None:
        """Set the weights (and masters) from a resume file written by :meth:`save_state`."""
        self.engine.load_state(path)

    def call(self, method: str, *args: Any) -> Any:
        """Call an engine method by name (for programs beyond ES, e.g. ESSA candidates)."""
        return getattr(self.engine, method)(*args)

    # --- ESSA: candidates are applied, scored and restored; the engine's state never changes ---

    def candidates(self, xs: Sequence[Any], examples: Sequence[int]) -> tuple[list[float], dict]:
        """Mean score of each candidate ``xs[i]`` on the examples at ``examples`` and seconds per phase.

        Each candidate is applied in place (``engine.apply``), the prompts generated greedily
        and scored, and the SFT weights restored bit-exactly (``engine.restore``). An engine
        that batches candidates (``prepare_candidates`` / ``generate_candidates`` /
        ``release_candidates``, the vLLM ESSA engine) generates all of them in one call: the
        phases are then preparing every candidate, the one generation, and releasing them.
        """
        import numpy as np

        if self.example_scores is None:
            raise TypeError("candidates() needs an IndexedScoring (per-example scores), not a Scoring")
        indices = list(examples)
        prompts = [self.prompts[i] for i in indices]
        rewards: list[float] = []
        t = {"apply": 0.0, "generation": 0.0, "restore": 0.0}
        if hasattr(self.engine, "generate_candidates"):
            if not xs:
                return rewards, t
            t0 = self._clock()
            handles = self.engine.prepare_candidates([np.asarray(x, dtype=np.float64) for x in xs])
            t1 = self._clock()
            try:
                per_candidate = self.engine.generate_candidates(handles, prompts, self.max_new_tokens)
                rewards = [float(np.mean(self.example_scores(r, indices))) for r in per_candidate]
            finally:
                t2 = self._clock()
                self.engine.release_candidates(handles)
            t["apply"], t["generation"], t["restore"] = t1 - t0, t2 - t1, self._clock() - t2
            return rewards, t
        for x in xs:
            t0 = self._clock()
            self.engine.apply(np.asarray(x, dtype=np.float64))
            t1 = self._clock()
            try:
                responses = self.engine.generate(prompts, self.max_new_tokens)
                values = self.example_scores(responses, indices)
            finally:
                t2 = self._clock()
                self.engine.restore()
            rewards.append(float(np.mean(values)))
            t["apply"] += t1 - t0
            t["generation"] += t2 - t1
            t["restore"] += self._clock() - t2
        return rewards, t
