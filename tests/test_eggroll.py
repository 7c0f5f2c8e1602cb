"""Low-rank ES (EGGROLL) on transformers: members, the update, resume, and the settings that must fail.

The references here are typed from the paper's definitions, not from the library: a member of
seed s changes every linear projection W (m x n) into W + sigma A Bᵀ / √r with A (m x r), B (n x r)
standard normal, and the update is W += alpha / N * sum_i z_i A_i B_iᵀ / √r with z the z-scored
rewards (EGGROLL, arXiv 2511.16652 v1; ES's z-scores and folded 1/sigma, arXiv 2509.24372). Only the
drawing convention is shared with the library (the factors come from one (n + m) x r normal block of the
tensor's generator, B its first n rows, as the authors' code draws them), so that both sides can
regenerate the same A and B from a seed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from conftest import kill_once_resumable
from esrepro.perturb.noise import member_seed, tensor_seed

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = [f"Using the numbers [{a} {b}], make {a + b}." for a in (3, 7, 12, 25) for b in (2, 9)]
MAX_NEW = 10


def _is_target(name: str) -> bool:
    return name.endswith(".weight") and name.rsplit(".", 2)[-2] in PROJ


def _factors(shape, seed: int, k: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (m x r), B (n x r) of parameter k under member seed ``seed`` (iid keying: the generator of (seed, k))."""
    m, n = shape
    g = torch.Generator().manual_seed(tensor_seed(seed, k, "iid"))
    z = torch.randn((n + m, r), generator=g, dtype=torch.float32)
    return z[n:], z[:n]


def _member_state(model_dir: Path, seed: int, sigma: float, r: int) -> dict[str, torch.Tensor]:
    """The base weights with W + sigma A Bᵀ / √r written into every linear projection (the paper's member)."""
    from esrepro.models.loading import load_model

    model = load_model(model_dir)
    out = {}
    for k, (name, p) in enumerate(model.named_parameters()):
        w = p.detach().clone()
        if _is_target(name):
            A, B = _factors(w.shape, seed, k, r)
            w = w + sigma * (A @ B.T) / math.sqrt(r)
        out[name] = w
    return out


def _generate_with(model_dir: Path, state: dict[str, torch.Tensor]) -> list[str]:
    from esrepro.backends.hf import HFBackend

    b = HFBackend(model_dir)
    with torch.no_grad():
        for name, p in b.model.named_parameters():
            p.copy_(state[name])
    return b.generate(PROMPTS, MAX_NEW)


@pytest.mark.parametrize("rank", [1, 3])
def test_member_in_place_through_adapter_and_written_weights_agree(tiny_model_dir, tmp_path, rank):
    """Member i's greedy outputs: the engine perturbing in place == peft serving the member's adapter == the
    reference weights W + sigma A_i B_iᵀ / √r written by this test (float32)."""
    from peft import PeftModel

    from esrepro.backends.hf import HFBackend, HFEngine
    from esrepro.backends.vllm_eggroll import lowrank_targets
    from esrepro.models.loading import load_model, load_tokenizer
    from esrepro.perturb.adapter import write_member_adapter

    sigma = 0.08
    engine = HFEngine(tiny_model_dir, rank=rank, restore="exact")
    base_out = engine.generate(PROMPTS, MAX_NEW)
    before = {n: p.clone() for n, p in engine.named_parameters()}
    seeds = [member_seed(5, 0, i) for i in range(3)]
    changed = 0
    for seed in seeds:
        ref = _member_state(tiny_model_dir, seed, sigma, rank)
        engine.perturb(seed, sigma)
        for name, p in engine.named_parameters():
            if _is_target(name):
                assert torch.allclose(p, ref[name], rtol=0, atol=1e-6), name
            else:
                assert torch.equal(p, before[name]), f"{name} is no matrix target but was perturbed"
        in_place = engine.generate(PROMPTS, MAX_NEW)
        engine.restore(seed, sigma)

        write_member_adapter(tmp_path / f"a{seed}", lowrank_targets(tiny_model_dir), seed, sigma, rank, "iid")
        peft = PeftModel.from_pretrained(load_model(tiny_model_dir), str(tmp_path / f"a{seed}"))
        adapter = HFBackend.wrap(peft, load_tokenizer(tiny_model_dir)).generate(PROMPTS, MAX_NEW)

        written = _generate_with(tiny_model_dir, ref)
        assert in_place == written
        assert adapter == written
        changed += written != base_out
    assert all(torch.equal(p, before[n]) for n, p in engine.named_parameters()), "restore was not exact"
    assert changed >= 2, "the members should change the outputs (test too weak)"


