"""ESSA core: LoRA SFT, the singular value search space, in-place candidates, CMA-ES resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import make_model_dir
from esrepro.essa.export import save_adapter, save_merged
from esrepro.essa.lora import ADAPTER_WEIGHTS, LoraFactors, load_lora, load_merged, sft_lora
from esrepro.essa.strategy import CMAStrategy
from esrepro.essa.svd import CandidateApplier, SingularValueSpace, factorise, selected_count
from esrepro.models.loading import load_model, load_tokenizer

PAIRS = [(f"Using the numbers [{a} {b}], make {a + b}.", f" <think> {a} + {b} </think>\n<answer>{a} + {b}</answer>")
         for a in range(1, 21) for b in range(1, 11)]
SFT = dict(rank=8, alpha=16, epochs=3, learning_rate=0.05, batch_size=16)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor (so -0.0 != 0.0 and NaN payloads count)."""
    return t.detach().contiguous().view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def random_factors(out_f: int, in_f: int, r: int, scaling: float, seed: int) -> LoraFactors:
    g = torch.Generator().manual_seed(seed)
    return LoraFactors(A=torch.randn(r, in_f, generator=g) * 0.3, B=torch.randn(out_f, r, generator=g) * 0.3,
                       scaling=scaling)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("essa")
    model_dir = make_model_dir(root / "base")
    summary = sft_lora(model_dir, PAIRS, seed=0, out_dir=root / "sft", **SFT)
    return model_dir, root / "sft", summary


@pytest.fixture(scope="module")
def space(sft_run):
    model_dir, adapter_dir, _ = sft_run
    return SingularValueSpace.build(load_lora(model_dir, adapter_dir), fraction=0.4)


def random_candidate(space: SingularValueSpace, scale: float, seed: int) -> np.ndarray:
    return space.x0 + np.random.default_rng(seed).normal(0.0, scale, space.dim)


# -- LoRA SFT -----------------------------------------------------------------------------


@pytest.mark.slow
def test_lora_sft_lowers_loss_and_is_deterministic(sft_run, tmp_path):
    model_dir, adapter_dir, summary = sft_run
    assert summary["loss_after"] < summary["loss_before"] - 0.1, summary
    assert summary["steps"] == SFT["epochs"] * math.ceil(len(PAIRS) / SFT["batch_size"])

    again = sft_lora(model_dir, PAIRS, seed=0, out_dir=tmp_path / "again", **SFT)
    assert (tmp_path / "again" / ADAPTER_WEIGHTS).read_bytes() == (adapter_dir / ADAPTER_WEIGHTS).read_bytes()
    assert again["loss_after"] == summary["loss_after"]

    other = sft_lora(model_dir, PAIRS, seed=1, out_dir=tmp_path / "other", **SFT)
    assert (tmp_path / "other" / ADAPTER_WEIGHTS).read_bytes() != (adapter_dir / ADAPTER_WEIGHTS).read_bytes()
    assert other["base_model"] == summary["base_model"]


