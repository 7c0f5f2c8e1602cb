"""Evaluators: map member seeds to mean rewards and keep every engine's weights in step.

:class:`SerialEvaluator` runs one engine in this process (the default on CPU).
:class:`RayEvaluator` runs K engines as Ray actors (one per GPU, or K CPU processes),
splitting each population between them; an actor that dies is replaced by a fresh one that
loads the last resume state and replays the weight changes since, so the run goes on
bit-identically. After every update the engines' checksums must agree.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from esrepro.perturb.ops import Update
from esrepro.population.ray_session import job_env
from esrepro.population.spec import EngineRecipe, Scoring
from esrepro.population.worker import BATCHED_PHASES, PopulationWorker

STATE_FILE = "state.safetensors"


class EngineMismatch(RuntimeError):
    """Engines that applied the same updates hold different weights, or would draw different noise."""


def engine_env(spec: Any, k: int, cache_root: str | Path | None = None) -> dict:
    """Ray runtime environment of engine ``k``: a vLLM engine gets compile caches (under ``cache_root``, default a
    folder of this process in the temp dir) and a port range of its own, so engines built on one node never share a
    cache folder or race for a port (each starts after the previous one answers, too); other engines need nothing
    (the job's environment, :func:`job_env`)."""
    if getattr(spec, "backend", None) != "vllm":
        return {}  # the job's runtime environment applies
    import os
    import tempfile

    root = Path(cache_root or Path(tempfile.gettempdir()) / f"esrepro-vllm-{os.getpid()}") / f"engine{k}"
    env = {
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "CUDA_CACHE_PATH": str(root / "cuda"),
        "VLLM_PORT": str(int(os.environ.get("VLLM_PORT", "29600")) + 50 * k),
    }
    return {"env_vars": {**job_env(), **env}}


def own_gpu(per_engine: dict[str, float]) -> bool:
    """Whether engines with these Ray resources each hold a GPU of their own (``num_gpus`` of 1 or more)."""
    return float(per_engine.get("num_gpus", 0) or 0) >= 1


class SerialEvaluator:
    """One engine, in this process: every member in turn."""

    def __init__(self, engine: EngineRecipe, scoring: Scoring) -> None:
        self.worker = PopulationWorker(engine, scoring)
        self.engines = 1

    def rewards(self, seeds: Sequence[int], sigma: float, batch: Sequence[int] | None = None
                ) -> tuple[list[float], dict]:
        rewards, seconds = self.worker.members(seeds, sigma, list(range(len(seeds))), batch)
        return rewards, seconds

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy responses of the current weights (periodic evaluation)."""
        return self.worker.generate(prompts, max_new_tokens)

    def apply_update(self, update: Update) -> float:
        return self.worker.update(update.seeds, update.weights, update.alpha)

    def checksums(self) -> list[str]:
        return [self.worker.checksum()]

    def noise_device(self) -> str:
        """The device the engine draws its noise on (recorded in, and checked against, the resume state)."""
        return self.worker.noise_device()

    def decoding(self) -> dict:
        """The engine's greedy decoding rule (for the run's manifest)."""
        return self.worker.decoding()

    def save(self, path: str | Path) -> None:
        self.worker.save(str(path))

    def save_state(self, directory: str | Path) -> None:
        self.worker.save_state(str(Path(directory) / STATE_FILE))

    def load_state(self, directory: str | Path) -> None:
        self.worker.load_state(str(Path(directory) / STATE_FILE))

    def mark_state(self, directory: str | Path) -> None:
        pass

    def close(self) -> None:
        pass

    # ESSA
    def candidate_rewards(self, xs: Sequence[Any], examples: Sequence[int]) -> tuple[list[float], dict]:
        """Mean score of every candidate on the examples at ``examples`` (ESSA), and seconds per phase."""
        t0 = time.perf_counter()
        rewards, seconds = self.worker.candidates(list(xs), list(examples))
        return rewards, {**seconds, "wall": time.perf_counter() - t0}

    def save_candidate(self, x: Any, path: str | Path) -> None:
        """Write the weights carrying candidate x as an HF checkpoint (ESSA)."""
        self.worker.call("save_candidate", x, str(path))


class RayEvaluator:
    """K engines as Ray actors; members are split round-robin, rewards come back in seed order.

    ``per_engine`` holds the Ray resources of one actor (``num_gpus``, ``num_cpus``).
    ``retries`` bounds how often one call is retried after its actor died or timed out.
    ``side_by_side``: start the engines at once rather than one after another; by default where each has a GPU of
    its own (``num_gpus`` of 1 or more), so K engines take about one engine's start (load, compile, CUDA-graph
    capture) instead of K; engines sharing a GPU start one after another, each sizing its memory after the one
    before has taken its share.
    """

    def __init__(self, engine: EngineRecipe, scoring: Scoring, engines: int, per_engine: dict[str, float] | None = None,
                 retries: int = 3, start_timeout: float = 1800.0, call_timeout: float = 3600.0,
                 side_by_side: bool | None = None) -> None:
        import ray

        if engines < 1:
            raise ValueError(f"engines must be at least 1, got {engines}")
        self.engines = engines
        self._resources = per_engine or {"num_cpus": engine.threads}
        self._actor_class = ray.remote(PopulationWorker)
        self._spec, self._scoring, self.retries = engine, scoring, retries
        self.start_timeout, self.call_timeout = start_timeout, call_timeout
        self._state: str | None = None  # the resume file the replay starts from (None: the base model)
        self._ops: list[tuple] = []  # weight changes since that state, in order
        self.actors: list[Any] = []
        self.respawned = 0
        # the vLLM engines' compile caches: one folder for this evaluator, removed by close()
        self.cache_root = Path(tempfile.mkdtemp(prefix="esrepro-vllm-")) if getattr(engine, "backend", None) == "vllm" else None
        if side_by_side is None:
            side_by_side = own_gpu(self._resources)
        self.side_by_side = side_by_side
        try:
            if side_by_side:
                self.actors = self._start_all(range(engines))
            else:
                for k in range(engines):  # one after another: engines sharing a GPU must not start side by side
                    self.actors.append(self._start(k))
        except BaseException:
            self.close()
            raise
        devices = self._all("noise_device", [()] * self.engines)
        if len(set(devices)) != 1:
            self.close()
            raise EngineMismatch(f"the engines run on different devices {devices}: the same seed would give "
                                 "them other noise; give the run one GPU model")
        self._noise_device = devices[0]

    def _launch(self, k: int) -> Any:
        """Actor ``k``, asked for (not yet answering)."""
        options = dict(self._resources)
        env = engine_env(self._spec, k, self.cache_root)
        if env:
            options["runtime_env"] = env
        return self._actor_class.options(**options).remote(self._spec, self._scoring)

    def _start_failed(self, ks: Sequence[int]) -> TimeoutError:
        import ray

        return TimeoutError(
            f"engine{'s' if len(ks) > 1 else ''} {', '.join(map(str, ks))} did not start within "
            f"{self.start_timeout:g} s: Ray may have no room for an actor with {self._resources} (cluster: "
            f"{ray.cluster_resources()}), or the model is still loading; lower the method's engines setting or give "
            "the job more")

    def _start(self, k: int) -> Any:
        """Actor ``k``, built and answering (within ``start_timeout`` seconds)."""
        import ray
        from ray.exceptions import GetTimeoutError

        actor = self._launch(k)
        try:
            ray.get(actor.pid.remote(), timeout=self.start_timeout)
        except GetTimeoutError:
            ray.kill(actor)
            raise self._start_failed([k]) from None
        return actor

    def _start_all(self, ks: Sequence[int]) -> list[Any]:
        """Actors ``ks``, started side by side and all answering within ``start_timeout`` seconds of the first
        request; on a timeout every one is killed and the error names those that had not answered."""
        import ray

        actors = [self._launch(k) for k in ks]
        pending = {a.pid.remote(): k for k, a in zip(ks, actors, strict=True)}
        deadline = time.monotonic() + self.start_timeout
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise self._start_failed(sorted(pending.values()))
                ray.get(ready[0])  # an engine that failed to build raises here
                del pending[ready[0]]
        except BaseException:
            for a in actors:
                ray.kill(a)
            raise
        return actors

    def _respawn(self, k: int) -> None:
        import ray

        try:
            ray.kill(self.actors[k])
        except Exception:  # already gone
            pass
        actor = self._start(k)
        if self._state is not None:
            self._get(actor.load_state.remote(self._state), k, "load_state")
        self._get(actor.replay.remote(self._ops), k, "replay")
        self.actors[k] = actor
        self.respawned += 1

    def _get(self, future: Any, k: int, method: str) -> Any:
        """``ray.get`` of engine ``k``'s call, failing after ``call_timeout`` seconds (a hung engine)."""
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            return ray.get(future, timeout=self.call_timeout)
        except GetTimeoutError:
            raise TimeoutError(f"engine {k} did not answer {method} within {self.call_timeout:g} s") from None

    def _all(self, method: str, args: Sequence[tuple]) -> list[Any]:
        """Call ``method`` on every actor (``args[k]`` for actor k); an actor that died, or did not answer within
        ``call_timeout`` (a hung engine: its process may be alive with a wedged GPU or a stuck collective), is
        killed, replaced and its call retried, at most ``retries`` times."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        futures = [getattr(a, method).remote(*args[k]) for k, a in enumerate(self.actors)]
        out: list[Any] = [None] * len(self.actors)
        for k, fut in enumerate(futures):
            for attempt in range(self.retries + 1):
                try:
                    out[k] = self._get(fut, k, method)
                    break
                except (ActorDiedError, ActorUnavailableError, RayActorError, TimeoutError) as err:
                    if attempt == self.retries:
                        if isinstance(err, TimeoutError):
                            raise TimeoutError(f"{err} ({self.retries + 1} tries, the engine replaced after each; "
                                               "if one call's work takes longer, raise the method's call_timeout)"
                                               ) from None
                        raise
                    self._respawn(k)
                    fut = getattr(self.actors[k], method).remote(*args[k])
        return out

    def _spread(self, method: str, n: int, args_for, phases: tuple[str, ...], optional: tuple[str, ...] = ()
                ) -> tuple[list[float], dict]:
        """Split n members round-robin over the engines (``args_for(indices)`` builds one engine's call);
        the rewards in member order and the slowest engine's seconds per phase (``optional`` phases where every
        engine reports them)."""
        mine = [list(range(k, n, self.engines)) for k in range(self.engines)]
        t0 = time.perf_counter()
        results = self._all(method, [args_for(m) for m in mine])
        rewards: list[float] = [0.0] * n
        seconds = dict.fromkeys((*phases, *(k for k in optional if all(k in t for _, t in results))), 0.0)
        for m, (r, t) in zip(mine, results, strict=True):
            for i, value in zip(m, r, strict=True):
                rewards[i] = value
            for key in seconds:
                seconds[key] = max(seconds[key], t[key])  # the slowest engine sets the pace
        seconds["wall"] = time.perf_counter() - t0
        return rewards, seconds

    def rewards(self, seeds: Sequence[int], sigma: float, batch: Sequence[int] | None = None
                ) -> tuple[list[float], dict]:
        seeds = list(seeds)
        batch = None if batch is None else list(batch)
        out = self._spread("members", len(seeds), lambda m: (seeds, sigma, m, batch),
                           ("perturb", "generation", "restore"), BATCHED_PHASES)
        self._ops.append(("members", seeds, sigma))
        return out

    def apply_update(self, update: Update) -> float:
        t0 = time.perf_counter()
        self._all("update", [(update.seeds, update.weights, update.alpha)] * self.engines)
        self._ops.append(("update", update.seeds, update.weights, update.alpha))
        return time.perf_counter() - t0

    def checksums(self) -> list[str]:
        return self._all("checksum", [()] * self.engines)

    def noise_device(self) -> str:
        """The device every engine draws its noise on (checked equal when they started)."""
        return self._noise_device

    def decoding(self) -> dict:
        """The engines' greedy decoding rule (one model, so one rule; for the run's manifest)."""
        return self._all("decoding", [()] * self.engines)[0]

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy responses of the current weights, from the first engine (periodic evaluation)."""
        return self._get(self.actors[0].generate.remote(prompts, max_new_tokens), 0, "generate")

    def save(self, path: str | Path) -> None:
        self._get(self.actors[0].save.remote(str(path)), 0, "save")

    def save_state(self, directory: str | Path) -> None:
        path = str(Path(directory).resolve() / STATE_FILE)
        self._get(self.actors[0].save_state.remote(path), 0, "save_state")

    def mark_state(self, directory: str | Path) -> None:
        """The resume state in ``directory`` is now where a replacement starts from (after it is in place)."""
        self._state, self._ops = str(Path(directory).resolve() / STATE_FILE), []

    def load_state(self, directory: str | Path) -> None:
        path = str(Path(directory).resolve() / STATE_FILE)
        self._all("load_state", [(path,)] * self.engines)
        self._state, self._ops = path, []

    def pids(self) -> list[int]:
        return self._all("pid", [()] * self.engines)

    # ESSA: candidates leave no state behind, so a replaced actor needs no replay
    def candidate_rewards(self, xs: Sequence[Any], examples: Sequence[int]) -> tuple[list[float], dict]:
        """Mean score of every candidate on the examples at ``examples``: whole candidates round-robin over
        the engines (a candidate's prompts are never split, so each is generated in the same batches as on
        one engine), rewards in candidate order; seconds per phase of the slowest engine."""
        xs = list(xs)
        return self._spread("candidates", len(xs), lambda m: ([xs[i] for i in m], list(examples)),
                            ("apply", "generation", "restore"))

    def save_candidate(self, x: Any, path: str | Path) -> None:
        """Write the weights carrying candidate x as an HF checkpoint, from the first engine (ESSA)."""
        self._get(self.actors[0].call.remote("save_candidate", x, str(Path(path).resolve())), 0, "save_candidate")

    def close(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:
                pass
        if self.cache_root is not None:
            shutil.rmtree(self.cache_root, ignore_errors=True)
