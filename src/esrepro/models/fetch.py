"""Downloading a hub model at a revision; a branch name is resolved to its commit and recorded."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from esrepro.io import atomic_path

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def fetch_hub_model(model: str, hub_id: str, revision: str, out: str | Path) -> dict[str, Any]:
    """Download ``hub_id`` at ``revision`` into ``out`` atomically; returns the resolved commit.

    A revision that is not a 40-hex commit (e.g. ``main``) is resolved first and a warning
    says the model is not pinned; the commit actually downloaded is returned either way.
    """
    from huggingface_hub import HfApi, snapshot_download

    commit = revision
    try:
        if not COMMIT.match(revision):
            commit = HfApi().model_info(hub_id, revision=revision).sha
            print(f"WARNING: model {model!r}: {hub_id}@{revision} is not a pinned commit; resolved to {commit} "
                  f"(put revision: {commit} in the registry to pin it)", file=sys.stderr, flush=True)
        with atomic_path(out, is_dir=True) as tmp:
            snapshot_download(hub_id, revision=commit, local_dir=tmp)
    except Exception as exc:  # the hub client raises many types; name the model
        raise OSError(f"model {model!r}: could not fetch {hub_id}@{revision}: {exc}") from exc
    return {"hub_id": hub_id, "revision": revision, "commit": commit}
