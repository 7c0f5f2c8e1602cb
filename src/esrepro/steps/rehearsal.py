"""The rehearsal verb: the paper's DAG at toy size on this machine (esrepro.rehearsal.run)."""

from __future__ import annotations

from pathlib import Path

from esrepro.rehearsal.run import rehearse as run


def rehearse(slice_only: bool, targets: list[str], shared_data: str | None, jobs: int, local: bool) -> int:
    """Rehearse config/paper.yaml on this machine (config/rehearsal.yaml), all of it, its slice or only some
    ``targets``, and write its report."""
    return run(Path.cwd(), slice_only=slice_only, only=targets, shared_data=shared_data, jobs=jobs, slurm=not local)
