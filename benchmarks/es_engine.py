"""ES against pure inference on the same engines: how much of an ES iteration is not generation.

Prints, for one model, device and generation path, and for each backend asked for (``--backend hf,vllm``
runs them one after the other in the same invocation, on the same model and prompts):

[1] seconds per ES iteration; generated tokens per second during ES (tokens actually generated,
    each response up to its end-of-sequence token); the share of an iteration outside
    generation (perturb, restore, update, checksum, and with several engines their waiting on
    each other and Ray's calls); and the same engines' pure batched-inference tokens per second
    on the same prompts (no perturbation; after each ES iteration, untimed by it, as many
    generate calls as the iteration made), with the ratio
    ES / inference. Goals: at a shape where generation dominates, ES reaches at least 90 % of the
    same engine's inference throughput, and perturb + restore + update take under 5 % of an
    iteration (under 3 % at the paper's scale on a GPU). The generation phase of ES includes
    scoring the responses (the worker times them together), so the ratio counts scoring
    against ES. A summary table ends the section, one row per backend.
[2] with --drift-cycles N: parameter drift after N perturb/restore cycles in bfloat16 with the
    paper's ``subtract`` restore against ``exact`` (float32 for reference).

The model is --model-dir, or built here with random weights and no download (--build-shape):
``tiny`` (the registry's tiny architecture, 1.0M parameters), ``medium`` (Qwen2 layout, hidden
512, 8 layers, 8 heads of 64, 2 key-value heads, MLP 1408: 22.8M parameters, the size at which
generation dominates an ES iteration on a CPU) or ``qwen2.5-0.5b`` (Qwen2.5-0.5B's config
values, written below), each with a small local BPE tokenizer (532 tokens). Random weights rarely emit the
end-of-sequence token, so responses run to --new-tokens, which is what a throughput
benchmark wants. With --engines K > 1 the population is spread over K Ray actors (on a GPU
machine they share the GPUs: K engines on one GPU each get 1/K of it).

On CPU the vLLM engine runs in this process (the engine sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
eager (``enforce_eager``), with an explicit KV cache of --vllm-kv-cache-bytes; its attention needs a
head size of 32, 64, 80, 96, 112, 128, ... (every shape here has one). Before every
pure-inference call the vLLM engine's prefix cache is reset, as ES resets it after every weight
change, so both measure full prefills. On CUDA every timed section of this script
synchronises the device before it reads the clock.

    python benchmarks/es_engine.py --build-shape tiny                      # CPU-sized defaults
    python benchmarks/es_engine.py --build-shape medium --backend hf,vllm       # in .venv-vllm
    python benchmarks/es_engine.py --build-shape qwen2.5-0.5b --device cuda --population 30 \\
        --prompts 200 --new-tokens 512 --iterations 3 --engines 2 --generation static
"""

from __future__ import annotations

import argparse
import gc
import math
import tempfile
import time
from pathlib import Path

import torch

from esrepro.backends.spec import EngineSpec

REPO = Path(__file__).resolve().parents[1]

#: A Qwen2 model of tens of millions of parameters (22.8M with the 532-token local tokenizer): large enough
#: that generation dominates an ES iteration on a CPU, small enough to run in minutes on two cores.
MEDIUM = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}

#: Qwen/Qwen2.5-0.5B's config.json (the Instruct model's differs only in eos_token_id).
QWEN25_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
}


def build_model(shape: str, out: Path, seed: int = 0) -> Path:
    """A random-weight model of ``shape`` and a local BPE tokenizer (trained on Countdown prompts) in ``out``."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from esrepro.config import load_registry
    from esrepro.models.tiny import train_tokenizer
    from esrepro.tasks.countdown import CountdownTask, generate_problems

    build = load_registry(REPO / "config" / "models.yaml")["tiny"].build
    task = CountdownTask()
    tok = train_tokenizer([task.prompt(p) for p in generate_problems(500, seed=1)], build.tokenizer.vocab_size)
    ids = {"bos_token_id": tok.eos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.eos_token_id}
    if shape == "tiny":
        config = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, rope_theta=10000.0,
                             **build.architecture.model_dump(), **ids)
    elif shape == "medium":
        config = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, rope_theta=10000.0, **MEDIUM, **ids)
    elif shape == "qwen2.5-0.5b":
        config = Qwen2Config(**QWEN25_05B, **ids)
    else:
        raise ValueError(f"unknown --build-shape {shape!r}; expected tiny, medium or qwen2.5-0.5b")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    if shape == "qwen2.5-0.5b":
        model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(**ids)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: random-weight {shape} ({n / 1e6:.1f}M parameters) in {out}")
    return out


def clock(device: str) -> float:
    """``time.perf_counter()`` once the device's queued work is done (CUDA: ``torch.cuda.synchronize``), so a timed
    section measures the work, not its launch."""
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)
    return time.perf_counter()


def make_evaluator(spec, scoring, engines: int, device: str):
    """One engine in-process, or ``engines`` Ray actors sharing this machine's GPUs (or CPU cores)."""
    from esrepro.population.evaluators import RayEvaluator, SerialEvaluator

    if engines == 1:
        return SerialEvaluator(spec, scoring)
    from esrepro.population.ray_session import ensure_ray

    if device.startswith("cuda"):
        gpus = torch.cuda.device_count()
        ensure_ray(num_gpus=gpus)
        per_engine = {"num_gpus": min(float(spec.tensor_parallel_size), gpus / engines), "num_cpus": 1}
    else:
        ensure_ray(num_cpus=engines * spec.threads)
        per_engine = {"num_cpus": spec.threads}
    return RayEvaluator(spec, scoring, engines, per_engine)


