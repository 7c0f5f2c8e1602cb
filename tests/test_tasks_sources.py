"""Task data sources: the catalogue files, local tables and Arrow folders, hub fetches with provenance.

Hub fetches run against :class:`FolderHub`, a hub client serving files from a
temporary folder (no network).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import SHARED_DATA
from esrepro.data.fetch import ChecksumError
from esrepro.io import read_jsonl
from esrepro.tasks import get_task, prepare_task, split_sizes
from esrepro.tasks.math import last_boxed
from esrepro.tasks.math_data import EMBEDDED_MATH, MATH_SETS
from esrepro.tasks.sources import fetch_hub, hub_defaults, local_subsets, read_table

MATH_DIR = SHARED_DATA / "datasets" / "evaluation_suite" / "math"
GSM8K_DIR = SHARED_DATA / "datasets" / "train" / "gsm_8k"
MATH_ROWS = {"math500": 500, "aime24": 30, "amc23": 83, "minerva": 272, "olympiad_bench": 675}
MAIN = "1" * 40
DEV = "2" * 40
PINNED = "3" * 40
MATH500_REPO = "HuggingFaceH4/MATH-500"


class FolderHub:
    """A hub client serving ``root/<repo>/<commit>/<path>``; ``branches`` maps (repo, branch) to a commit."""

    def __init__(self, root: Path, branches: dict[tuple[str, str], str]) -> None:
        self.root, self.branches = root, branches
        self.resolved: list[tuple[str, str]] = []
        self.downloaded: list[tuple[str, str, str]] = []

    def resolve(self, repo: str, revision: str) -> str:
        self.resolved.append((repo, revision))
        if (repo, revision) not in self.branches:
            raise OSError(f"no revision {revision} in {repo}")
        return self.branches[(repo, revision)]

    def download(self, repo: str, path: str, commit: str) -> Path:
        self.downloaded.append((repo, path, commit))
        local = self.root / repo / commit / path
        if not local.is_file():
            raise OSError(f"no file {path} in {repo}@{commit}")
        return local

    def put(self, repo: str, commit: str, path: str, text: str) -> str:
        """Store a file at ``repo@commit:path``; its sha256."""
        local = self.root / repo / commit / path
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text, encoding="utf-8")
        return hashlib.sha256(text.encode()).hexdigest()


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture
def hub(tmp_path: Path) -> FolderHub:
    hub = FolderHub(tmp_path / "hub", {(MATH500_REPO, "main"): MAIN, (MATH500_REPO, "dev"): DEV})
    hub.put(MATH500_REPO, MAIN, "test.jsonl", _jsonl([{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}]))
    hub.put(MATH500_REPO, DEV, "test.jsonl", _jsonl([{"problem": "3+3?", "answer": "6"}]))
    hub.put(MATH500_REPO, PINNED, "test.jsonl", _jsonl([{"problem": "5+5?", "answer": "10"}]))
    return hub


# ------------------------------------------------------------------ catalogue files


def test_catalogue_covers_gsm8k_and_the_math_sets() -> None:
    for task in ("gsm8k", *MATH_SETS):
        spec = hub_defaults(task)
        assert spec["repo_id"] and spec["fields"].keys() == {"problem", "answer"}
        assert spec["files"] and all(entry["path"] for entry in spec["files"].values())
        assert local_subsets(task)
    assert hub_defaults("sudoku") == {} and local_subsets("sudoku") == {}
    hub_defaults("gsm8k")["files"]["train"]["path"] = "changed"
    assert hub_defaults("gsm8k")["files"]["train"]["path"] == "main/train-00000-of-00001.parquet"


def test_embedded_math_file() -> None:
    assert set(EMBEDDED_MATH) == set(MATH_SETS)
    for items in EMBEDDED_MATH.values():
        assert len(items) == 12
        assert all(item.keys() == {"problem", "solution", "answer"} for item in items)
        assert all(last_boxed(item["solution"]) == item["answer"] for item in items)


# ------------------------------------------------------------------ hub


def test_unpinned_hub_source_resolves_main_and_records_the_commit(tmp_path: Path, hub: FolderHub, capsys) -> None:
    source = {"kind": "hub", "raw_dir": str(tmp_path / "raw")}
    result = prepare_task("math500", tmp_path / "out", source, 0, hub=hub)
    raw = tmp_path / "raw" / "math500" / MAIN / "test.jsonl"
    assert result["splits"]["test"]["n"] == 2
    assert result["provenance"] == {
        "kind": "hub", "repo_id": MATH500_REPO, "requested_revision": None, "resolved_commit": MAIN,
        "pinned": False, "files": {"test": {"path": "test.jsonl", "sha256": hashlib.sha256(raw.read_bytes()).hexdigest(),
                                             "verified": False}},
    }
    assert hub.resolved == [(MATH500_REPO, "main")]
    lines = capsys.readouterr().err.strip().split("\n")
    assert len(lines) == 1
    assert all(word in lines[0] for word in ("WARNING", "math500", MATH500_REPO, "'main'", MAIN, "NOT pinned"))
    rows = get_task("math500").load("test", tmp_path / "out")
    assert [r["answer"] for r in rows] == ["2", "4"] and rows[0]["source"] == f"hub:{MATH500_REPO}"


def test_hub_branch_main_and_other_branches_resolve(tmp_path: Path, hub: FolderHub, capsys) -> None:
    main = prepare_task("math500", tmp_path / "a", {"kind": "hub", "revision": "main", "raw_dir": str(tmp_path / "raw")},
                        0, hub=hub)
    dev = prepare_task("math500", tmp_path / "b", {"kind": "hub", "revision": "dev", "raw_dir": str(tmp_path / "raw")},
                       0, hub=hub)
    assert main["provenance"]["requested_revision"] == "main" and main["provenance"]["resolved_commit"] == MAIN
    assert dev["provenance"]["requested_revision"] == "dev" and dev["provenance"]["resolved_commit"] == DEV
    assert main["provenance"]["files"]["test"]["sha256"] != dev["provenance"]["files"]["test"]["sha256"]
    assert dev["splits"]["test"]["n"] == 1
    err = capsys.readouterr().err
    assert err.count("NOT pinned") == 2 and "'dev'" in err and DEV in err


def test_pinned_commit_is_not_resolved_and_not_warned(tmp_path: Path, hub: FolderHub, capsys) -> None:
    sha = hashlib.sha256((hub.root / MATH500_REPO / PINNED / "test.jsonl").read_bytes()).hexdigest()
    source = {"kind": "hub", "revision": PINNED, "raw_dir": str(tmp_path / "raw"),
              "files": {"test": {"path": "test.jsonl", "sha256": sha}}}
    result = prepare_task("math500", tmp_path / "out", source, 0, hub=hub)
    assert hub.resolved == [] and capsys.readouterr().err == ""
    assert result["provenance"]["pinned"] is True and result["provenance"]["resolved_commit"] == PINNED
    assert result["provenance"]["files"]["test"] == {"path": "test.jsonl", "sha256": sha, "verified": True}


def test_hub_checksums_are_verified_and_bad_files_never_land(tmp_path: Path, hub: FolderHub) -> None:
    raw = tmp_path / "raw"
    bad = {"kind": "hub", "raw_dir": str(raw), "files": {"test": {"path": "test.jsonl", "sha256": "0" * 64}}}
    with pytest.raises(ChecksumError, match=f"{MATH500_REPO}@{MAIN}:test.jsonl"):
        prepare_task("math500", tmp_path / "out", bad, 0, hub=hub)
    assert not (raw / "math500" / MAIN / "test.jsonl").exists()
    unverified = "unverified"  # the catalogue's spelling of "no pin" is accepted as none
    ok = {"kind": "hub", "raw_dir": str(raw), "revision": unverified,
          "files": {"test": {"path": "test.jsonl", "sha256": unverified}}}
    first = prepare_task("math500", tmp_path / "out", ok, 0, hub=hub)
    assert first["provenance"]["resolved_commit"] == MAIN and not first["provenance"]["files"]["test"]["verified"]


def test_hub_reuses_fetched_files_and_checks_them(tmp_path: Path, hub: FolderHub) -> None:
    source = {"kind": "hub", "raw_dir": str(tmp_path / "raw")}
    first = prepare_task("math500", tmp_path / "a", source, 0, hub=hub)
    second = prepare_task("math500", tmp_path / "b", source, 0, hub=hub)
    assert len(hub.downloaded) == 1 and first == second
    sha = first["provenance"]["files"]["test"]["sha256"]
    (tmp_path / "raw" / "math500" / MAIN / "test.jsonl").write_text("tampered\n")
    pinned = {**source, "files": {"test": {"path": "test.jsonl", "sha256": sha}}}
    with pytest.raises(ChecksumError, match="does not match"):
        prepare_task("math500", tmp_path / "c", pinned, 0, hub=hub)


def test_gsm8k_from_the_hub_matches_the_same_files_read_locally(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = hub_defaults("gsm8k")["repo_id"]
    hub = FolderHub(tmp_path / "hub", {(repo, "main"): MAIN})
    local = tmp_path / "local"
    for split, rows in (("train", [{"question": "How many?", "answer": "Steps\n#### 1,200"}]),
                        ("test", [{"question": "And now?", "answer": "More\n#### 7"}] * 2)):
        path = hub.root / repo / MAIN / hub_defaults("gsm8k")["files"][split]["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)
        local.mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), local / f"{split}.parquet")
    got = prepare_task("gsm8k", tmp_path / "hub_out", {"kind": "hub", "raw_dir": str(tmp_path / "raw")}, 0, hub=hub)
    want = prepare_task("gsm8k", tmp_path / "local_out", {"kind": "local", "path": str(local)}, 0)
    assert {s: v["n"] for s, v in got["splits"].items()} == {"train": 1, "test": 2}
    assert set(got["provenance"]["files"]) == {"train", "test"} and want["provenance"] == {}
    for split in ("train", "test"):
        a, b = read_jsonl(tmp_path / "hub_out" / f"{split}.jsonl"), read_jsonl(tmp_path / "local_out" / f"{split}.jsonl")
        assert [{**r, "source": None} for r in a] == [{**r, "source": None} for r in b]
        assert a[0]["source"] == f"hub:{repo}" and b[0]["source"] == f"local:{local}"
    assert read_jsonl(tmp_path / "hub_out" / "train.jsonl")[0]["answer"] == "1200"


def test_hub_errors_name_what_is_wrong(tmp_path: Path, hub: FolderHub) -> None:
    with pytest.raises(ValueError, match="raw_dir"):
        fetch_hub("math500", {"kind": "hub"}, hub)
    with pytest.raises(ValueError, match="repo_id"):
        fetch_hub("sudoku", {"kind": "hub", "raw_dir": str(tmp_path)}, hub)
    with pytest.raises(OSError, match="no revision nope"):
        fetch_hub("math500", {"kind": "hub", "revision": "nope", "raw_dir": str(tmp_path)}, hub)
    liar = FolderHub(hub.root, {(MATH500_REPO, "main"): "main"})
    with pytest.raises(OSError, match="not a commit"):
        fetch_hub("math500", {"kind": "hub", "raw_dir": str(tmp_path)}, liar)
    with pytest.raises(OSError, match="no file missing.jsonl"):
        fetch_hub("math500", {"kind": "hub", "raw_dir": str(tmp_path), "files": {"test": {"path": "missing.jsonl"}}}, hub)


# ------------------------------------------------------------------ local


def test_read_table_formats(tmp_path: Path) -> None:
    rows = [{"problem": "p", "answer": "1"}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "a.jsonl").write_text(_jsonl(rows))
    assert read_table(tmp_path / "a.json") == read_table(tmp_path / "a.jsonl") == rows
    (tmp_path / "b.json").write_text(json.dumps({"rows": rows}))
    with pytest.raises(ValueError, match="JSON list"):
        read_table(tmp_path / "b.json")
    with pytest.raises(ValueError, match="unsupported file type"):
        read_table(tmp_path / "a.csv")


def test_local_arrow_folders(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    rows = [{"question": "q1", "answer": "1.0"}, {"question": "q2", "answer": "x^2"}]
    DatasetDict({"amc": Dataset.from_list(rows), "other": Dataset.from_list(rows[:1])}).save_to_disk(str(tmp_path / "dd"))
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    by_default = prepare_task("amc23", tmp_path / "a", {"kind": "local", "path": str(tmp_path / "dd")}, 0)
    by_subset = prepare_task("amc23", tmp_path / "b", {"kind": "local", "path": str(tmp_path / "dd"), "subset": "other"}, 0)
    single = prepare_task("amc23", tmp_path / "c", {"kind": "local", "path": str(tmp_path / "one"), "n_test": 1}, 0)
    assert [r["splits"]["test"]["n"] for r in (by_default, by_subset, single)] == [2, 1, 1]
    assert [r["answer"] for r in get_task("amc23").load("test", tmp_path / "a")] == ["1.0", "x^2"]
    with pytest.raises(FileNotFoundError, match="subset 'nope'.*has \\['amc', 'other'\\]"):
        prepare_task("amc23", tmp_path / "d", {"kind": "local", "path": str(tmp_path / "dd"), "subset": "nope"}, 0)


# ------------------------------------------------------------------ the authors' Arrow folders (skipped without them)


@pytest.mark.skipif(not MATH_DIR.exists(), reason=f"no shared data at {MATH_DIR}")
@pytest.mark.parametrize("task_name", MATH_SETS)
def test_authors_math_folder(tmp_path: Path, task_name: str) -> None:
    source = {"kind": "local", "path": str(MATH_DIR)}
    assert split_sizes(task_name, source) == {"test": None}
    result = prepare_task(task_name, tmp_path, source, 0)
    assert result["splits"]["test"]["n"] == MATH_ROWS[task_name] and result["provenance"] == {}
    task = get_task(task_name, grading_timeout_s=5.0)
    rows = task.load("test", tmp_path)
    assert len(rows) == MATH_ROWS[task_name] and all(r["source"] == f"local:{MATH_DIR}" for r in rows)
    assert [r["answer"] for r in rows if not task.score(f"\\boxed{{{r['answer']}}}", r).correct] == []


@pytest.mark.skipif(not GSM8K_DIR.exists(), reason=f"no shared data at {GSM8K_DIR}")
def test_authors_gsm8k_folder(tmp_path: Path) -> None:
    source = {"kind": "local", "path": str(GSM8K_DIR)}
    assert split_sizes("gsm8k", source) == {"train": None, "test": None}
    result = prepare_task("gsm8k", tmp_path, source, 0)
    assert {s: v["n"] for s, v in result["splits"].items()} == {"train": 8792}
    task = get_task("gsm8k")
    rows = task.load("train", tmp_path)
    assert [r["answer"] for r in rows if not task.score(f"\\boxed{{{r['answer']}}}", r).correct] == []
