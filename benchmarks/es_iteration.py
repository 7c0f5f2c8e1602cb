"""Benchmark the ES engine on the tiny model.

Prints (1) seconds per ES iteration and the share of it spent outside generation
(perturb, restore, update), with the embedded default's ES settings; (2) the parameter
drift after 1,000 perturb/restore cycles in bfloat16 with the paper's "subtract"
restore against "exact" (float32 shown for reference).

    python benchmarks/es_iteration.py [--model-dir results/models/tiny/base] [--iterations 3]

Uses the built tiny model when it exists (run the pipeline first), otherwise a
randomly initialised model of the registry's tiny architecture (generation then
always runs to max_new_tokens, so iterations are slower than with the built model).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from esrepro.backends.hf import HFBackend
from esrepro.config import load_pipeline, load_yaml
from esrepro.es.loop import run_es
from esrepro.settings.methods import ESSettings
from esrepro.es.noise import member_seed
from esrepro.es.ops import perturb_, restore_exact_, restore_subtract_, snapshot
from esrepro.tasks.countdown import CountdownTask, generate_problems

REPO = Path(__file__).resolve().parents[1]


def _model_dir(path: Path, registry: dict) -> Path:
    if (path / "config.json").exists():
        print(f"model: {path} (built tiny model)")
        return path
    from esrepro.models.tiny import build_model, train_tokenizer

    build = registry["tiny"].build
    task = CountdownTask()
    tok = train_tokenizer([task.prompt(p) for p in generate_problems(500, seed=1)], build.tokenizer.vocab_size)
    out = Path(tempfile.mkdtemp(prefix="esrepro-bench-"))
    build_model(build.architecture.model_dump(), len(tok), tok.eos_token_id, build.seed).save_pretrained(out)
    tok.save_pretrained(out)
    print(f"model: random-init tiny architecture in {out} ({path} not built yet)")
    return out


def iteration_timing(model_dir: Path, settings: dict, iterations: int, threads: int) -> None:
    torch.set_num_threads(threads)
    task = CountdownTask()
    examples = generate_problems(settings["train_examples"], seed=123)
    backend = HFBackend(model_dir, batch_size=settings["batch_size"])
    cfg = ESSettings.model_validate({**settings, "iterations": iterations, "resume_every": 10**9})
    prompts = [task.prompt(e) for e in examples]

    def score(rs: list[str]) -> list[float]:
        return [task.score(r, e).reward for r, e in zip(rs, examples)]

    with tempfile.TemporaryDirectory() as state:
        log = run_es(backend, prompts, score, cfg, Path(state) / "resume", progress=False)
    total = sum(r["seconds_total"] for r in log)
    gen = sum(r["seconds_generation"] for r in log)
    n_params = sum(p.numel() for _, p in backend.named_parameters())
    print(f"\n[1] ES iteration, {n_params:,} parameters, N={cfg.population}, {len(prompts)} prompts, "
          f"max_new_tokens={cfg.max_new_tokens}, {threads} threads, {iterations} iterations")
    print(f"    seconds per iteration:           {total / len(log):.2f}")
    for key in ("generation", "perturb", "restore", "update"):
        s = sum(r[f"seconds_{key}"] for r in log) / len(log)
        print(f"      {key:<12} {s:8.3f} s  ({100 * s / (total / len(log)):5.1f} %)")
    print(f"    share outside generation:        {100 * (total - gen) / total:.1f} %")


def drift(model_dir: Path, cycles: int, sigma: float) -> None:
    print(f"\n[2] parameter drift after {cycles} perturb/restore cycles, sigma={sigma}")
    print(f"    {'dtype':<9} {'restore':<9} {'max |d|':>10} {'mean |d|':>10} {'changed':>9} {'seconds':>8}")
    for dtype in ("bfloat16", "float32"):
        for mode in ("subtract", "exact"):
            backend = HFBackend(model_dir, dtype=dtype)
            params = [p for _, p in backend.named_parameters()]
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
            diffs = [(p.float() - b).abs() for p, b in zip(params, before)]
            n = sum(d.numel() for d in diffs)
            print(f"    {dtype:<9} {mode:<9} {max(float(d.max()) for d in diffs):10.3e} "
                  f"{sum(float(d.sum()) for d in diffs) / n:10.3e} "
                  f"{100 * sum(int((d > 0).sum()) for d in diffs) / n:8.2f}% {secs:8.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO / "results" / "models" / "tiny" / "base")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--sigma", type=float, default=1e-3, help="the paper's sigma")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    pipeline = load_pipeline(load_yaml(REPO / "config" / "config.yaml"), "config/config.yaml", root=REPO)
    registry = pipeline.registry
    settings = pipeline.method_settings("tiny", "countdown", "es").as_dict()
    print("settings:", json.dumps(settings))
    model_dir = _model_dir(args.model_dir, registry)
    iteration_timing(model_dir, settings, args.iterations, args.threads)
    drift(model_dir, args.cycles, args.sigma)


if __name__ == "__main__":
    main()
