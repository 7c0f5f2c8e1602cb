"""Every model folder the pipeline writes loads with transformers' own Auto classes exactly as the pipeline loads it.

The tiny models' config.json is a qwen2 one, and transformers' AutoTokenizer loads a qwen2 folder through Qwen2's
tokenizer class, whose own pre-tokenizer splits a prompt into other ids than the BPE the tiny model was trained with.
Built here by the pipeline's own builders (both tiny models, at a small SFT) and an ES checkpoint of one.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from esrepro.backends.hf import HFBackend, HFEngine
from esrepro.models import loading
from esrepro.models.tiny import build_tiny, build_tiny_tasks
from esrepro.models.tokens import prompt_ids

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Using the numbers [19, 36, 55, 7], create an equation that equals 65. You can use basic arithmetic operations "
    "(+, -, *, /) and each number can only be used once.",
    "What is 12 + 30? Put the final answer in \\boxed{}.",
    "Solve this Sudoku:\n1 _ 3 4\n_ 4 1 _\n2 _ 4 3\n4 3 _ 1",
]
NEW_TOKENS = 24


def _build(kind: str, out: Path) -> Path:
    """A tiny model of the registry's architecture and tokenizer, by the pipeline's builder, with a short SFT."""
    registry = yaml.safe_load((REPO / "config/models.yaml").read_text())["models"]
    build = copy.deepcopy(registry[kind]["build"])
    build["tokenizer"]["corpus_problems"] = 200
    build["sft"]["epochs"] = 1
    if kind == "tiny":
        build["sft"]["problems"] = 32
        build_tiny(build, [], out)
    else:
        build["sft"]["tasks"] = {task: 8 for task in build["sft"]["tasks"]}
        build_tiny_tasks(build, {}, out)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("auto")
    made = {kind: _build(kind, root / kind / "base") for kind in ("tiny", "tiny-v2")}
    engine = HFEngine(made["tiny"])  # an ES checkpoint, written as the ES loop writes it (engine.save)
    engine.apply_update([1, 2, 3], [1.0, -0.5, 0.25], alpha=0.05)
    engine.save(root / "es-checkpoint")
    made["es-checkpoint"] = root / "es-checkpoint"
    return made


@pytest.mark.parametrize("name", ["tiny", "tiny-v2", "es-checkpoint"])
@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_auto_tokenizer_gives_the_pipelines_ids(folders, name, trust_remote_code):
    folder = folders[name]
    ours = loading.load_tokenizer(folder)
    theirs = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    for prompt in PROMPTS:
        assert theirs(prompt)["input_ids"] == prompt_ids(ours, prompt), (type(theirs).__name__, prompt)
    assert theirs.eos_token_id == ours.eos_token_id and theirs.pad_token_id == ours.pad_token_id
    if name == "es-checkpoint":  # a checkpoint keeps its base model's tokenizer, byte for byte
        assert (folder / "tokenizer.json").read_bytes() == (folders["tiny"] / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("name", ["tiny", "tiny-v2", "es-checkpoint"])
@pytest.mark.slow
def test_auto_classes_give_the_pipelines_greedy_outputs(folders, name):
    folder = folders[name]
    pipeline = HFBackend(folder, batch_size=1).generate(PROMPTS, NEW_TOKENS)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    outputs = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")
        row = model.generate(**ids, do_sample=False, max_new_tokens=NEW_TOKENS)[0, ids["input_ids"].shape[1]:]
        outputs.append(tokenizer.decode(row, skip_special_tokens=True))
    assert outputs == pipeline


def test_a_hub_tokenizer_is_saved_as_is(tmp_path, folders):
    """Only a folder AutoTokenizer would load through another class is marked: a specialised class is left alone."""
    from transformers import Qwen2Tokenizer

    qwen = Qwen2Tokenizer.from_pretrained(folders["tiny"])  # the class a hub Qwen2 checkpoint loads with
    model = AutoModelForCausalLM.from_pretrained(folders["tiny"])
    loading.save_checkpoint(model, qwen, tmp_path)
    assert "auto_map" not in loading.read_json(tmp_path / "tokenizer_config.json")
    assert not (tmp_path / f"{loading.AUTO_TOKENIZER_MODULE}.py").exists()
    assert type(AutoTokenizer.from_pretrained(tmp_path)).__name__ == "Qwen2Tokenizer"
