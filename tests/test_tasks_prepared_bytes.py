"""Prepared files are byte-identical to what the code wrote before the task data moved out of
``task_data.py``: sha256 of each split, computed with that code (commit 9a9a6f5) for the same
source and seed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conftest import SHARED_DATA
from esrepro.tasks import prepare_task

DATASETS = SHARED_DATA / "datasets"

# (task, source, seed, {split: sha256 of the prepared file})
GENERATED = [
    ("countdown", {"kind": "generated", "n_train": 40, "n_test": 60}, 5,
     {"train": "28390a00f8d2c3c188e71e1012c6cacb375dc9a3ddb63298a9c2d5ee0860c463",
      "test": "9d22b7da5a5db2abd8e71d7cbb8214b4174a7d6adb23911070d4868d30284c3e"}),
    ("gsm8k", {"kind": "generated"}, 0,
     {"train": "2b1884ef4bcdf93faca5997d923fa2cafbe284819809050fdab1a3aba5bf434d",
      "test": "a56c2e771bfe7840e66ea060c03d01cdf866cc6fe955fac5f2c7c88d1571f1f6"}),
    ("gsm8k", {"kind": "generated", "n_train": 20, "n_test": 10}, 3,
     {"train": "1a8b8cb32029b7c56e6e2c8b5a8e61ef14b7a5dedaa20b20d49fceaa617bf6ac",
      "test": "7ca91a7ef2ce86952a7337a3351b1b99b4cb113e08b598871e1d6ebc80c85979"}),
    ("math500", {"kind": "generated"}, 0,
     {"test": "9ef987b87716a943e419bc74f3f945b771ac42c0ef8642e7560490d7c4295ecd"}),
    ("minerva", {"kind": "generated"}, 0,
     {"test": "6c625ac0dff1d8ac236970b97d9838eba09a9ae06a37c5830e97881be4e2f2d0"}),
    ("olympiad_bench", {"kind": "generated"}, 0,
     {"test": "e283b6e6e7ab137fa704930edf6bb3fb2e0cb9ee713527a11206f7e738a2d76c"}),
    ("aime24", {"kind": "generated"}, 0,
     {"test": "acda8c2324cb4ea174b44b78e70040ea1652098d3ad1a89bd1e9e8cd597d8cc8"}),
    ("amc23", {"kind": "generated"}, 0,
     {"test": "4900533bb45172e8164e5aefdb7ab6d96f3592f48dee746f61722a3a962f8078"}),
    # changed on purpose (issue 39): Sudoku is v2's 4x4 Mini Sudoku from Reasoning Gym (reasoning-gym 0.1.25)
    ("sudoku", {"kind": "generated", "n_train": 12, "n_test": 6}, 5,
     {"train": "5eb738efb8aa5916cbd2256f201a02be524c27114323651acbfb49d6531d8e5b",
      "test": "514f9d5aa0e9c42585fcb21bcc261b743fa5bd08301950cb9ec93fb8e0fdcf3b"}),
    ("sudoku", {"kind": "generated", "n_train": 16, "n_test": 20, "min_empty": 2, "max_empty": 4}, 0,
     {"train": "69ac931bd01c997dd118b4497137882ba66f7ef02eb719ac7c2701d067521ce0",
      "test": "c849fbc0de90bff42f58369c3ca94eb57776989fd0d366adac3a14e7ee23ba4e"}),
    ("arc", {"kind": "generated", "n_train": 6, "n_test": 4}, 1,
     {"train": "cbda6a09a231125f217c5bceda49be069ab6ed415160cb54c4c970628e84f3ba",
      "test": "276f187b4b3d91c3c53111acdd70a48b33d057fcc05cf90b1d82517928e598c9"}),
    # changed on purpose since 9a9a6f5 (issue 13): the test split holds all eight prompts of the paper's Table 5
    # (four were missing) and every row names the new source
    ("conciseness", {"kind": "generated"}, 0,
     {"train": "b12ec5e9d3f28bf00d3e3774285efe2b4084cb5964b9baaff4cf8dcb0105c0bf",
      "test": "769c864044c5c9e84141658d6dd6036a20376b10a1947c08d57e929c1bd6e53d"}),
    ("arc", {"kind": "generated"}, 0,
     {"train": "4c5fbe16c6944f99f56a5553b644992315df50b41b521f38cc107543ad8af364",
      "test": "c261249135072af158ada299e3160c74cd69659b89df7b7cebfaa1e598aeea5a"}),
    ("sudoku", {"kind": "generated"}, 0,
     {"train": "52152f428608266f13994c566f639a2c094741e2c9373eddf6fba0aee5f04f16",
      "test": "3d53c7c572f4c8fd9dab8ecd58c966800d163a830388dd560c430f466a821dae"}),
]

# Local sources: rows carry "source": "local:<path>", which depends on where the data
# live; the hashes are of the files with that path replaced by "SHARED".
LOCAL = [
    ("math500", {"kind": "local", "path": "evaluation_suite/math"}, 0,
     {"test": "55e07b4544332dea89e657e08004d5b3ae8aaae494c95f8ba460681397db80cb"}),
    ("minerva", {"kind": "local", "path": "evaluation_suite/math"}, 0,
     {"test": "2ac56fbd84644a886ce758c139b55ab2e23e75230ce5dc38f368cf512719f2c2"}),
    ("olympiad_bench", {"kind": "local", "path": "evaluation_suite/math"}, 0,
     {"test": "c6eb20eb5c9268aade149d33db1322feafcc6f08c9279d7256b2747b03b0cfe2"}),
    ("aime24", {"kind": "local", "path": "evaluation_suite/math"}, 0,
     {"test": "95fb3d02ad8aeaf99a66c1a0a4d47b6721db0f0b2bef371111824e88484049d0"}),
    ("amc23", {"kind": "local", "path": "evaluation_suite/math"}, 0,
     {"test": "02751bb0526942ccb47447f06263bcffda7870eeaf6c57fc77d25cbb6e96b34f"}),
    ("gsm8k", {"kind": "local", "path": "train/gsm_8k"}, 0,
     {"train": "23006d7d4f5c90f908833d12bcbba2be1ddc06abb54525b83210d18136c9f9e5"}),
]


def _ids(cases: list) -> list[str]:
    return [f"{task}-{seed}-{i}" for i, (task, _, seed, _) in enumerate(cases)]


@pytest.mark.parametrize(("task", "source", "seed", "expected"), GENERATED, ids=_ids(GENERATED))
def test_generated_files_are_unchanged(tmp_path: Path, task: str, source: dict, seed: int, expected: dict) -> None:
    result = prepare_task(task, tmp_path, source, seed)
    assert {split: info["sha256"] for split, info in result["splits"].items()} == expected


@pytest.mark.skipif(not DATASETS.exists(), reason=f"no shared data at {DATASETS}")
@pytest.mark.parametrize(("task", "source", "seed", "expected"), LOCAL, ids=_ids(LOCAL))
def test_local_files_are_unchanged(tmp_path: Path, task: str, source: dict, seed: int, expected: dict) -> None:
    path = str(DATASETS / source["path"])
    result = prepare_task(task, tmp_path, {**source, "path": path}, seed)
    got = {}
    for split in result["splits"]:
        data = (tmp_path / f"{split}.jsonl").read_bytes().replace(f'"local:{path}"'.encode(), b'"local:SHARED"')
        got[split] = hashlib.sha256(data).hexdigest()
    assert got == expected