def test_load_lora_names_shapes_scaling(sft_run):
    model_dir, adapter_dir, _ = sft_run
    adapters = load_lora(model_dir, adapter_dir)
    expected = [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    assert sorted(adapters) == sorted(expected)
    model = load_model(model_dir)
    for name, f in adapters.items():
        w = model.get_submodule(name).weight
        assert f.A.shape == (8, w.shape[1]) and f.B.shape == (w.shape[0], 8)
        assert f.scaling == 16 / 8
        assert f.B.abs().max() > 0  # trained: B leaves its zero init
    with pytest.raises(FileNotFoundError, match="adapter"):
        load_lora(model_dir, model_dir)


# -- SVD parametrisation ------------------------------------------------------------------


@pytest.mark.parametrize("out_f,in_f,r", [(40, 48, 8), (4, 48, 8)])
def test_factorise_reconstructs_adapter(out_f, in_f, r):
    f = random_factors(out_f, in_f, r, scaling=2.0, seed=out_f)
    svd = factorise(f)
    k = min(r, out_f, in_f)
    assert svd.U.shape == (out_f, k) and svd.S.shape == (k,) and svd.V.shape == (in_f, k)
    product = f.scaling * f.B.double() @ f.A.double()
    torch.testing.assert_close(svd.U @ torch.diag(svd.S) @ svd.V.T, product, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(svd.U.T @ svd.U, torch.eye(k, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(svd.V.T @ svd.V, torch.eye(k, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.all(svd.S[:-1] >= svd.S[1:])
    torch.testing.assert_close(svd.S, torch.linalg.svdvals(product)[:k], rtol=1e-10, atol=1e-12)


def test_selection_per_adapter_and_global():
    assert [selected_count(r, 0.4) for r in (4, 8, 16, 64)] == [2, 4, 7, 26]
    assert selected_count(10, 0.7) == 7 and selected_count(5, 1.0) == 5
    adapters = {f"model.layers.{i}.self_attn.q_proj": random_factors(24, 24, 8, 1.0, i) for i in (0, 1, 10)}
    per = SingularValueSpace.build(adapters, 0.4)
    assert per.names == ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj",
                         "model.layers.10.self_attn.q_proj")
    assert per.dim == 3 * 4 and all(c == 4 for c in per.counts.values())
    for n in per.names:
        np.testing.assert_array_equal(per.split(per.x0)[n], per.svds[n].S[:4].numpy())
    np.testing.assert_array_equal(per.join(per.split(per.x0)), per.x0)

    glob = SingularValueSpace.build(adapters, 0.4, selection="global")
    assert glob.dim == math.ceil(0.4 * 24)
    every = np.sort(np.concatenate([s.S.numpy() for s in glob.svds.values()]))[::-1]
    np.testing.assert_array_equal(np.sort(glob.x0)[::-1], every[: glob.dim])
    with pytest.raises(ValueError, match="dimension"):
        per.split(np.zeros(per.dim + 1))


def test_apply_at_sft_values_is_bit_identical(sft_run, space):
    model_dir, adapter_dir, _ = sft_run
    model = load_merged(model_dir, adapter_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    applier = CandidateApplier(model, space)
    applier.apply(space.x0)
    assert not applier.modified
    after = model.state_dict()
    assert all(same_bits(before[k], after[k]) for k in before)


def test_top_values_change_only_their_directions(sft_run, space):
    model_dir, adapter_dir, _ = sft_run
    model = load_merged(model_dir, adapter_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    applier = CandidateApplier(model, space)
    x = random_candidate(space, 0.3, seed=1)
    new_values = space.split(x)
    applier.apply(x)
    after = model.state_dict()
    adapted = {f"{n}.weight" for n in space.names}
    assert all(same_bits(before[k], after[k]) for k in before if k not in adapted)
    assert all(not same_bits(before[k], after[k]) for k in adapted)
    for n in space.names:
        k = space.counts[n]
        U, S, V = space.svds[n].U, space.svds[n].S, space.svds[n].V
        change = after[f"{n}.weight"].double() - before[f"{n}.weight"].double()
        expected = U[:, :k] @ torch.diag(torch.from_numpy(new_values[n]) - S[:k]) @ V[:, :k].T
        tol = 2 * torch.finfo(torch.float32).eps * before[f"{n}.weight"].abs().max().item()
        torch.testing.assert_close(change, expected, rtol=0, atol=tol)
        # the directions left out of the search see nothing beyond float32 rounding
        assert (U[:, k:].T @ change).abs().max() < 4 * tol
        assert (change @ V[:, k:]).abs().max() < 4 * tol

    # in exact arithmetic (the adapter rebuilt in float64) the unselected values are untouched
    for n, f in space.adapter_factors(x, dtype=torch.float64).items():
        k = space.counts[n]
        values = torch.linalg.svdvals(f.scaling * f.B @ f.A)
        expected = torch.sort(torch.cat([torch.from_numpy(new_values[n]).abs(), space.svds[n].S[k:]]), descending=True).values
        torch.testing.assert_close(values[: expected.numel()], expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(space.singular_values(x)[n][k:].numpy(), space.svds[n].S[k:].numpy())


def test_apply_restore_in_place_is_exact(sft_run, space):
    model_dir, adapter_dir, _ = sft_run
    model = load_merged(model_dir, adapter_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    applier = CandidateApplier(model, space)
    x1, x2 = random_candidate(space, 0.3, seed=2), random_candidate(space, 0.3, seed=3)

    applier.apply(x2)
    direct = {k: v.clone() for k, v in model.state_dict().items()}
    applier.restore()
    assert all(same_bits(before[k], v) for k, v in model.state_dict().items())

    applier.apply(x1)
    applier.apply(x2)  # replaces x1, does not stack on it
    assert all(same_bits(direct[k], v) for k, v in model.state_dict().items())

    with pytest.raises(RuntimeError, match="boom"), applier.candidate(x1):
        raise RuntimeError("boom")
    assert all(same_bits(before[k], v) for k, v in model.state_dict().items())


def test_space_save_load_round_trip(space, tmp_path):
    space.save(tmp_path / "space.safetensors")
    loaded = SingularValueSpace.load(tmp_path / "space.safetensors")
    assert loaded.names == space.names and loaded.counts == space.counts and loaded.selection == space.selection
    np.testing.assert_array_equal(loaded.x0, space.x0)
    x = random_candidate(space, 0.3, seed=4)
    a, b = space.corrections(x), loaded.corrections(x)
    assert a.keys() == b.keys() and all(same_bits(a[n], b[n]) for n in a)


def test_export_adapter_and_merged_weights(sft_run, space, tmp_path):
    from peft import PeftModel

    model_dir, adapter_dir, _ = sft_run
    model = load_merged(model_dir, adapter_dir)
    applier = CandidateApplier(model, space)
    x = random_candidate(space, 0.3, seed=5)

    save_merged(applier, load_tokenizer(model_dir), x, tmp_path / "merged")
    assert not applier.modified  # the model is back at the SFT weights
    with applier.candidate(x):
        evaluated = {k: v.clone() for k, v in model.state_dict().items()}
    reloaded = load_model(tmp_path / "merged").state_dict()
    assert all(same_bits(evaluated[k], reloaded[k]) for k in evaluated)

    save_adapter(space, x, adapter_dir, tmp_path / "adapter")
    via_peft = PeftModel.from_pretrained(load_model(model_dir), str(tmp_path / "adapter")).merge_and_unload()
    for k, v in via_peft.state_dict().items():
        torch.testing.assert_close(v, evaluated[k], rtol=0, atol=1e-6)
    # re-factorising the exported adapter gives back the candidate's values
    again = SingularValueSpace.build(load_lora(model_dir, tmp_path / "adapter"), fraction=0.4)
    for n in space.names:
        np.testing.assert_allclose(np.sort(np.abs(again.svds[n].S.numpy())),
                                   np.sort(np.abs(space.singular_values(x)[n].numpy())), rtol=1e-5, atol=1e-6)


def test_adapter_applier_matches_merged_candidate(sft_run, space):
    """The quantised path's applier (adapter unmerged, factors rewritten) gives the merged path's model
    (here on an unquantised float32 base, on the CPU) and restores the SFT factors bit-exactly."""
    from peft import PeftModel

    from esrepro.essa.svd import AdapterApplier

    model_dir, adapter_dir, _ = sft_run
    merged = load_merged(model_dir, adapter_dir)
    unmerged = PeftModel.from_pretrained(load_model(model_dir), str(adapter_dir)).eval()
    before = {k: v.clone() for k, v in unmerged.state_dict().items()}
    direct, rebuilt = CandidateApplier(merged, space), AdapterApplier(unmerged, space)
    x = random_candidate(space, 0.3, seed=6)
    ids = torch.tensor([[3, 17, 42, 7, 99, 5]])
    with direct.candidate(x), rebuilt.candidate(x):
        torch.testing.assert_close(unmerged(ids).logits, merged(ids).logits, rtol=1e-4, atol=1e-4)
        assert len(rebuilt.modified) == len(space.names)
    assert all(same_bits(before[k], v) for k, v in unmerged.state_dict().items())
    rebuilt.apply(space.x0)
    assert not rebuilt.modified


# -- CMA-ES -------------------------------------------------------------------------------


def run_generations(strategy: CMAStrategy, n: int, target: np.ndarray) -> list[np.ndarray]:
    asked = []
    for _ in range(n):
        pop = strategy.ask()
        asked.append(np.stack(pop))
        strategy.tell(pop, [-float(np.sum((p - target) ** 2)) for p in pop])
    return asked


@pytest.mark.parametrize("covariance", ["separable", "full"])
def test_cma_resume_is_bit_identical(covariance):
    target = np.linspace(-1, 1, 12)
    make = lambda: CMAStrategy(np.zeros(12), 0.32, population=8, seed=7, covariance=covariance)  # noqa: E731
    straight = make()
    full = run_generations(straight, 5, target)

    first = make()
    head = run_generations(first, 2, target)
    saved = first.to_bytes()
    resumed = CMAStrategy.from_state(saved)
    assert resumed.covariance == covariance and resumed.to_bytes() == saved  # the state round-trips byte for byte
    tail = run_generations(resumed, 3, target)
    for a, b in zip(full, head + tail, strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(straight.mean, resumed.mean) and straight.sigma == resumed.sigma
    assert straight.generation == resumed.generation == 5
    assert np.array_equal(straight.best[0], resumed.best[0]) and straight.best[1] == resumed.best[1]

    assert straight.to_bytes() == resumed.to_bytes()

    # saved mid-generation (asked, not told; full CMA-ES caches its eigendecomposition then): the resumed run is
    # handed the same population
    mid = make()
    run_generations(mid, 2, target)
    pending = mid.ask()
    again = CMAStrategy.from_state(mid.state_dict())
    assert again.to_bytes() == mid.to_bytes()
    assert all(np.array_equal(a, b) for a, b in zip(pending, again.ask(), strict=True))
    tail2 = run_generations(again, 3, target)
    assert all(np.array_equal(a, b) for a, b in zip(full[2:], tail2, strict=True))


def test_cma_covariance_variants_differ_and_are_recorded():
    """separable runs cmaes.SepCMA, full runs cmaes.CMA; the state says which, and an old state without the key
    (written before full covariance existed) loads as separable."""
    from cmaes import CMA, SepCMA

    target = np.linspace(-1, 1, 6)
    sep = CMAStrategy(np.zeros(6), 0.5, 10, seed=3)
    full = CMAStrategy(np.zeros(6), 0.5, 10, seed=3, covariance="full")
    assert isinstance(sep._opt, SepCMA) and isinstance(full._opt, CMA)
    run_generations(sep, 3, target)
    run_generations(full, 3, target)
    assert not np.array_equal(sep.mean, full.mean)
    assert str(full.state_dict()["covariance"]) == "full" and str(sep.state_dict()["covariance"]) == "separable"
    old = {k: v for k, v in sep.state_dict().items() if k != "covariance"}
    assert CMAStrategy.from_state(old).covariance == "separable"
    with pytest.raises(ValueError, match="has attribute"):  # a full state relabelled separable is refused
        CMAStrategy.from_state({**full.state_dict(), "covariance": np.array("separable")})
    with pytest.raises(ValueError, match="covariance must be"):
        CMAStrategy(np.zeros(6), 0.5, 10, seed=3, covariance="diagonal")


def test_cma_tell_matches_candidates_in_any_order():
    target = np.ones(6)
    a, b = CMAStrategy(np.zeros(6), 0.5, 10, seed=3), CMAStrategy(np.zeros(6), 0.5, 10, seed=3)
    pop_a, pop_b = a.ask(), b.ask()
    rewards = [-float(np.sum((p - target) ** 2)) for p in pop_a]
    a.tell(pop_a, rewards)
    perm = np.random.default_rng(0).permutation(10)
    b.tell([pop_b[i] for i in perm], [rewards[i] for i in perm])
    assert np.array_equal(a.mean, b.mean) and all(np.array_equal(x, y) for x, y in zip(a.ask(), b.ask(), strict=True))
    with pytest.raises(ValueError, match="not the population"):
        a.tell([p + 1e-9 for p in a.ask()], rewards)
    with pytest.raises(RuntimeError, match="without ask"):
        CMAStrategy(np.zeros(6), 0.5, 10, seed=3).tell(pop_a, rewards)


def test_cma_improves_on_toy_problem():
    rng = np.random.default_rng(0)
    target = rng.normal(0.0, 1.0, 20)
    strategy = CMAStrategy(np.zeros(20), 0.32, population=16, seed=0)
    start = -float(np.sum(target ** 2))
    run_generations(strategy, 150, target)
    best_x, best_reward = strategy.best
    assert best_reward > 0.01 * start  # 100x closer to the target than x0
    assert -float(np.sum((strategy.mean - target) ** 2)) > 0.01 * start
    assert best_reward == pytest.approx(-float(np.sum((best_x - target) ** 2)))


def test_run_killed_after_generation_one_resumes_from_it(sft_run, space, tmp_path):
    """The first resume state is written after generation 1 even when resume_every is longer than the run
    stretch a kill cuts off; the resumed run ends where the uninterrupted one does."""
    from esrepro.essa.loop import Problems, run_essa
    from esrepro.essa.spec import ESSAEngineSpec
    from esrepro.population.evaluators import SerialEvaluator
    from esrepro.population.spec import IndexedScoring
    from esrepro.settings.methods import ESSASettings
    from esrepro.tasks.countdown import generate_problems

    model_dir, adapter_dir, _ = sft_run
    space.save(tmp_path / "space.safetensors")
    spec = ESSAEngineSpec(str(model_dir), str(adapter_dir), str(tmp_path / "space.safetensors"), batch_size=8)
    scoring = IndexedScoring("countdown", generate_problems(8, seed=1), max_new_tokens=6, fitness="reward")
    evaluator = SerialEvaluator(spec, scoring)
    cfg = ESSASettings(population=4, iterations=3, resume_every=10, max_new_tokens=6, sft_examples=1,
                       fitness_examples=8)
    problems = Problems(fitness=list(range(8)), val=[])

    class Killed(Exception):
        pass

    def kill_in_generation_two(row: dict, strategy) -> None:
        if row["generation"] == 1:
            raise Killed

    with pytest.raises(Killed):
        run_essa(evaluator, cfg, space.x0, problems, tmp_path / "resume", on_generation=kill_in_generation_two,
                 progress=False)
    from esrepro.io import read_json

    assert read_json(tmp_path / "resume" / "state.json")["completed_generations"] == 1
    resumed, strategy, _ = run_essa(evaluator, cfg, space.x0, problems, tmp_path / "resume", progress=False)
    straight, other, _ = run_essa(evaluator, cfg, space.x0, problems, tmp_path / "straight", progress=False)
    assert [r["rewards"] for r in resumed] == [r["rewards"] for r in straight] and len(resumed) == 3
    assert np.array_equal(strategy.mean, other.mean)