def _token_counts(evaluator) -> int:
    if hasattr(evaluator, "worker"):
        return evaluator.worker.engine.token_count()
    import ray  # several engines only

    return sum(ray.get([a.call.remote("token_count") for a in evaluator.actors]))


def _fresh_generate(engine, prompts: list[str], new_tokens: int) -> list[str]:
    """``engine.generate`` with nothing cached from earlier calls: a vLLM engine's prefix cache is reset first, as
    ES resets it after every weight change (repeated prompts would otherwise skip their prefill)."""
    llm = getattr(engine, "llm", None)
    if llm is not None and not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache")
    return engine.generate(prompts, new_tokens)


def _generate_everywhere(evaluator, prompts: list[str], new_tokens: int, calls: int, device: str) -> float:
    """``calls`` generate calls spread round-robin over the engines, all at once; returns the wall seconds."""
    t0 = clock(device)
    if hasattr(evaluator, "worker"):
        for _ in range(calls):
            _fresh_generate(evaluator.worker.engine, prompts, new_tokens)
    else:
        import ray  # several engines only: one engine runs in this process

        # an actor's call returns once its decoded responses are back, i.e. after its device finished them
        k = len(evaluator.actors)
        ray.get([evaluator.actors[i % k].call.remote("generate", prompts, new_tokens) for i in range(calls)])
    return clock(device) - t0


def es_against_inference(args: argparse.Namespace, model_dir: Path, backend: str) -> dict:
    """Section [1] for one backend: warm up, then ES iterations each followed by a pure-inference block; the figures
    (printed)."""
    from esrepro.es.loop import run_es
    from esrepro.population.spec import Scoring
    from esrepro.settings.methods import ESSettings
    from esrepro.tasks.countdown import CountdownTask, generate_problems

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    on_gpu = args.device.startswith("cuda")
    per_gpu = max(1, math.ceil(args.engines / max(1, torch.cuda.device_count()))) if on_gpu else 1
    cfg = ESSettings(population=args.population, iterations=args.iterations, max_new_tokens=args.new_tokens,
                     train_examples=args.prompts, batch_size=args.batch_size or args.prompts, backend=backend,
                     generation=args.generation if backend == "hf" else "default", noise=args.noise, restore=args.restore, engines=args.engines)
    kv_cache = args.vllm_kv_cache_bytes or (None if on_gpu else 512 * 2**20)  # vLLM's CPU worker cannot size one
    spec = EngineSpec(model_dir=str(model_dir), backend=backend, dtype=dtype, device=args.device,
                      batch_size=cfg.batch_size, noise=cfg.noise, restore=cfg.restore, threads=args.threads,
                      generation=cfg.generation, gpu_memory_utilization=args.gpu_memory_utilization / per_gpu,
                      kv_cache_memory_bytes=kv_cache)
    examples = generate_problems(args.prompts, seed=123)
    scoring = Scoring(task="countdown", examples=examples, max_new_tokens=cfg.max_new_tokens)
    prompts = [CountdownTask().prompt(e) for e in examples]

    t0 = clock(args.device)
    evaluator = make_evaluator(spec, scoring, args.engines, args.device)
    startup = clock(args.device) - t0
    try:
        # compile, graphs, caches
        warm = _generate_everywhere(evaluator, prompts, cfg.max_new_tokens, args.engines, args.device)
        # after each ES iteration (outside its timing) as many generate calls as it made: ES and inference
        # alternate, so a shared machine's changing load hits both alike
        inference = {"s": 0.0, "tokens": 0}

        def inference_block(row: dict) -> None:
            before = _token_counts(evaluator)
            inference["s"] += _generate_everywhere(evaluator, prompts, cfg.max_new_tokens, cfg.population,
                                                   args.device)
            inference["tokens"] += _token_counts(evaluator) - before

        before = _token_counts(evaluator)
        with tempfile.TemporaryDirectory() as state:
            log = run_es(evaluator, cfg, Path(state) / "resume", seed=0, on_iteration=inference_block, progress=False)
        es_tokens = _token_counts(evaluator) - before - inference["tokens"]
        calls, inference_s, inference_tokens = cfg.population * cfg.iterations, inference["s"], inference["tokens"]
        t0 = clock(args.device)
        evaluator.checksums()
        checksum_s = clock(args.device) - t0
    finally:
        evaluator.close()
        # frees the engine (a vLLM engine in this process) before the next backend's; rebound, not del:
        # inference_block closes over evaluator (a del reads as an undefined name to pyflakes)
        evaluator = None
        gc.collect()

    total = sum(r["seconds_total"] for r in log)
    phase = {k: sum(r[f"seconds_{k}"] for r in log) for k in ("generation", "perturb", "restore", "update")}
    other = total - sum(phase.values())
    es_tps, inf_tps = es_tokens / total, inference_tokens / inference_s
    result = {
        "model_dir": str(model_dir), "device": args.device, "dtype": dtype, "backend": backend,
        "generation": cfg.generation, "engines": args.engines, "population": cfg.population,
        "prompts": len(prompts), "new_tokens": cfg.max_new_tokens, "iterations": cfg.iterations,
        "noise": cfg.noise, "restore": cfg.restore, "threads": args.threads, "batch_size": cfg.batch_size,
        "startup_s": startup, "warmup_s": warm,
        "es_seconds_per_iteration": total / len(log),
        "es_seconds": {**{k: v / len(log) for k, v in phase.items()}, "other": other / len(log)},
        "es_share_outside_generation": 1 - phase["generation"] / total,
        "es_overhead_share": (phase["perturb"] + phase["restore"] + phase["update"]) / total,
        "checksum_s": checksum_s,
        "es_tokens": es_tokens, "es_tokens_per_s": es_tps,
        "inference_calls": calls, "inference_tokens": inference_tokens, "inference_s": inference_s,
        "inference_tokens_per_s": inf_tps, "es_over_inference": es_tps / inf_tps,
    }
    _print_result(result)
    return result


