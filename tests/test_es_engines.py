"""The population evaluator: K Ray engines end bit-identical to one in-process engine, survive a killed
worker, resume after an interrupted driver, and refuse to go on when engines disagree."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from esrepro.backends.spec import EngineSpec
from esrepro.es.loop import run_es
from esrepro.population.evaluators import EngineMismatch, RayEvaluator, SerialEvaluator, own_gpu
from esrepro.population.spec import Scoring
from esrepro.settings.methods import ESSettings
from esrepro.tasks.conciseness import prepare

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def scoring(tmp_path_factory) -> Scoring:
    # conciseness: short prompts, and a length reward that varies even for an untrained model
    out = tmp_path_factory.mktemp("conciseness")
    prepare(out, {"kind": "generated"}, seed=0)
    examples = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    return Scoring("conciseness", examples, max_new_tokens=8)


@pytest.fixture(scope="module")
def ray_local():
    from esrepro.population.ray_session import ensure_ray

    ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


def _cfg(noise: str, restore: str, iterations: int = 3, resume_every: int = 100) -> ESSettings:
    return ESSettings(iterations=iterations, population=4, sigma=0.05, alpha=0.05, max_new_tokens=8, train_examples=2,
                      batch_size=2, noise=noise, restore=restore, resume_every=resume_every)


def _spec(model_dir: Path, cfg: ESSettings) -> EngineSpec:
    return EngineSpec(str(model_dir), batch_size=2, noise=cfg.noise, restore=cfg.restore, threads=1)


def _weights(path: Path) -> dict:
    return load_file(str(path / "model.safetensors"))


def _run(evaluator, cfg, tmp: Path, name: str, **kw) -> tuple[list[dict], dict]:
    log = run_es(evaluator, cfg, tmp / name / "resume", progress=False, **kw)
    evaluator.save(tmp / name / "final")
    return log, _weights(tmp / name / "final")


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("noise", ["iid", "correlated"])
@pytest.mark.parametrize("restore", ["exact", "subtract"])
@pytest.mark.slow
def test_two_ray_engines_end_bit_identical_to_the_serial_loop(tiny_model_dir, scoring, ray_local, tmp_path, noise,
                                                              restore):
    cfg = _cfg(noise, restore)
    serial_log, serial = _run(SerialEvaluator(_spec(tiny_model_dir, cfg), scoring), cfg, tmp_path, "serial")
    evaluator = RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2)
    try:
        ray_log, spread = _run(evaluator, cfg, tmp_path, "ray")
    finally:
        evaluator.close()
    assert [r["rewards"] for r in ray_log] == [r["rewards"] for r in serial_log]
    assert [r["checksum"] for r in ray_log] == [r["checksum"] for r in serial_log]
    assert ray_log[-1]["engines"] == 2 and serial_log[-1]["engines"] == 1
    assert _same(serial, spread)
    base = _weights(tiny_model_dir)
    assert not _same(base, serial), "training did not change the weights"


class _Killing:
    """The real Ray evaluator; one of its worker processes is SIGKILLed at given points of given iterations."""

    def __init__(self, inner: RayEvaluator, kills: dict[tuple[str, int], int]) -> None:
        self.inner, self.kills, self.calls = inner, kills, {"rewards": 0, "apply_update": 0}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _maybe_kill(self, phase: str) -> None:
        worker = self.kills.get((phase, self.calls[phase]))
        if worker is not None:
            os.kill(self.inner.pids()[worker], signal.SIGKILL)
            time.sleep(0.5)  # let Ray notice the death, as it would for a crash mid-call
        self.calls[phase] += 1

    def rewards(self, seeds, sigma):
        self._maybe_kill("rewards")
        return self.inner.rewards(seeds, sigma)

    def apply_update(self, update):
        self._maybe_kill("apply_update")
        return self.inner.apply_update(update)


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_run_ends_identical(tiny_model_dir, scoring, ray_local, tmp_path):
    cfg = _cfg("correlated", "subtract")  # subtract: the replacement must replay every member's perturb/restore
    serial_log, serial = _run(SerialEvaluator(_spec(tiny_model_dir, cfg), scoring), cfg, tmp_path, "serial")
    inner = RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2)
    try:
        # worker 1 dies as iteration 1's members are sent out; worker 0 between iteration 2's members and update
        evaluator = _Killing(inner, {("rewards", 1): 1, ("apply_update", 2): 0})
        log, weights = _run(evaluator, cfg, tmp_path, "killed")
    finally:
        inner.close()
    assert inner.respawned == 2
    assert [r["rewards"] for r in log] == [r["rewards"] for r in serial_log]
    assert [r["checksum"] for r in log] == [r["checksum"] for r in serial_log]
    assert _same(serial, weights)


@pytest.mark.slow
def test_an_interrupted_run_resumes_bit_identically(tiny_model_dir, scoring, ray_local, tmp_path):
    cfg = _cfg("iid", "subtract", iterations=3, resume_every=1)
    _, serial = _run(SerialEvaluator(_spec(tiny_model_dir, cfg), scoring), cfg, tmp_path, "serial")

    class Stop(Exception):
        pass

    def stop_at_two(row: dict) -> None:
        if row["iteration"] == 1:
            raise Stop  # the driver dies after iteration 1 (its state after iteration 0 is on disk)

    first = RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2)
    try:
        with pytest.raises(Stop):
            run_es(first, cfg, tmp_path / "run" / "resume", on_iteration=stop_at_two, progress=False)
    finally:
        first.close()
    assert json.loads((tmp_path / "run/resume/state.json").read_text())["completed_iterations"] == 1
    second = RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2)
    try:
        log, weights = _run(second, cfg, tmp_path, "run")
    finally:
        second.close()
    assert len(log) == 3 and _same(serial, weights)


@pytest.mark.slow
def test_engines_that_disagree_stop_the_run(tiny_model_dir, scoring, ray_local, tmp_path):
    cfg = _cfg("iid", "exact", iterations=1)
    evaluator = RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2)
    try:
        ray.get(evaluator.actors[1].update.remote([123], [1.0], 0.1))  # one engine moved on its own
        with pytest.raises(EngineMismatch, match="different weights"):
            run_es(evaluator, cfg, tmp_path / "resume", progress=False)
    finally:
        evaluator.close()


def test_an_engine_ray_cannot_place_times_out_naming_its_resources(scoring, tiny_model_dir, ray_local):
    cfg = _cfg("iid", "exact")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"engine 0 did not start within 3 s.*'num_cpus': 64"):
        RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2, per_engine={"num_cpus": 64}, start_timeout=3)
    assert time.monotonic() - started < 60


def test_engines_with_a_gpu_each_start_side_by_side_and_sharing_ones_one_after_another():
    assert own_gpu({"num_gpus": 1, "num_cpus": 1}) and own_gpu({"num_gpus": 2, "num_cpus": 1})  # tensor parallel
    assert not own_gpu({"num_gpus": 0.5, "num_cpus": 1}) and not own_gpu({"num_cpus": 4})


def test_the_engines_phases_spread_with_the_batched_ones_only_where_every_engine_reports_them():
    """Members spread over engines: rewards back in member order, each phase the slowest engine's; loading and
    grading (the batched path's phases) come through where every engine reports them, and an engine that scores
    members one at a time gives the phases it always gave."""
    evaluator = RayEvaluator.__new__(RayEvaluator)  # no actors: the engines' answers are given
    evaluator.engines, evaluator._ops = 2, []
    batched = {"perturb": 0.1, "load": 0.2, "generation": 0.3, "grading": 0.05, "restore": 0.01, "tokens": 0}
    evaluator._all = lambda method, args: [([1.0, 3.0], batched), ([2.0], {**batched, "load": 0.4})]
    rewards, seconds = evaluator.rewards([11, 12, 13], 0.1)
    assert rewards == [1.0, 2.0, 3.0]
    assert {k: seconds[k] for k in ("perturb", "load", "generation", "grading", "restore")} == {
        "perturb": 0.1, "load": 0.4, "generation": 0.3, "grading": 0.05, "restore": 0.01}
    one_at_a_time = {"perturb": 0.1, "generation": 0.3, "restore": 0.01, "tokens": 0}
    evaluator._all = lambda method, args: [([1.0, 3.0], one_at_a_time), ([2.0], one_at_a_time)]
    assert set(evaluator.rewards([11, 12, 13], 0.1)[1]) == {"perturb", "generation", "restore", "wall"}


@pytest.mark.slow
def test_engines_started_side_by_side_score_as_the_serial_engine(tiny_model_dir, scoring, ray_local):
    cfg = _cfg("iid", "exact", iterations=1)
    seeds = [11, 12, 13, 14]
    want, _ = SerialEvaluator(_spec(tiny_model_dir, cfg), scoring).rewards(seeds, cfg.sigma)
    evaluator = RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2, side_by_side=True)
    try:
        assert evaluator.side_by_side and len(set(evaluator.pids())) == 2
        assert evaluator.rewards(seeds, cfg.sigma)[0] == want
    finally:
        evaluator.close()


def test_engines_started_side_by_side_are_all_asked_for_at_once_and_named_when_late(tiny_model_dir, scoring,
                                                                                    ray_local):
    """Both requests are out before either answers: the timeout names both engines (one after another, it would
    stop at engine 0)."""
    cfg = _cfg("iid", "exact")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"engines 0, 1 did not start within 3 s.*'num_cpus': 64"):
        RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2, per_engine={"num_cpus": 64}, start_timeout=3,
                     side_by_side=True)
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_a_hung_worker_is_replaced_after_call_timeout_and_the_call_retried(tiny_model_dir, scoring, ray_local,
                                                                            tmp_path):
    """An engine whose process stops answering (SIGSTOP: alive, but hung) is treated as lost once a call outlasts
    call_timeout: killed, replaced, its call retried; the rewards are the serial engine's."""
    cfg = _cfg("iid", "exact", iterations=1)
    seeds = [11, 12, 13, 14]
    want, _ = SerialEvaluator(_spec(tiny_model_dir, cfg), scoring).rewards(seeds, cfg.sigma)
    evaluator = RayEvaluator(_spec(tiny_model_dir, cfg), scoring, engines=2, call_timeout=8, retries=1)
    try:
        os.kill(evaluator.pids()[1], signal.SIGSTOP)
        got, _ = evaluator.rewards(seeds, cfg.sigma)
        assert evaluator.respawned == 1 and got == want
        os.kill(evaluator.pids()[0], signal.SIGSTOP)  # once more, with no retry left after the replacement's
        evaluator.retries = 0
        with pytest.raises(TimeoutError, match=r"engine 0 did not answer members within 8 s \(1 tries"):
            evaluator.rewards(seeds, cfg.sigma)
    finally:
        evaluator.close()
