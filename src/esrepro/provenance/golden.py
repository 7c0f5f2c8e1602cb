"""Compare a results tree with a golden one: which outputs differ, and where the first difference arose.

Both trees are read from their manifests (``data/`` and ``results/``, as ``esrepro audit``
indexes them), matched by the manifest's path. A step *differs* when an output it recorded
has another sha256 than the golden step's. Following a differing step's inputs whose
sha256 differ back to their producers leads to the steps where the difference arose: a
step whose outputs differ although every input is the same (or a source input, such as a
config file, with no producer). For those, what the two manifests say about settings,
code, packages, threads and CPU numerics (the CPU's vendor, model and instruction-set flags
among them) is set side by side, so the cause can be read off; the CPUs each tree's manifests
record are named whenever a step differs.

Recorded hashes are compared first (``esrepro audit`` checks that a tree's files still match
their manifests). Where two hashes differ, JSON, JSONL and CSV files are read and compared
without their wall-time fields (``seconds_*``, ``wallclock``, ...), which no two runs share;
renderings (PNG, PDF, HTML, notebooks) are not compared: their numbers are in the CSV and
JSON beside them. For a differing CSV table the first differing cell is shown.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esrepro.provenance.audit import AuditError, _norm, _producer, index_manifests
from esrepro.runtime.numerics import describe_cpu

#: The stage of each manifest kind, in pipeline order (an unknown kind is a report).
STAGES: dict[str, str] = {
    "prepare_data": "data",
    "build_tiny": "model build", "fetch_model": "model build", "local_model": "model build",
    "train": "run", "select": "run",
    "evaluate": "evaluation",
    "kl": "kl", "param_shift_histogram": "kl",
}
ORDER = ["source", "data", "model build", "run", "evaluation", "kl", "report"]


#: Fields (JSON keys, CSV columns) that hold wall time, throughput or a ratio of wall times: left out of the
#: comparison.
VOLATILE = re.compile(r"seconds|per_second|runtime|wall|elapsed|_time$|^time_|speedup|^(started|ended)$")
#: Renderings, not compared.
RENDERINGS = (".png", ".pdf", ".svg", ".html", ".ipynb")
#: A table's other renderings: compared through the CSV beside them (which may hold volatile columns).
TABLE_RENDERINGS = (".md", ".tex")


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not VOLATILE.search(str(k))}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _jsonl(path: Path) -> list[Any]:
    return [_strip(json.loads(line)) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _rows(path: Path) -> list[list[str]]:
    """A CSV file's rows without its volatile columns."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    keep = [j for j, name in enumerate(rows[0] if rows else []) if not VOLATILE.search(name)]
    return [[r[j] for j in keep if j < len(r)] for r in rows]


def same_content(here: Path, gold: Path) -> bool:
    """Whether two files whose sha256 differ hold the same content once wall times are left out
    (JSON, JSONL, CSV; a table's Markdown and LaTeX through the CSV beside them), or are renderings, which are not
    compared; other files differ."""
    if here.suffix in RENDERINGS and gold.suffix in RENDERINGS:
        return True
    if here.suffix in TABLE_RENDERINGS and here.suffix == gold.suffix:  # a table's Markdown or LaTeX: its CSV decides
        here_csv, gold_csv = here.with_suffix(".csv"), gold.with_suffix(".csv")
        if here_csv.is_file() and gold_csv.is_file():
            return same_content(here_csv, gold_csv)
    if not (here.is_file() and gold.is_file()) or here.suffix != gold.suffix:
        return False
    try:
        if here.suffix == ".json":
            return _strip(json.loads(here.read_text("utf-8"))) == _strip(json.loads(gold.read_text("utf-8")))
        if here.suffix == ".jsonl":
            return _jsonl(here) == _jsonl(gold)
        if here.suffix == ".csv":
            return _rows(here) == _rows(gold)
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):
        return False
    return False


def stage_of(kind: str) -> str:
    return STAGES.get(kind, "report")


@dataclass
class StepDiff:
    """A manifest whose recorded outputs differ from the golden one's (or that one tree lacks)."""

    manifest: str
    kind: str
    outputs: list[str] = field(default_factory=list)  # names of the outputs whose sha256 differ
    inputs: list[str] = field(default_factory=list)   # names of the inputs whose sha256 differ
    presence: str = "both"  # "both", "missing" (only golden has it) or "extra" (only here)
    why: list[str] = field(default_factory=list)      # what the two manifests say differently
    origins: list[str] = field(default_factory=list)  # where its difference arose (manifests or "source:<path>")
    cells: list[str] = field(default_factory=list)    # first differing cell of each differing CSV output

    @property
    def stage(self) -> str:
        return stage_of(self.kind)

    @property
    def is_origin(self) -> bool:
        return self.presence == "both" and bool(self.outputs) and not self.inputs