def _print_result(r: dict) -> None:
    it = r["es_seconds_per_iteration"]
    print(f"\n[1] ES against inference: {r['backend']}/{r['generation']}, {r['engines']} engine(s) on {r['device']} "
          f"({r['dtype']}, {r['threads']} thread(s) each), N={r['population']}, {r['prompts']} prompts, "
          f"{r['new_tokens']} new tokens, {r['iterations']} iterations, noise {r['noise']}, restore {r['restore']}")
    print(f"    engine start {r['startup_s']:.1f} s, warm-up call {r['warmup_s']:.1f} s (not counted)")
    print(f"    seconds per ES iteration:          {it:10.3f}")
    for key, s in r["es_seconds"].items():
        label = "other (checksum, Ray, waiting)" if key == "other" else key
        print(f"      {label:<31}{s:10.3f} s  ({100 * s / it:5.1f} %)")
    print(f"    share outside generation:          {100 * r['es_share_outside_generation']:9.1f} %")
    print(f"    perturb + restore + update:        {100 * r['es_overhead_share']:9.1f} %   (goal < 5 %)")
    print(f"    one checksum (all engines):        {r['checksum_s']:10.3f} s")
    print(f"    ES generated tokens/s:             {r['es_tokens_per_s']:10.1f}   ({r['es_tokens']} tokens)")
    print(f"    inference tokens/s (same engines): {r['inference_tokens_per_s']:10.1f}   "
          f"({r['inference_tokens']} tokens, {r['inference_calls']} calls)")
    print(f"    ES / inference:                    {100 * r['es_over_inference']:9.1f} %   (goal >= 90 %)")


def print_summary(rows: list[dict]) -> None:
    """One line per backend: the figures the goals are about."""
    print(f"\n    {'backend':<8} {'generation':<11} {'s/iter':>8} {'ES tok/s':>9} {'inf tok/s':>9} "
          f"{'ES/inf':>7} {'p+r+u':>6} {'outside gen':>11}")
    for r in rows:
        print(f"    {r['backend']:<8} {r['generation']:<11} {r['es_seconds_per_iteration']:8.2f} "
              f"{r['es_tokens_per_s']:9.1f} {r['inference_tokens_per_s']:9.1f} {100 * r['es_over_inference']:6.1f}% "
              f"{100 * r['es_overhead_share']:5.1f}% {100 * r['es_share_outside_generation']:10.1f}%")