def test_one_iteration_update_equals_the_papers_equation(tiny_model_dir, tmp_path):
    """One eggroll iteration through the ES loop (rewards from real greedy scoring) moves every linear projection
    by alpha / N * sum_i z_i A_i B_iᵀ / √r, typed here from the equations; nothing else moves."""
    from esrepro.backends.spec import EngineSpec
    from esrepro.es.loop import run_es
    from esrepro.models.loading import load_model
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import Scoring
    from esrepro.settings.methods import EggrollSettings
    from esrepro.tasks.conciseness import prepare

    prepare(tmp_path / "conciseness", {"kind": "generated"}, seed=0)  # a length reward: varies for a random model
    examples = [json.loads(x) for x in (tmp_path / "conciseness" / "train.jsonl").read_text().splitlines()]
    cfg = EggrollSettings(iterations=1, population=6, sigma=0.1, alpha=0.02, rank=2, max_new_tokens=8,
                          train_examples=len(examples), batch_size=8, resume_every=1)
    evaluator = SerialEvaluator(EngineSpec(str(tiny_model_dir), rank=cfg.rank, noise=cfg.noise, restore=cfg.restore),
                                Scoring("conciseness", examples, cfg.max_new_tokens))
    log = run_es(evaluator, cfg, tmp_path / "state", seed=4, progress=False)
    row = log[0]
    rewards = np.asarray(row["rewards"], dtype=np.float32)
    assert rewards.std() > 0, "the members should score differently (test too weak)"
    z = (rewards - rewards.mean()) / (rewards.std() + np.float32(1e-8))
    after = dict(evaluator.worker.engine.named_parameters())
    base = load_model(tiny_model_dir)
    n, r = cfg.population, cfg.rank
    for k, (name, w0) in enumerate(base.named_parameters()):
        if not _is_target(name):
            assert torch.equal(after[name], w0), name
            continue
        step = torch.zeros(w0.shape, dtype=torch.float64)
        for seed, zi in zip(row["seeds"], z, strict=True):
            A, B = _factors(w0.shape, seed, k, r)
            step += float(zi) * (A.double() @ B.double().T) / math.sqrt(r)
        expected = w0.double() + cfg.alpha / n * step
        got = after[name].double()
        assert torch.allclose(got, expected, rtol=0, atol=1e-7), (name, (got - expected).abs().max())
        assert not torch.equal(after[name], w0)


def test_update_on_vllm_shards_equals_the_transformers_update(tiny_model_dir):
    """The update each vLLM tensor-parallel rank applies to its shards, put back into HF layout, is the transformers
    engine's update bit for bit (tensor-parallel sizes 1 and 2; the layout is the hand-written reading of vLLM's,
    tests/vllm_reference_layout.py, no vLLM)."""
    from transformers import AutoConfig

    from esrepro.backends.hf import HFEngine
    from esrepro.backends.vllm_engine import ShardedWeights
    from esrepro.backends.vllm_layout import to_hf, to_vllm
    from esrepro.models.architecture import linear_weight_names, meta_model
    from vllm_reference_layout import build_layout

    config = AutoConfig.from_pretrained(tiny_model_dir)
    targets = linear_weight_names(meta_model(config))
    engine = HFEngine(tiny_model_dir, rank=2)
    base = {n: p.clone() for n, p in engine.named_parameters()}
    seeds, weights = [member_seed(1, 3, i) for i in range(4)], [0.7, -1.2, 0.1, 0.4]
    engine.apply_update(seeds, weights, 0.03)
    want = dict(engine.named_parameters())
    for tp in (1, 2):
        layout = build_layout(config, tp)
        ranks = []
        for rank in range(tp):
            shards = to_vllm(base, layout, rank)
            ShardedWeights(shards, layout, rank, "iid", "exact", None, lowrank=2,
                           lowrank_targets=targets).apply_update(seeds, weights, 0.03)
            ranks.append(shards)
        got = to_hf(ranks, layout)
        assert all(torch.equal(got[n], want[n]) for n in want), tp