@dataclass
class Comparison:
    root: str
    golden: str
    same: list[str] = field(default_factory=list)
    diffs: dict[str, StepDiff] = field(default_factory=dict)
    sources: dict[str, list[str]] = field(default_factory=dict)  # differing source inputs -> manifests reading them
    cpus: dict[str, list[str]] = field(default_factory=dict)  # "golden" / "here" -> the CPUs their manifests record

    @property
    def ok(self) -> bool:
        return not any(d.presence != "extra" for d in self.diffs.values())

    def first_differences(self) -> list[StepDiff | str]:
        """Where differences arose, upstream first: origin steps and differing source inputs."""
        firsts: list[StepDiff | str] = [d for d in self.diffs.values() if d.is_origin]
        firsts.sort(key=lambda d: (ORDER.index(d.stage), d.manifest))
        return [*(f"source:{p}" for p in sorted(self.sources)), *firsts]

    def format(self) -> str:
        lines = [f"compare {self.root} with golden {self.golden}"]
        differing = sorted((d for d in self.diffs.values() if d.presence == "both"),
                           key=lambda d: (ORDER.index(d.stage), d.manifest))
        for d in differing:
            origin = "arose here" if d.is_origin else "from " + ", ".join(_label(o, self.diffs) for o in d.origins)
            lines.append(f"DIFFER  [{d.kind}] {d.manifest} ({d.stage}): {', '.join(d.outputs)}  -- {origin}")
            lines.extend(f"          {c}" for c in d.cells)
        for d in sorted(self.diffs.values(), key=lambda d: d.manifest):
            if d.presence == "missing":
                lines.append(f"MISSING [{d.kind}] {d.manifest} ({d.stage}): in golden only")
            elif d.presence == "extra":
                lines.append(f"extra   [{d.kind}] {d.manifest} ({d.stage}): here only (not compared)")
        firsts = self.first_differences()
        if any(d.presence == "both" for d in self.diffs.values()):
            for side in ("golden", "here"):
                lines.append(f"cpu ({side}): " + "; ".join(self.cpus.get(side) or ["not recorded"]))
        if firsts:
            lines.append("first differences (outputs differ, inputs the same):")
            for f in firsts:
                if isinstance(f, str):
                    path = f.split(":", 1)[1]
                    lines.append(f"  source input {path} differs (read by {', '.join(self.sources[path])})")
                    continue
                lines.append(f"  {f.stage}: [{f.kind}] {f.manifest}: {', '.join(f.outputs)}")
                lines.extend(f"      {w}" for w in (f.why or ["the manifests record the same settings, code, "
                                                               "packages and numerics"]))
        n_diff = sum(d.presence == "both" for d in self.diffs.values())
        n_missing = sum(d.presence == "missing" for d in self.diffs.values())
        lines.append(f"{len(self.same) + n_diff + n_missing} golden steps: {len(self.same)} same, {n_diff} differ, "
                     f"{n_missing} missing")
        return "\n".join(lines)


def _label(origin: str, diffs: dict[str, StepDiff]) -> str:
    if origin.startswith("source:"):
        return f"source input {origin.split(':', 1)[1]}"
    d = diffs[origin]
    return f"{d.stage} ({origin})"


def _records(m: dict[str, Any], role: str, root: Path) -> dict[str, tuple[str, str]]:
    """``{name: (normalised path, sha256)}`` of a manifest's outputs or inputs."""
    return {name: (_norm(rec.get("path", ""), root), rec.get("sha256", ""))
            for name, rec in (m.get(role) or {}).items()}


def _at(root: Path, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else root / path


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


#: What explains a difference: each manifest section compared, and the keys of it that matter.
EXPLAIN = ("settings", "code.git_commit", "code.dirty", "packages", "numerics", "host.torch_threads",
           "host.accelerator", "device", "seed")


def explain(here: dict[str, Any], gold: dict[str, Any]) -> list[str]:
    """What two manifests of the same step record differently (``key: golden value vs this value``)."""
    a, b = _flat(gold), _flat(here)
    out = []
    for key in sorted(set(a) | set(b)):
        if not any(key == s or key.startswith(s + ".") for s in EXPLAIN):
            continue
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key, '-')!r} (golden) vs {b.get(key, '-')!r} (here)")
    return out


