"""How long K population engines take to start: one after another against side by side.

An ES or ESSA run on K GPUs starts K vLLM engines as Ray actors (esrepro.population.evaluators.RayEvaluator) before
its first generation. Engines sharing a GPU must start one after another (each sizes its KV cache from the memory
the ones before it left); engines with a GPU each may start side by side, the default there. This script starts K
vLLM engines on this machine's CPUs both ways (vLLM's CPU build, ``.venv-vllm``), each with its own compile cache
folder as on a cluster, and prints:

[1] seconds until every engine answers, one after another and side by side, and the ratio;
[2] the estimate for ``--estimate-engines`` (128: ESSA's largest GPU sweep, Fig. 2) engines with a GPU each:
    one after another, K times one engine's start; side by side, about one engine's start (each loads, compiles and
    captures on its own GPU; what they still share is the file system the weights are read from and Ray's actor
    scheduling). On a CPU the side-by-side engines share the cores, so the CPU figure for K engines at once is an
    upper bound of the GPU case's.

    PYTHONPATH=src .venv-vllm/bin/python benchmarks/engine_start.py                    # 4 tiny engines
    PYTHONPATH=src .venv-vllm/bin/python benchmarks/engine_start.py --engines 4 --build-shape medium
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

#: KV cache of each CPU engine (bytes): enough for the few short prompts a start needs.
KV_BYTES = 32 * 2**20


def start_seconds(spec, scoring, engines: int, side_by_side: bool) -> float:
    """Seconds from asking for ``engines`` Ray actors to every one answering; the engines are then closed."""
    from esrepro.population.evaluators import RayEvaluator

    t0 = time.perf_counter()
    evaluator = RayEvaluator(spec, scoring, engines, {"num_cpus": 1}, start_timeout=1800, side_by_side=side_by_side)
    seconds = time.perf_counter() - t0
    assert evaluator.side_by_side is side_by_side
    evaluator.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--build-shape", default="tiny", choices=("tiny", "medium"))
    parser.add_argument("--estimate-engines", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="starts of each kind (the fastest is reported)")
    args = parser.parse_args()

    import ray
    from es_engine import build_model

    from esrepro.backends.spec import EngineSpec
    from esrepro.population.ray_session import ensure_ray
    from esrepro.population.spec import Scoring
    from esrepro.tasks.countdown import generate_problems

    with tempfile.TemporaryDirectory(prefix="engine-start-") as tmp:
        model_dir = build_model(args.build_shape, Path(tmp) / "model")
        spec = EngineSpec(str(model_dir), backend="vllm", device="cpu", restore="subtract", batch_size=2, threads=1,
                          kv_cache_memory_bytes=KV_BYTES)
        scoring = Scoring(task="countdown", examples=generate_problems(2, seed=0), max_new_tokens=8)
        ensure_ray(num_cpus=args.engines)
        try:
            one = min(start_seconds(spec, scoring, 1, False) for _ in range(args.repeats))
            serial = min(start_seconds(spec, scoring, args.engines, False) for _ in range(args.repeats))
            side = min(start_seconds(spec, scoring, args.engines, True) for _ in range(args.repeats))
        finally:
            ray.shutdown()
    k, n = args.engines, args.estimate_engines
    print(f"[1] {k} vLLM CPU engines ({args.build_shape} model, {k} Ray actors of 1 CPU each on this machine):")
    print(f"    one engine alone:        {one:7.1f} s")
    print(f"    one after another:       {serial:7.1f} s  ({serial / k:.1f} s an engine)")
    print(f"    side by side:            {side:7.1f} s  (one after another / side by side: {serial / side:.2f})")
    print(f"[2] {n} engines with a GPU each, an engine's start t (load, compile, CUDA-graph capture):")
    print(f"    one after another:       {n} x t (here: {n * serial / k / 60:.1f} min at t = {serial / k:.1f} s; "
          f"at t = 60 s: {n:d} min)")
    print(f"    side by side:            about t (here at most {side:.1f} s, the {k} engines sharing the CPUs)")


if __name__ == "__main__":
    main()