def _backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in ("hf", "vllm")]
    if not names or bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected hf, vllm or both, comma-separated (e.g. hf,vllm)")
    return names


def drift(model_dir: Path, cycles: int, sigma: float) -> list[dict]:
    """Section [2]: parameter drift after ``cycles`` perturb/restore cycles, per dtype and restore mode."""
    from esrepro.backends.hf import HFBackend
    from esrepro.perturb.noise import member_seed
    from esrepro.perturb.ops import perturb_, restore_exact_, restore_subtract_, snapshot

    print(f"\n[2] parameter drift after {cycles} perturb/restore cycles, sigma={sigma}")
    print(f"    {'dtype':<9} {'restore':<9} {'max |d|':>10} {'mean |d|':>10} {'changed':>9} {'seconds':>8}")
    rows = []
    for dtype in ("bfloat16", "float32"):
        for mode in ("subtract", "exact"):
            params = [p for _, p in HFBackend(model_dir, dtype=dtype).named_parameters()]
            before = [p.float().clone() for p in params]
            saved = snapshot(params)
            t0 = time.perf_counter()
            for c in range(cycles):
                seed = member_seed(0, c, 0)
                perturb_(params, seed, sigma, "iid")
                if mode == "exact":
                    restore_exact_(params, saved)
                else:
                    restore_subtract_(params, seed, sigma, "iid")
            secs = time.perf_counter() - t0
            diffs = [(p.float() - b).abs() for p, b in zip(params, before, strict=True)]
            n = sum(d.numel() for d in diffs)
            row = {"dtype": dtype, "restore": mode, "max": max(float(d.max()) for d in diffs),
                   "mean": sum(float(d.sum()) for d in diffs) / n,
                   "changed": sum(int((d > 0).sum()) for d in diffs) / n, "seconds": secs}
            rows.append(row)
            print(f"    {dtype:<9} {mode:<9} {row['max']:10.3e} {row['mean']:10.3e} {100 * row['changed']:8.2f}% "
                  f"{secs:8.1f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--model-dir", type=Path, help="a checkpoint directory (config.json, weights, tokenizer)")
    where.add_argument("--build-shape", choices=["tiny", "medium", "qwen2.5-0.5b"], default="tiny",
                       help="build a random-weight model of this architecture here (default: tiny)")
    ap.add_argument("--build-dir", type=Path, help="where to keep the built model (default: a temporary folder)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 on CUDA, else float32")
    ap.add_argument("--engines", type=int, default=1, help="engines (more than 1: Ray actors sharing the device)")
    ap.add_argument("--backend", type=_backends, default=["hf"],
                    help="hf, vllm, or several comma-separated (hf,vllm): each runs in turn on the same model")
    ap.add_argument("--generation", choices=["default", "static", "continuous"], default="default",
                    help="the hf backend's generation path")
    ap.add_argument("--population", type=int, default=4, help="ES population N")
    ap.add_argument("--prompts", type=int, default=16, help="training prompts scored per member")
    ap.add_argument("--new-tokens", type=int, default=32, help="max_new_tokens")
    ap.add_argument("--iterations", type=int, default=2, help="ES iterations timed")
    ap.add_argument("--batch-size", type=int, help="prompts per generation batch (default: all prompts)")
    ap.add_argument("--noise", choices=["iid", "correlated"], default="correlated", help="default: the paper's")
    ap.add_argument("--restore", choices=["exact", "subtract"], default="subtract", help="default: the paper's")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per engine")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.8,
                    help="vLLM's share of a GPU, split between the engines on one GPU")
    ap.add_argument("--vllm-kv-cache-bytes", type=int,
                    help="vLLM's KV cache size in bytes (default on CPU: 512 MiB; on GPU: sized by vLLM)")
    ap.add_argument("--drift-cycles", type=int, default=0, help="run section [2] with this many cycles (0: skip)")
    ap.add_argument("--sigma", type=float, default=1e-3, help="drift section's sigma (the paper's)")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="esrepro-bench-") as tmp:
        if args.model_dir:
            model_dir = args.model_dir
            if not (model_dir / "config.json").exists():
                raise SystemExit(f"--model-dir {model_dir}: no config.json")
        else:
            model_dir = build_model(args.build_shape, args.build_dir or Path(tmp) / args.build_shape)
        rows = [es_against_inference(args, model_dir, backend) for backend in args.backend]
        print_summary(rows)
        result = {"es": rows}
        if args.drift_cycles:
            result["drift"] = drift(model_dir, args.drift_cycles, args.sigma)
    if args.json:
        from esrepro.io import write_json

        write_json(args.json, result)


if __name__ == "__main__":
    main()
