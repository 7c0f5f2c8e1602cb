"""The ``mirror-build`` and ``mirror-serve`` verbs: the local hub and URL mirror of a config's models and data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from esrepro.io import write_text
from esrepro.rehearsal.hub_mirror import MirrorServer


def mirror_build(mirror_root: str, mirror_config: str = "config/paper.yaml", shared_data: str | None = None) -> None:
    """Build the mirror of ``mirror_config`` at ``mirror_root`` (replicas, data copies and stand-ins, sources.yaml)."""
    from esrepro.rehearsal.build import build_mirror  # replicas: transformers and torch

    index = build_mirror(mirror_root, mirror_config, shared_data)
    for key, repo in index["repos"].items():
        print(f"{key}@{repo['commit']} ({repo['origin']}{', gated' if repo['gated'] else ''})")
    for url, rec in index["urls"].items():
        print(f"{url} ({rec['origin']})")
    print(f"stand-in pins: {Path(mirror_root) / 'sources.yaml'}")


def mirror_serve(mirror_root: str, port: int = 0, url_file: str | None = None, request_log: str | None = None) -> None:
    """Serve the mirror at ``mirror_root`` until killed; print its URL (and write it to ``url_file``)."""
    log = open(request_log, "a", encoding="utf-8") if request_log else None  # noqa: SIM115 (open while serving)
    server = MirrorServer(mirror_root, port=port, log_file=log)
    if url_file:
        write_text(url_file, server.url + "\n")
    print(json.dumps({"url": server.url, "HF_ENDPOINT": server.url, "ESREPRO_URL_MIRROR": server.url}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("mirror stopped", file=sys.stderr)
    finally:
        server.server_close()
        if log:
            log.close()
