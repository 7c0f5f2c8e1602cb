"""ESSA's LoRA SFT on one process or on one process per GPU.

An ESSA job is one process (it drives the Ray engines), but its SFT stage trains on every GPU of the job: with
``$ESREPRO_TRAIN_PROCESSES`` = G > 1 the job runs the SFT as G processes under ``torchrun`` (this module's
:func:`main` in each, :mod:`esrepro.runtime.distributed` for their places), waits for them, and reads back the
summary the main process wrote beside the adapter; each process takes ``sft_prompts_per_step / G`` examples
per step, so an optimiser step sees ``sft_prompts_per_step`` examples at any GPU count. With G = 1 (the
default) the SFT runs in the job's own process, as it always has on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from esrepro.settings.methods import DEFAULT_LORA_TARGETS

#: The number of SFT processes (one per GPU of the job); the workflow sets it from the registry's GPU count.
PROCESSES_ENV = "ESREPRO_TRAIN_PROCESSES"


@dataclass(frozen=True)
class SFTJob:
    """Everything :func:`esrepro.essa.lora.sft_lora` needs, as JSON for the launched processes."""

    model_dir: str
    pairs: list[tuple[str, str]]
    rank: int
    alpha: float
    epochs: int
    learning_rate: float
    batch_size: int
    seed: int
    out_dir: str
    dtype: str = "float32"
    targets: str | list[str] = DEFAULT_LORA_TARGETS  # the ESSA setting lora_targets: attention, all or names
    extra: dict = field(default_factory=dict)  # further sft_lora keywords (max_length)

    def run_here(self) -> dict:
        """The SFT in this process (one of a launched group, or the whole of it)."""
        from esrepro.essa.lora import sft_lora

        return sft_lora(self.model_dir, [tuple(p) for p in self.pairs], rank=self.rank, alpha=self.alpha,
                        epochs=self.epochs, learning_rate=self.learning_rate, batch_size=self.batch_size,
                        seed=self.seed, out_dir=self.out_dir, dtype=self.dtype, targets=self.targets, **self.extra)


def sft_processes() -> int:
    """How many processes the SFT runs in (``$ESREPRO_TRAIN_PROCESSES``, default 1)."""
    value = os.environ.get(PROCESSES_ENV, "").strip()
    if not value:
        return 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"${PROCESSES_ENV}={value!r}: expected a positive number of SFT processes (one per GPU)")
    return n


def sft_dtype(registry_dtype: str, device: str) -> str:
    """The dtype the SFT base loads in: the registry's on CUDA (bf16 for the papers' models), float32 on CPU."""
    return registry_dtype if device.startswith("cuda") else "float32"


def launch_command(job_file: Path, processes: int) -> list[str]:
    """``torchrun`` (this interpreter's) starting ``processes`` SFT processes on this node for ``job_file``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(processes), "--no-python",
            sys.executable, "-m", "esrepro.essa.sft_launch", str(job_file)]


def run_sft(job: SFTJob, processes: int = 1, timeout: float | None = None) -> dict:
    """Run ``job`` in this process (``processes`` = 1) or in ``processes`` launched ones; the SFT summary.

    A launched group's failure raises RuntimeError with its exit status (its output went to this job's log).
    """
    if processes < 1:
        raise ValueError(f"SFT processes must be >= 1, got {processes}")
    if processes == 1:
        if _visible_gpus() > 1:
            raise RuntimeError(f"the SFT would run in one process that sees {_visible_gpus()} GPUs (nn.DataParallel, "
                               f"a batch {_visible_gpus()} times the setting): set ${PROCESSES_ENV} to the job's GPU "
                               "count")
        return job.run_here()
    from esrepro.essa.lora import SUMMARY
    from esrepro.runtime.distributed import split_batch

    split_batch(job.batch_size, processes, "sft_prompts_per_step")  # before any process starts
    with tempfile.TemporaryDirectory(prefix="essa_sft_job_") as scratch:
        job_file = Path(scratch) / "job.json"
        job_file.write_text(json.dumps(asdict(job)))
        # the job's environment (numerics mode, thread counts) goes to every process
        proc = subprocess.run(launch_command(job_file, processes), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the LoRA SFT in {processes} processes (torchrun) failed with exit status "
                           f"{proc.returncode}; their output is above in this log")
    return json.loads((Path(job.out_dir) / SUMMARY).read_text())


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: Sequence[str] | None = None) -> int:
    """One launched SFT process: ``python -m esrepro.essa.sft_launch JOB.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m esrepro.essa.sft_launch JOB.json", file=sys.stderr)
        return 2
    SFTJob(**json.loads(Path(args[0]).read_text())).run_here()
    return 0


if __name__ == "__main__":
    sys.exit(main())
