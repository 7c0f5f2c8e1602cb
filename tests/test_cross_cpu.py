"""The tiny scale gives the same bits on AMD and Intel CPUs: its training steps run natively and under qemu-user.

qemu-user computes the instructions whose exact result the x86 specification leaves to the implementation
(approximate reciprocals and square roots) its own way, and presents another vendor's CPUID to the libraries
that dispatch on it (oneMKL, numpy, OpenBLAS). So an op whose bits differ natively and under qemu is not portable
across real Intel and AMD processors either. ``tests/cross_cpu_steps.py`` runs the warm start, ES, GRPO, PPO,
ESSA (LoRA SFT, SVD, CMA-ES) and KL steps at small shapes and prints each result's sha256; here it runs natively
and under an AMD and an Intel CPU model, in portable numerics, and every digest must agree. Without qemu-user
(``scripts/install-debs qemu``) the test skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from esrepro.runtime import numerics

REPO = Path(__file__).resolve().parents[1]
#: An AMD and an Intel CPU model that Debian 12's qemu (7.2) knows.
CPU_MODELS = ("EPYC-Rome-v2", "Icelake-Server-v6")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _portable_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in numerics.RECORDED}
    env = numerics.environment("portable", env)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), *site.getsitepackages()]))
    return env


def _steps(tmp_path: Path, cpu: str) -> subprocess.Popen:
    """Run the steps natively (``cpu`` "native") or under qemu's CPU model ``cpu``, into ``<cpu>.json``."""
    cmd = [sys.executable, str(REPO / "tests" / "cross_cpu_steps.py"), str(tmp_path / f"{cpu}.json")]
    if cpu != "native":
        cmd = [shutil.which("qemu-x86_64") or "qemu-x86_64", "-cpu", cpu, os.path.realpath(sys.executable), *cmd[1:]]
    log = open(tmp_path / f"{cpu}.log", "w")  # noqa: SIM115 - closed with the process below
    return subprocess.Popen(cmd, env=_portable_env(), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


@pytest.mark.slow
def test_training_steps_give_the_same_bits_natively_and_under_amd_and_intel_cpu_models(tmp_path):
    if platform.machine() != "x86_64":
        pytest.skip("x86-64 only: the golden outputs are x86-64 ones")
    if shutil.which("qemu-x86_64") is None:
        reason = "qemu-user is not installed (scripts/install-debs qemu)"
        pytest.fail(f"CI=true: {reason}") if IN_CI else pytest.skip(reason)
    known = subprocess.run(["qemu-x86_64", "-cpu", "help"], capture_output=True, text=True).stdout
    assert all(re.search(rf"\b{re.escape(c)}\b", known) for c in CPU_MODELS), f"qemu lacks one of {CPU_MODELS}"
    runs = {cpu: _steps(tmp_path, cpu) for cpu in ("native", *CPU_MODELS)}
    for cpu, proc in runs.items():
        assert proc.wait(timeout=1200) == 0, f"{cpu} run failed:\n{(tmp_path / f'{cpu}.log').read_text()[-3000:]}"
    digests = {cpu: json.loads((tmp_path / f"{cpu}.json").read_text()) for cpu in runs}
    native = digests["native"]
    assert len(native) >= 10 and {"warm_start_weights", "es_weights", "grpo_weights", "grpo_advantages",
                                  "ppo_weights", "essa_adapter", "essa_cma", "kl_per_token"} <= set(native)
    differ = {cpu: sorted(k for k in native if d.get(k) != native[k]) for cpu, d in digests.items() if cpu != "native"}
    assert not any(differ.values()), f"steps whose bits differ from the native run's: {differ}"


#: Calls whose CPU kernel is oneMKL's vector math (or that pick an AdamW taking it): numerics.adamw / numerics.sqrt.
NON_PORTABLE = re.compile(r"torch\.optim\.AdamW\(|torch\.sqrt\(|\.sqrt\(\)|\.pow\(0?\.5\)")


def test_library_code_takes_no_cpu_dependent_square_root():
    """Tensor square roots and AdamW go through esrepro.runtime.numerics (``math.sqrt``, ``np.sqrt``: exact, not matched)."""
    found = []
    for f in sorted((REPO / "src" / "esrepro").rglob("*.py")):
        if f.name == "numerics.py":
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if NON_PORTABLE.search(code):
                found.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    assert not found, "use esrepro.runtime.numerics.adamw / numerics.sqrt:\n" + "\n".join(found)


def test_portable_square_root_and_adamw():
    x = torch.rand(4096, dtype=torch.float32) + 0.01
    assert torch.equal(numerics.sqrt(x), torch.from_numpy(np.sqrt(x.numpy())))
    half = x[:8].to(torch.bfloat16)
    assert numerics.sqrt(half).dtype == torch.bfloat16
    assert torch.equal(numerics.sqrt(half), torch.from_numpy(np.sqrt(half.double().numpy())).to(torch.bfloat16))
    opt = numerics.adamw([torch.nn.Parameter(torch.zeros(3))], lr=1e-3, weight_decay=0.0)
    assert opt.defaults["fused"] is True


def test_grpo_scales_advantages_by_a_correctly_rounded_std():
    """TRL's GRPO takes its rewards' standard deviation with torch.sqrt (oneMKL's vector math on CPU, whose bits
    follow the CPU); esrepro's GRPO gives it numerics.nanstd instead: the same function, correctly rounded."""
    from trl.trainer import grpo_trainer
    from trl.trainer.utils import nanstd as trl_nanstd

    numerics.portable_trl()
    assert grpo_trainer.nanstd is numerics.nanstd
    rewards = torch.from_numpy(np.random.default_rng(0).choice([0.0, 0.1, 1.0], size=128).astype(np.float32))
    for x, dim in ((rewards.view(-1, 8), 1), (rewards, None), (rewards.view(-1, 8), (1,))):
        ours, theirs = numerics.nanstd(x, dim=dim), trl_nanstd(x, dim=dim)
        mean = torch.nanmean(x, dim=dim, keepdim=True)
        var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True) * (x.numel() / (x.numel() - 1) if dim is None
                                                                       else 8 / 7)
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, rtol=1e-6, atol=0)
        assert torch.equal(ours.reshape(-1), torch.from_numpy(np.sqrt(var.numpy())).reshape(-1))
    assert torch.isnan(numerics.nanstd(torch.tensor([1.0])))  # one value: NaN, as TRL's
    assert torch.isnan(numerics.nanstd(torch.tensor([[1.0, float("nan")], [2.0, 4.0]]), dim=1)[0])