def first_cell(here: Path, gold: Path) -> str | None:
    """The first differing cell of two CSV files (``row N, column C: golden vs here``), or None."""
    try:
        a, b = _rows(gold), _rows(here)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    header = a[0] if a else []
    for i in range(max(len(a), len(b))):
        ra, rb = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        if ra == rb:
            continue
        if ra is None or rb is None:
            return f"{here.name}: row {i} only in {'golden' if rb is None else 'this tree'}"
        for j in range(max(len(ra), len(rb))):
            va, vb = (ra[j] if j < len(ra) else ""), (rb[j] if j < len(rb) else "")
            if va != vb:
                col = header[j] if j < len(header) and i > 0 else str(j)
                key = f" ({ra[0]})" if i > 0 and ra else ""
                return f"{here.name}: row {i}{key}, column {col}: {va!r} (golden) vs {vb!r} (here)"
    return None


def recorded_cpus(manifests: dict[str, dict[str, Any]]) -> list[str]:
    """The distinct CPUs (one line each, :func:`esrepro.runtime.numerics.describe_cpu`) that ``manifests`` record."""
    found = {describe_cpu(cpu) for m in manifests.values()
             if isinstance(cpu := (m.get("numerics") or {}).get("cpu"), dict)}
    return sorted(found)


def compare(root: str | Path = ".", golden: str | Path = "golden") -> Comparison:
    """Compare the manifests under ``root`` with those under ``golden`` (see the module's docstring)."""
    root, golden = Path(root), Path(golden)
    if not golden.is_dir():
        raise AuditError(f"golden tree {golden} is not a directory")
    here_m, here_producers = index_manifests(root)
    gold_m, _ = index_manifests(golden)
    if not gold_m:
        raise AuditError(f"no manifests under {golden} (searched its data/ and results/)")
    result = Comparison(root=str(root), golden=str(golden),
                        cpus={"golden": recorded_cpus(gold_m), "here": recorded_cpus(here_m)})
    for key in sorted(set(here_m) | set(gold_m)):
        kind = str((gold_m.get(key) or here_m.get(key) or {}).get("kind", "?"))
        if key not in here_m or key not in gold_m:
            result.diffs[key] = StepDiff(key, kind, presence="missing" if key in gold_m else "extra")
            continue
        h, g = here_m[key], gold_m[key]
        ho, go = _records(h, "outputs", root), _records(g, "outputs", golden)
        hi, gi = _records(h, "inputs", root), _records(g, "inputs", golden)
        def differ(mine: dict, theirs: dict) -> list[str]:
            return [n for n in theirs if mine.get(n) != theirs[n] and not (
                n in mine and same_content(_at(root, mine[n][0]), _at(golden, theirs[n][0])))] + [
                n for n in mine if n not in theirs]

        outs, ins = differ(ho, go), differ(hi, gi)
        if not outs:
            result.same.append(key)
            continue
        d = StepDiff(key, kind, outputs=outs, inputs=ins)
        d.why = explain(h, g) if d.is_origin else []
        for n in outs:
            if n in ho and n in go and ho[n][0].endswith(".csv"):
                cell = first_cell(_at(root, ho[n][0]), _at(golden, go[n][0]))
                if cell:
                    d.cells.append(cell)
        result.diffs[key] = d

    def origins(key: str, seen: set[str]) -> set[str]:
        d = result.diffs.get(key)
        if d is None or d.presence != "both":
            return set()
        if d.is_origin or key in seen:
            return {key}
        seen.add(key)
        found: set[str] = set()
        for name in d.inputs:
            path = _records(here_m[key], "inputs", root).get(name, ("", ""))[0]
            producer = _producer(path, here_producers) if path else None
            if producer is None:
                result.sources.setdefault(path, []).append(key)
                found.add(f"source:{path}")
            else:
                found |= origins(producer[0], seen) or {f"source:{path}"}
        return found

    for key, d in result.diffs.items():
        if d.presence == "both" and not d.is_origin:
            d.origins = sorted(origins(key, set()))
    return result


#: What a golden tree keeps besides the manifests: recorded outputs that are data (not renderings or weights) and
#: small enough to commit; larger or binary outputs are compared by the sha256 their manifests record.
KEPT_SUFFIXES = (".csv", ".json", ".jsonl", ".md", ".tex")
KEPT_MAX_BYTES = 256 * 1024


def _kept(f: Path, root: Path) -> bool:
    """Whether a golden tree keeps output file ``f``: data small enough to commit, not part of a checkpoint (its
    folder's files are compared by the folder's recorded sha256), not a temporary."""
    return (f.suffix in KEPT_SUFFIXES and f.stat().st_size <= KEPT_MAX_BYTES
            and root.resolve() in f.resolve().parents
            and not any(part.startswith(".") for part in f.relative_to(root).parts)
            and not any(f.parent.glob("*.safetensors")))


