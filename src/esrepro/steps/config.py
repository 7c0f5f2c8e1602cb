"""Steps that run nothing: check config files, document every setting."""

from __future__ import annotations

import json
from pathlib import Path


def validate_files(configs: list[str]) -> None:
    """Check pipeline config files (and the registry and published numbers each names) without running anything."""
    from esrepro.config import read_config
    from esrepro.planning.load import load_pipeline

    for path in configs:
        load_pipeline(read_config(path), path)
        print(f"{path}: ok")


def print_options(block: str | None = None, markdown_out: bool = False, schema_dir: str | None = None) -> None:
    """Print the options of one block (or list the blocks); or all as Markdown; or write the JSON schemas."""
    from esrepro.settings.docs import BLOCKS, block_text, markdown, schemas

    if schema_dir:
        for name, schema in schemas().items():
            (Path(schema_dir) / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        return
    if markdown_out:
        print(markdown(), end="")
    elif block:
        print(block_text(block))
    else:
        print("\n".join(f"{name:<14} {where}" for name, _, where in BLOCKS))