class _DeviceStream(torch.Generator):
    """A GPU's generator, emulated on the CPU: for one seed it draws other numbers than the CPU's, as CUDA's
    ``randn`` does."""

    def manual_seed(self, seed: int) -> torch.Generator:
        return super().manual_seed(int(seed) ^ 0x5DEECE66D)


@contextlib.contextmanager
def _on_emulated_gpu(on: bool = True) -> Iterator[None]:
    """Inside, every generator made (``torch.Generator(device=...)``) draws :class:`_DeviceStream`'s numbers: the
    code running here stands for code whose tensors live on a GPU."""
    cpu_generator = torch.Generator
    torch.Generator = _DeviceStream if on else cpu_generator
    try:
        yield
    finally:
        torch.Generator = cpu_generator


def _emulated_gpu_workers(rpc: Callable[..., list], on: bool = True) -> Callable[..., list]:
    """vLLM's ``collective_rpc`` whose workers' weights stand on an emulated GPU (:func:`_on_emulated_gpu` around
    each call into the workers); what the driver draws stays the CPU's."""
    def call(*args, **kwargs) -> list:
        with _on_emulated_gpu(on):
            return rpc(*args, **kwargs)

    return call


class _Workers:
    """vLLM's ``LLM`` as the driver sees it: ``collective_rpc`` calls every worker extension (rank order), here in
    this process; with ``gpu``, on an emulated GPU (:func:`_emulated_gpu_workers`)."""

    def __init__(self, workers: list, gpu: bool) -> None:
        self.workers = workers
        self.collective_rpc = _emulated_gpu_workers(self._call, gpu)

    def _call(self, method: str, timeout: float | None = None, args: tuple = ()) -> list:
        return [getattr(w, method)(*args) for w in self.workers]


class _Folders:
    """``AdapterBatch.add`` without vLLM: the adapter written into a fresh folder, which stands for its request."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, name: str, write) -> Path:
        path = self.root / name
        write(path)
        return path


def _off_the_adapter(targets, adapter: dict[str, torch.Tensor], deltas: dict[str, torch.Tensor], alpha: float,
                     rank: int) -> list[str]:
    """The targets whose one-member update of weight 1, ``deltas[name]`` = W' - W, is not alpha * lora_B lora_A / √r
    of ``adapter`` (peft's names) to float32 rounding."""
    from esrepro.perturb.adapter import PEFT_PREFIX

    off = []
    for name, _, _ in targets:
        module = PEFT_PREFIX + name.removesuffix(".weight")
        want = alpha * (adapter[f"{module}.lora_B.weight"] @ adapter[f"{module}.lora_A.weight"]) / math.sqrt(rank)
        if not torch.allclose(deltas[name], want, rtol=0, atol=1e-5):
            off.append(name)
    return off


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "emulated-gpu"])
@pytest.mark.parametrize("tp", [1, 2])
def test_the_update_moves_along_the_scored_adapters_factors(tiny_model_dir, tmp_path, tp, gpu):
    """The vLLM low-rank engine's member adapter (what is scored) holds the factors that the update in vLLM's workers
    draws again: after a one-member update of weight 1, W' - W = alpha * lora_B lora_A / √r on every linear
    projection. On a GPU the workers' generator draws other numbers than the CPU's for one seed; emulated here
    (every generator made in a worker call draws another stream), so an adapter drawn on any other device or by any
    other generator than the update's fails. On the CPU the adapter is bit for bit the CPU's draw. The engine's
    driver side and the worker extension are the library's; only vLLM's transport is stood in for (tensor-parallel
    sizes 1 and 2 on the hand-written reading of vLLM's layout, tests/vllm_reference_layout.py)."""
    from transformers import AutoConfig

    from esrepro.backends.vllm_eggroll import EggrollVLLMEngine
    from esrepro.backends.vllm_engine import ESWorkerExtension, ShardedWeights
    from esrepro.backends.vllm_layout import to_hf, to_vllm
    from esrepro.models.architecture import linear_weight_names, meta_model
    from esrepro.models.loading import load_model
    from esrepro.perturb.adapter import ADAPTER_WEIGHTS, adapter_tensors
    from vllm_reference_layout import build_layout

    rank, sigma, alpha, seed = 2, 0.05, 0.5, member_seed(3, 0, 1)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    linears = linear_weight_names(meta_model(config))
    layout = build_layout(config, tp)
    base = {n: p.detach().clone() for n, p in load_model(tiny_model_dir).named_parameters()}
    states, workers = [to_vllm(base, layout, r) for r in range(tp)], []
    for r, state in enumerate(states):
        worker = ESWorkerExtension()
        worker.es_state = ShardedWeights(state, layout, r, "iid", "subtract", None, lowrank=rank,
                                         lowrank_targets=linears)
        workers.append(worker)
    engine = object.__new__(EggrollVLLMEngine)  # the driver's side, its workers the ones above (no vLLM)
    engine.llm, engine.call_timeout, engine.prefix_caching = _Workers(workers, gpu), None, False
    engine.model_dir, engine.rank, engine.variant, engine.adapters = Path(tiny_model_dir), rank, "iid", _Folders(tmp_path)
    engine.targets = [(t.name, t.index, t.shape) for t in layout.hf if t.name in linears]
    assert len(engine.targets) == len(linears) > 0

    (folder,) = engine.prepare_members([seed], sigma)
    adapter = load_file(folder / ADAPTER_WEIGHTS)
    engine.apply_update([seed], [1.0], alpha)
    after = to_hf(states, layout)
    deltas = {name: after[name] - base[name] for name, _, _ in engine.targets}
    apart = _off_the_adapter(engine.targets, adapter, deltas, alpha, rank)
    assert not apart, f"the update's factors are not the scored adapter's on {len(apart)} tensors: {apart[:3]}"
    cpu_draw = adapter_tensors(engine.targets, seed, rank, "iid")
    off_cpu = _off_the_adapter(engine.targets, cpu_draw, deltas, alpha, rank)
    assert len(off_cpu) == (len(engine.targets) if gpu else 0), "the emulated GPU stream did not reach the update"
    if not gpu:
        assert all(torch.equal(adapter[k], cpu_draw[k]) for k in cpu_draw), "the CPU's draw changed"


