"""Provenance: what made every output and whether it still holds.

- :mod:`~esrepro.provenance.manifest`: each step's manifest (inputs' and outputs' sha256, settings, code,
  packages, host, numerics) and the check of its inputs;
- :mod:`~esrepro.provenance.audit`: an output traced back through the manifests to data, code and model;
- :mod:`~esrepro.provenance.golden`: a run compared with the committed golden outputs;
- :mod:`~esrepro.provenance.dvc`: DVC pointers for data and checkpoints;
- :mod:`~esrepro.provenance.rocrate`: the RO-Crate of a finished run.
"""

from pathlib import Path

#: The repository this package runs from (src layout): where ``.venv-dvc`` is made and whose git commit the
#: manifests record.
REPO = Path(__file__).resolve().parents[3]
