"""A Workflow Run RO-Crate of a pipeline run (https://w3id.org/ro/wfrun/workflow/0.5).

The crate (``ro-crate-metadata.json`` and the files it carries) describes:

- the Snakefile as the main ``ComputationalWorkflow`` (language Snakemake, with its
  version), the rule files, schemas and environment as its parts, and the software it
  ran with (esrepro, snakemake, torch, ... as ``SoftwareApplication``);
- one ``CreateAction`` (the run): ``instrument`` the workflow, ``object`` the config
  files and datasets, ``result`` the tables, figures and reports, start and end times
  from the step manifests;
- every step manifest (inputs' sha256, settings, code, host) as a file ``about`` the run.

Small files are copied into the crate at their repository-relative paths, so the crate
is a self-contained package of the workflow, its settings and its results. Folders
(datasets, checkpoints) and files over ``copy_max_bytes`` are not copied: they are
described by contextual entities ``#<repository path>`` with size, sha256 (from the
manifests) and the DVC pointer file that restores them (``dvc pull``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from esrepro.io import atomic_path, read_json, sha256_file

PathLike = str | os.PathLike

#: RO-Crate 1.1 with Workflow Run Crate 0.5 (and Workflow RO-Crate 1.0): the newest combination
#: that rocrate-validator (0.13) has profiles for; WRROC 0.6 moves to RO-Crate 1.3.
RO_CRATE_VERSION = "1.1"
WRROC_VERSION = "0.5"
PROCESS_RUN_CRATE = f"https://w3id.org/ro/wfrun/process/{WRROC_VERSION}"
WORKFLOW_RUN_CRATE = f"https://w3id.org/ro/wfrun/workflow/{WRROC_VERSION}"
WORKFLOW_RO_CRATE = "https://w3id.org/workflowhub/workflow-ro-crate/1.0"
WFRUN_CONTEXT = "https://w3id.org/ro/terms/workflow-run"
RUN_ID = "#run"
LICENSE = "https://spdx.org/licenses/MIT"
#: Packages recorded as the software the run used.
SOFTWARE = ("esrepro", "snakemake", "torch", "transformers", "tokenizers", "safetensors", "numpy", "pandas",
            "math-verify", "dvc", "papermill", "rocrate")

#: File suffix -> IANA media type (encodingFormat).
MEDIA_TYPES = {
    ".csv": "text/csv", ".md": "text/markdown", ".tex": "application/x-tex", ".png": "image/png",
    ".pdf": "application/pdf", ".json": "application/json", ".jsonl": "application/jsonl",
    ".yaml": "application/yaml", ".yml": "application/yaml", ".html": "text/html",
    ".ipynb": "application/x-ipynb+json", ".smk": "text/x-snakemake", ".rst": "text/x-rst",
    ".py": "text/x-python", ".txt": "text/plain",
}


def _rel(path: PathLike, root: Path) -> str:
    p = Path(path)
    full = (p if p.is_absolute() else root / p).resolve()
    try:
        return full.relative_to(root.resolve()).as_posix()
    except ValueError as exc:
        raise ValueError(f"{path}: not inside {root}") from exc


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _dvc_pointer(rel: str, root: Path) -> str | None:
    """The ``.dvc`` file that tracks ``rel`` or one of its parent folders, if any."""
    parts = Path(rel).parts
    for i in range(len(parts), 0, -1):
        pointer = Path(*parts[:i]).as_posix() + ".dvc"
        if (root / pointer).is_file():
            return pointer
    return None


def _manifest_index(manifests: Iterable[str], root: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """sha256 of every path the manifests name, and their start and end times."""
    hashes: dict[str, str] = {}
    starts, ends = [], []
    for m in manifests:
        doc = read_json(root / m)
        for section in ("inputs", "outputs"):
            for entry in (doc.get(section) or {}).values():
                if isinstance(entry, dict) and entry.get("path") and entry.get("sha256"):
                    hashes[Path(entry["path"]).as_posix().rstrip("/")] = entry["sha256"]
        if doc.get("started"):
            starts.append(doc["started"])
        if doc.get("ended"):
            ends.append(doc["ended"])
    return hashes, starts, ends


def _readme(main: str, config_files: list[str], manifests: list[str], headline: str | None = None) -> str:
    return "\n".join([
        "# esrepro: a pipeline run as a Workflow Run RO-Crate",
        "",
        "`ro-crate-metadata.json` describes one run of the esrepro Snakemake pipeline, which reproduces",
        "*Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning* (arXiv 2509.24372).",
        "",
        f"- Workflow: `{main}` (the main workflow) and the rule files, schemas and environment it includes.",
        "- Settings: " + ", ".join(f"`{c}`" for c in config_files) + ".",
        "- The run (`#run`): its `object` (configuration, datasets) and `result` (tables, figures, reports).",
        *([f"- The headline: `{headline}`, the papers' claims tested by this run, each with its evidence and a "
           "computed verdict."] if headline else []),
        f"- {len(manifests)} step manifests: each step's inputs and outputs with sha256, settings, git commit,",
        "  package versions, host and times.",
        "",
        "Small files are copied here at their repository paths. Datasets and checkpoints are not: entities",
        "`#<path>` give their size, sha256 and the DVC pointer file that restores them (`dvc pull`).",
        "",
    ])


class _Builder:
    def __init__(self, crate: Any, root: Path, copy_max_bytes: int, hashes: dict[str, str]) -> None:
        self.crate, self.root, self.copy_max_bytes, self.hashes = crate, root, copy_max_bytes, hashes
        self.entities: dict[str, Any] = {}

    def add(self, path: PathLike, properties: dict[str, Any] | None = None) -> Any:
        """A data entity for a small file (copied), else a contextual entity (referenced)."""
        from rocrate.model.contextentity import ContextEntity

        try:
            rel = _rel(path, self.root)
        except ValueError:  # e.g. a --configfile outside the repository: copied under external/
            rel = f"external/{Path(path).name}"
            if rel not in self.entities and Path(path).is_file():
                entity = self.crate.add_file(Path(path), dest_path=rel, properties={
                    "name": Path(path).name, "description": f"outside the repository: {path}",
                    "contentSize": str(Path(path).stat().st_size), "sha256": sha256_file(path),
                    **({"encodingFormat": MEDIA_TYPES[Path(path).suffix]} if Path(path).suffix in MEDIA_TYPES else {}),
                    **(properties or {})})
                self.entities[rel] = entity
        if rel in self.entities:
            return self.entities[rel]
        full = self.root / rel
        if not full.exists():
            raise FileNotFoundError(f"cannot add {rel} to the crate: not found")
        props = {"name": rel, **(properties or {})}
        media = MEDIA_TYPES.get(full.suffix)
        if full.is_file() and media:
            props.setdefault("encodingFormat", media)
        if full.is_file() and full.stat().st_size <= self.copy_max_bytes:
            props.update(contentSize=str(full.stat().st_size), sha256=sha256_file(full))
            entity = self.crate.add_file(full, dest_path=rel, properties=props)
        else:
            kind = "Dataset" if full.is_dir() else "File"
            pointer = _dvc_pointer(rel, self.root)
            where = f"In the repository at `{rel}`" + (
                f", tracked by DVC in `{pointer}` (restore with `dvc pull {pointer}`)" if pointer else "")
            props.update({"@type": kind, "contentSize": str(_size(full)),
                          "description": f"Not copied into this crate ({kind.lower()}). {where}."})
            if rel in self.hashes:
                props["sha256"] = self.hashes[rel]
            entity = self.crate.add(ContextEntity(self.crate, f"#{rel}", properties=props))
        self.entities[rel] = entity
        return entity


def export_crate(out_dir: PathLike, workflow_files: list[str], config_files: list[str], inputs: list[str],
                 outputs: list[str], manifests: list[str], *, root: PathLike = ".",
                 copy_max_bytes: int = 20_000_000, name: str | None = None,
                 description: str | None = None, headline: str | None = None) -> Path:
    """Write a Workflow Run RO-Crate into ``out_dir``; return the path of its metadata file.

    ``workflow_files[0]`` is the main workflow (the Snakefile); all paths are relative to
    ``root`` (the repository). ``headline`` (one of ``outputs``, the claims table) is the run's headline: the first of
    the run's results, described as such, and the crate's ``about``. ``out_dir`` is replaced atomically. The output is
    deterministic: no wall-clock time is read (the run's times come from the manifests).
    """
    from rocrate.model.contextentity import ContextEntity
    from rocrate.model.softwareapplication import SoftwareApplication
    from rocrate.rocrate import ROCrate

    from esrepro.provenance.manifest import code_version, package_versions

    if not workflow_files:
        raise ValueError("export_crate: workflow_files must name the main workflow first")
    root = Path(root)
    hashes, starts, ends = _manifest_index(manifests, root)
    crate = ROCrate(version=RO_CRATE_VERSION)
    crate.metadata.extra_contexts.append(WFRUN_CONTEXT)
    b = _Builder(crate, root, copy_max_bytes, hashes)

    versions = package_versions(SOFTWARE)
    code = code_version(root)
    main_rel = _rel(workflow_files[0], root)
    workflow = crate.add_workflow(
        root / main_rel, dest_path=main_rel, main=True, lang="snakemake", lang_version=versions.get("snakemake"),
        properties={"name": "esrepro pipeline (Snakemake)",
                    "description": "Reproduction pipeline of 'Evolution Strategies at Scale' (arXiv 2509.24372)",
                    "encodingFormat": "text/x-snakemake", "sha256": sha256_file(root / main_rel),
                    **({"version": code["git_commit"] + ("-dirty" if code["dirty"] else "")}
                       if code["git_commit"] else {})},
    )
    b.entities[main_rel] = workflow
    parts = [b.add(p) for p in workflow_files[1:]]
    if parts:
        workflow["hasPart"] = parts
    software = []
    for pkg, version in versions.items():
        if version is None:
            continue
        sid = f"https://pypi.org/project/{pkg}/{version}/" if pkg != "esrepro" else "#software/esrepro"
        software.append(crate.add(SoftwareApplication(crate, sid, properties={
            "name": pkg, "softwareVersion": version,
            **({"url": f"https://pypi.org/project/{pkg}/"} if pkg != "esrepro" else {}),
        })))
    workflow["softwareRequirements"] = software

    configs = [b.add(p, {"description": "configuration file"}) for p in config_files]
    objects = configs + [b.add(p) for p in inputs]
    if headline is not None:
        if headline not in outputs:
            raise ValueError(f"export_crate: the headline {headline} is not one of the outputs")
        outputs = [headline, *[p for p in outputs if p != headline]]
        b.add(headline, {"description": "The headline: each claim of the papers, the paper's evidence and this "
                                        "run's, an interval and a verdict computed by a stated rule "
                                        "(holds, does not hold, not testable)"})
    results = [b.add(p) for p in outputs]

    action_props: dict[str, Any] = {
        "@type": "CreateAction",
        "name": "Run of the esrepro Snakemake pipeline",
        "description": "One `snakemake` run: configuration and datasets in, tables, figures and reports out.",
        "actionStatus": "http://schema.org/CompletedActionStatus",
    }
    if starts:
        action_props["startTime"] = min(starts)
    if ends:
        action_props["endTime"] = max(ends)
    action = crate.add_action(workflow, identifier=RUN_ID, object=objects, result=results, properties=action_props)
    crate.root_dataset["mentions"] = action
    if headline is not None:
        crate.root_dataset["about"] = results[0]
    for m in manifests:
        b.add(m, {"about": action, "description": "esrepro step manifest: inputs' and outputs' sha256, settings, "
                                                   "git commit, package versions, host, start and end times",
                  "encodingFormat": "application/json"})

    for profile, label, version in ((PROCESS_RUN_CRATE, "Process Run Crate", WRROC_VERSION),
                                    (WORKFLOW_RUN_CRATE, "Workflow Run Crate", WRROC_VERSION),
                                    (WORKFLOW_RO_CRATE, "Workflow RO-Crate", "1.0")):
        entity = crate.get(profile) or crate.add(ContextEntity(crate, profile, properties={
            "@type": "CreativeWork", "name": label, "version": version}))
        crate.root_dataset.append_to("conformsTo", entity)
    readme = _readme(main_rel, config_files, manifests, headline).encode()
    crate.add_file(io.BytesIO(readme), dest_path="README.md", properties={
        "about": crate.root_dataset, "encodingFormat": "text/markdown", "name": "About this crate",
        "contentSize": str(len(readme))})
    crate.root_dataset["name"] = name or "esrepro: Evolution Strategies at Scale, a pipeline run"
    crate.root_dataset["description"] = description or (
        "Workflow Run RO-Crate of one run of the esrepro pipeline: the Snakemake workflow, its configuration, "
        "the datasets it read, the tables, figures and reports it wrote, and each step's manifest.")
    crate.root_dataset["license"] = crate.add(ContextEntity(crate, LICENSE, properties={
        "@type": "CreativeWork", "name": "MIT License"}))
    crate.root_dataset["datePublished"] = action_props.get("endTime") or "1970-01-01T00:00:00+00:00"

    out_dir = Path(out_dir)
    with atomic_path(out_dir, is_dir=True) as tmp:
        crate.write(tmp)
    return out_dir / "ro-crate-metadata.json"