def test_bad_rank_names_the_setting(tiny_model_dir):
    from esrepro.backends.hf import HFEngine
    from esrepro.settings.methods import EggrollSettings, algorithm

    assert algorithm("eggroll").settings is EggrollSettings and algorithm("eggroll").defaults == "es"
    with pytest.raises(ValidationError, match="rank"):
        EggrollSettings(rank=0)
    with pytest.raises(ValueError, match=r"rank 600 exceeds 512"):
        EggrollSettings(rank=600, backend="vllm")
    # the tiny model's smallest projection is k_proj (16 x 32): a rank-17 product does not fit
    with pytest.raises(ValueError, match=r"eggroll setting rank: 17 is outside \[1, 16\].*k_proj"):
        HFEngine(tiny_model_dir, rank=17)
    HFEngine(tiny_model_dir, rank=16)


SPEC = {
    "algorithm": "eggroll", "iterations": 6, "population": 4, "sigma": 0.05, "alpha": 0.05, "rank": 2,
    "train_examples": 2, "max_new_tokens": 8, "batch_size": 2, "resume_every": 2,
}


def _train_cmd(model_dir: Path, data_dir: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "esrepro.cli", "train", "--method", "eggroll", "--task", "conciseness",
            "--model", "test", "--model-dir", str(model_dir), "--data-dir", str(data_dir),
            "--spec", json.dumps(SPEC), "--seed", "3", "--out", str(out), "--threads", "1"]