def snapshot(root: str | Path, dest: str | Path) -> list[str]:
    """Write a golden tree of ``root`` into ``dest`` (replacing it): every manifest under data/ and results/, and
    each recorded output file that :func:`_kept` keeps; the relative paths written. ``esrepro compare dest`` in another checkout then says which outputs differ and where."""
    import shutil

    from esrepro.io import atomic_path

    root = Path(root)
    manifests, _ = index_manifests(root)
    if not manifests:
        raise AuditError(f"no manifests under {root} (searched its data/ and results/): run the pipeline first")
    keep: set[str] = set(manifests)
    for m in manifests.values():
        for rec in (m.get("outputs") or {}).values():
            path = _at(root, rec["path"])
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for f in files:
                if _kept(f, root):
                    keep.add(f.relative_to(root).as_posix())
    with atomic_path(dest, is_dir=True) as tmp:
        for rel in sorted(keep):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, tmp / rel)
    return sorted(keep)


def readme_results(golden: str | Path) -> str:
    """The README's tiny-scale results, written from the golden tables (never copied by hand)."""
    import pandas as pd

    tables = Path(golden) / "results" / "tables"
    t1 = pd.read_csv(tables / "table1_countdown.csv")
    row = t1[t1["model"] == "tiny"].iloc[0]
    methods = ["Original", "PPO-z", "GRPO-z (8)", "GRPO-z (30)", "GRPO-v", "Dr.GRPO-v", "ES"]  # v2 Table 1's columns
    lines = ["| " + " | ".join(methods) + " |", "|" + "---:|" * len(methods),
             "| " + " | ".join(f"{row[f'{m} (ours)']:.1f}" for m in methods) + " |"]
    t2 = pd.read_csv(tables / "table2_conciseness.csv")

    def spread(r: Any, col: str, digits: int = 2) -> str:
        std = r.get(f"{col} std")
        return f"{r[col]:.{digits}f}" + ("" if pd.isna(std) else f" ± {std:.{digits}f}")

    # Table 2 in the ES paper's layout: our rows (not the paper's alone)
    lines += ["", "| Configuration | Seeds | Reward (normalised) | KL (k3) | Hacking | Status |", "|---|---:|---:|---:|---|---|"]
    for _, r in t2[t2["Status"] != "not run"].iterrows():
        hack = "" if pd.isna(r["Hacking (ours)"]) else r["Hacking (ours)"]
        lines.append(f"| {r['configuration']} | {int(r['Seeds'])} | {spread(r, 'Reward (ours)', 3)} | "
                     f"{spread(r, 'KL (ours)')} | {hack} | {r['Status']} |")
    if (tables / "stability.csv").is_file():
        st = pd.read_csv(tables / "stability.csv")
        lines += ["", "| Method | Seeds | Mean | Std | Min | Max |", "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['Method']} | {r['Seeds']} | {r['Mean']:.1f} | {r['Std']:.1f} | {r['Min']:.1f} | {r['Max']:.1f} |"
                  for _, r in st.iterrows()]
    if (tables / "es_variants.csv").is_file():
        ev = pd.read_csv(tables / "es_variants.csv")
        lines += ["", "| Method | Rank | Samples | Seeds | Accuracy | Δ vs ES |", "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['Method']} | {r['Rank']} | {r['Samples']} | {r['Seeds']} | {spread(r, 'Accuracy', 1)} | "
                  + ("" if pd.isna(r["Δ vs ES"]) else f"{r['Δ vs ES']:+.1f}") + " |" for _, r in ev.iterrows()]
    if (tables / "essa_summary.csv").is_file():
        es = pd.read_csv(tables / "essa_summary.csv")

        def pct(x: Any) -> str:
            return "" if pd.isna(x) else f"{100 * x:.1f}"

        lines += ["", "| ESSA run | Task | Held-out, SFT start | Held-out, best | Test |", "|---|---|---:|---:|---:|"]
        lines += [f"| {r['method']} | {r['task']} | {pct(r.get('val_reward_sft'))} | {pct(r.get('val_max'))} | "
                  f"{pct(r.get('test_accuracy'))} |" for _, r in es.iterrows()]
    if (tables / "claims.csv").is_file():
        from esrepro.report.claims.glance import glance

        cl = pd.read_csv(tables / "claims.csv")
        lines += ["", *glance(cl.to_dict("records"))]
    return "\n".join(lines) + "\n"


README_BEGIN = "<!-- tiny results: written from golden/tiny by esrepro.provenance.golden.write_readme (make golden) -->"
README_END = "<!-- end of tiny results -->"


def write_readme(readme: str | Path, golden: str | Path) -> None:
    """Replace the README's tiny-results block (between :data:`README_BEGIN` and :data:`README_END`) with
    :func:`readme_results` of ``golden``."""
    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme}: no tiny-results block ({README_BEGIN} ... {README_END})")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{readme_results(golden)}{README_END}{tail}", encoding="utf-8")
