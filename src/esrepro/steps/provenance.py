"""Steps: the run's provenance (a Workflow Run RO-Crate of the run, the DVC record of data and checkpoints, the
audit of a result back to its data, model, config and code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def main_ro_crate(out: str, workflow: list[str], config_files: list[str], inputs: list[str],
                  outputs: list[str], manifests: list[str], copy_max_bytes: int = 20_000_000,
                  headline: str | None = None) -> Path:
    """Write a Workflow Run RO-Crate of the run into ``out``; print a summary. ``headline``: the run's headline
    result (the claims table), which the crate's root names as its main result."""
    from esrepro.provenance.rocrate import export_crate

    path = export_crate(out, workflow, config_files, inputs, outputs, manifests,
                        copy_max_bytes=copy_max_bytes, headline=headline)
    graph = json.loads(path.read_text(encoding="utf-8"))["@graph"]
    copied = sum(1 for e in graph if "File" in e.get("@type", []) and not e["@id"].startswith("#"))
    print(f"{path}: {len(graph)} entities, {copied} files copied")
    return path


def main_dvc_record(paths: list[str], out: str, remote: str | None = None, push: bool = False,
                    root: str = ".") -> dict[str, Any]:
    """Record data and checkpoint folders with DVC (dvc add), optionally push; write a JSON summary.

    ``out`` lists each folder with its pointer file and DVC md5, size and file count, so a
    run's log says exactly which data state the committed pointer files name.
    """
    from esrepro.io import write_json
    from esrepro.provenance.dvc import _relative, push_pointers, read_pointer, record, run_dvc
    from esrepro.provenance.manifest import code_version, now, package_versions

    started = now()
    dvc_files = record(paths, root)
    pushed = False
    if push or remote:
        push_pointers(dvc_files, root, remote)
        pushed = True
    entries = []
    for rel, dvc_file in zip(paths, dvc_files, strict=True):
        out_entry = read_pointer(Path(root) / dvc_file)
        entries.append({"path": _relative(rel, Path(root)), "dvc_file": dvc_file,
                        **{k: out_entry.get(k) for k in ("md5", "size", "nfiles")}})
    summary = {
        "kind": "dvc_record",
        "recorded": entries,
        "pushed": pushed,
        "remote": remote,
        "code": code_version(),
        "packages": package_versions(("esrepro", "snakemake")),
        "dvc": run_dvc(["--version"], root).stdout.strip(),
        "started": started,
        "ended": now(),
        "next": "git add " + " ".join(dvc_files) + " && git commit && dvc push",
    }
    write_json(out, summary)
    print(json.dumps(entries, indent=2))
    return summary


def main_audit(target: str = "results/tables/claims.csv", root: str = ".") -> int:
    """Print the audit chain of ``target`` (default: the claims table, the run's headline); 0 when every file
    matches, 1 on a change or loss, 2 on error."""
    from esrepro.provenance.audit import AuditError, audit

    try:
        report = audit(target, root)
    except AuditError as exc:
        print(f"audit FAILED: {exc}", flush=True)
        return 2
    print(report.format())
    bad = report.first_failure
    if bad is None:
        print(f"audit ok: {report.target}", flush=True)
        return 0
    print(f"audit FAILED: {bad.describe()}", flush=True)
    return 1


def main_compare(golden: str, root: str = ".") -> int:
    """Print which outputs differ from the golden tree and where each difference arose; 0 same, 1 differ, 2 error."""
    from esrepro.provenance.audit import AuditError
    from esrepro.provenance.golden import compare

    try:
        result = compare(root, golden)
    except AuditError as exc:
        print(f"compare FAILED: {exc}", flush=True)
        return 2
    print(result.format())
    print("compare ok: every golden output is reproduced" if result.ok else "compare: outputs differ from golden",
          flush=True)
    return 0 if result.ok else 1


def main_golden(out: str, root: str = ".") -> int:
    """Write ``root``'s manifests and small recorded outputs as a golden tree into ``out`` (see esrepro.provenance.golden)."""
    from esrepro.provenance.golden import snapshot

    kept = snapshot(root, out)
    print(f"golden tree {out}: {len(kept)} files", flush=True)
    return 0