@pytest.mark.slow
def test_killed_eggroll_run_resumes_bit_identically(tiny_model_dir, tmp_path):
    """The training step runs ``eggroll`` as it runs ``es``; killed after a resume state, it ends bit-identical
    (on conciseness, whose length reward varies for a random model, so the weights move)."""
    from esrepro.tasks.conciseness import prepare

    data = tmp_path / "conciseness"
    prepare(data, {"kind": "generated"}, seed=0)
    env = {**os.environ, "TQDM_DISABLE": "1"}
    straight = tmp_path / "straight"
    subprocess.run(_train_cmd(tiny_model_dir, data, straight), check=True, env=env, timeout=600)
    killed = tmp_path / "killed"
    done = kill_once_resumable(_train_cmd(tiny_model_dir, data, killed), env, killed, "completed_iterations", 2)
    assert 2 <= done < SPEC["iterations"]
    subprocess.run(_train_cmd(tiny_model_dir, data, killed), check=True, env=env, timeout=600)
    a = load_file(str(straight / "checkpoint" / "model.safetensors"))
    b = load_file(str(killed / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = {k for k in a if not torch.equal(a[k], base[k])}
    assert moved and all(_is_target(k) for k in moved), sorted(moved)
    log_a = [json.loads(x) for x in (straight / "log.jsonl").read_text().splitlines()]
    log_b = [json.loads(x) for x in (killed / "log.jsonl").read_text().splitlines()]
    assert [r["rewards"] for r in log_a] == [r["rewards"] for r in log_b]
    manifest = json.loads((killed / "manifest.json").read_text())
    assert manifest["settings"]["algorithm"] == "eggroll" and manifest["settings"]["rank"] == 2


def test_an_eggroll_method_beside_es_is_planned_checked_and_priced():
    """config/paper.yaml with an eggroll method on Table 1's task: its train jobs are laid out as ES's (vLLM engines),
    pass the plan check with a LoRA slot per member counted, and are priced (iterations as ES's)."""
    import copy

    from conftest import REPO
    from esrepro.config import read_config
    from esrepro.planning import cost, plan_check, scaling
    from esrepro.planning.cluster import ray_layout
    from esrepro.planning.load import load_pipeline

    cfg = copy.deepcopy(read_config(str(REPO / "config" / "paper.yaml")))
    cfg.setdefault("methods", {})["eggroll4"] = {"algorithm": "eggroll", "rank": 4}
    cfg["train"]["countdown"]["methods"] = [*cfg["train"]["countdown"]["methods"], "eggroll4"]
    p = load_pipeline(cfg, str(REPO / "config" / "paper.yaml"))
    models = p.train_models("countdown")
    assert models
    for model in models:
        s = p.method_settings(model, "countdown", "eggroll4")
        es = p.method_settings(model, "countdown", "es")
        assert (s.population, s.sigma, s.alpha, s.iterations, s.backend) == \
            (es.population, es.sigma, es.alpha, es.iterations, es.backend)  # defaults.es: an equal budget
        job = plan_check.build(p, "train", {"task": "countdown", "model": model, "method": "eggroll4", "seed": "0"})
        assert job.kind == f"eggroll {s.backend}" and not job.problems, job.problems
        assert ray_layout(p, "countdown", model, "eggroll4") == ray_layout(p, "countdown", model, "es")
        assert scaling.run_steps(p, "countdown", model, "eggroll4") == s.iterations
    priced = [r for j, r in cost.job_rows(p) if j.wildcards.get("method") == "eggroll4"]
    assert len(priced) >= len(models) and all(r.estimated_gpu_h > 0 for r in priced)


def test_the_extension_config_adds_eggroll_beside_es_and_the_paper_config_has_none():
    """config/paper_eggroll.yaml: eggroll at ranks 1 and 4 on every Table 1 model, each job built and fitting, priced;
    config/paper.yaml itself names no eggroll method (it stays the papers' experiments)."""
    from conftest import REPO
    from esrepro.config import read_config
    from esrepro.planning import cost, plan_check
    from esrepro.planning.load import load_pipeline

    paper = load_pipeline(read_config(str(REPO / "config/paper.yaml")), "config/paper.yaml", root=REPO)
    assert not [m for t in paper.cfg.train for m in paper.train_methods(t)
                if paper.algorithm_of(t, m).name == "eggroll"]
    p = load_pipeline(read_config(str(REPO / "config/paper_eggroll.yaml")), "config/paper_eggroll.yaml", root=REPO)
    assert p.train_methods("countdown")[-3:] == ["eggroll1", "eggroll4", "eslinear"]
    assert p.train_models("countdown") == paper.train_models("countdown")
    for model in p.train_models("countdown"):
        for method, rank in (("eggroll1", 1), ("eggroll4", 4)):
            assert p.method_settings(model, "countdown", method).rank == rank
            job = plan_check.build(p, "train", {"task": "countdown", "model": model, "method": method, "seed": "0"})
            assert not job.problems, (model, method, job.problems)
    priced = [(j, r) for j, r in cost.job_rows(p) if j.rule == "train" and j.wildcards["method"].startswith("egg")]
    assert {(j.wildcards["model"], j.wildcards["method"]) for j, _ in priced} == \
        {(m, e) for m in p.train_models("countdown") for e in ("eggroll1", "eggroll4")}
    assert all(r.estimated_gpu_h > 0 for _, r in priced)