def test_portable_mode_pins_numpy_and_openblas():
    """In portable mode numpy dispatches to no SIMD target and OpenBLAS runs its Nehalem kernels."""
    code = ("import numpy as np; from esrepro.runtime import numerics; print(numerics.numpy_dispatch()); "
            "np.linalg.eigh(np.eye(3))")
    env = {**_portable_env(), "OPENBLAS_VERBOSE": "2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[0] == "[]"
    assert "Core: Nehalem" in proc.stdout + proc.stderr


INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 8
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512_fp16 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
"""


def test_cpu_record_names_vendor_model_and_dispatch_flags():
    cpu = numerics.cpu(INTEL)
    assert cpu == {"vendor": "GenuineIntel", "model_name": "Intel(R) Xeon(R) Processor",
                   "family_model_stepping": "6/143/8", "flags": "sse4_2 avx fma avx2 avx512f avx512bw avx512_fp16 "
                                                               "amx_tile"}
    assert numerics.describe_cpu(cpu).startswith("Intel(R) Xeon(R) Processor (GenuineIntel, family/model/stepping")
    here = numerics.record()["cpu"]
    assert here["model_name"] and (platform.machine() != "x86_64" or here["vendor"])


def test_compare_names_both_trees_cpus_where_a_step_differs(tmp_path):
    """A model build that differs between an AMD and an Intel tree: compare says it arose there and names both CPUs."""
    from esrepro.provenance.golden import compare

    amd = {"vendor": "AuthenticAMD", "model_name": "AMD EPYC", "family_model_stepping": "25/17/1",
           "flags": "avx2 avx512f"}
    intel = numerics.cpu(INTEL)
    for name, cpu, weights in (("gold", amd, "a"), ("here", intel, "b")):
        model = tmp_path / name / "results" / "models" / "tiny" / "base"
        model.mkdir(parents=True)
        (model / "model.safetensors").write_text(weights)
        manifest = {"kind": "build_tiny", "inputs": {}, "numerics": {"mode": "portable", "cpu": cpu},
                    "outputs": {"model": {"path": "results/models/tiny/base/model.safetensors",
                                          "sha256": weights * 64}}}
        (model / "manifest.json").write_text(json.dumps(manifest))
    result = compare(tmp_path / "here", tmp_path / "gold")
    text = result.format()
    assert not result.ok and "model build: [build_tiny] results/models/tiny/base/manifest.json" in text
    assert f"cpu (golden): {numerics.describe_cpu(amd)}" in text
    assert f"cpu (here): {numerics.describe_cpu(intel)}" in text
    assert "numerics.cpu.vendor: 'AuthenticAMD' (golden) vs 'GenuineIntel' (here)" in text
