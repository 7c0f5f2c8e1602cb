"""The rehearsal's local mirror: random-weight replicas and data served through esrepro's own download code.

A mirror is built for a small config (one Qwen2 and one Llama model, a url, an authors and a hub data source),
served on a local port, and fetched with huggingface_hub (HF_ENDPOINT, in a subprocess: the client reads it at
import) and fetch_url (ESREPRO_URL_MIRROR).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SHARED_DATA

QWEN, LLAMA = "Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"
PAPER = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
CONFIG = {
    "extends": "config/config.yaml",
    "models": ["qwen2.5-0.5b-instruct", "llama-3.2-1b-instruct"],
    "stability": {"models": ["qwen2.5-0.5b-instruct"]},
    "data": {"countdown": {"source": PAPER["data"]["countdown"]["source"]},
             "prm800k": {"source": PAPER["data"]["prm800k"]["source"]},
             "gsm8k": {"source": {"kind": "hub", "raw_dir": "data/raw/gsm8k"}}},
}


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    from esrepro.rehearsal.build import build_mirror
    from esrepro.rehearsal.hub_mirror import MirrorServer

    tmp = tmp_path_factory.mktemp("mirror")
    config = tmp / "small.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    root = tmp / "root"
    index = build_mirror(root, config, SHARED_DATA if SHARED_DATA.is_dir() else None, workdir=REPO)
    log = open(tmp / "requests.log", "w")
    server = MirrorServer(root, log_file=log)
    server.start()
    yield {"root": root, "index": index, "url": server.url, "tmp": tmp, "log": tmp / "requests.log"}
    server.shutdown()
    server.server_close()
    log.close()


def hub_python(mirror: dict, code: str, token: str | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter whose huggingface_hub talks to the mirror."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_ENDPOINT": mirror["url"], "HF_HOME": str(mirror["tmp"] / "hf_home"), "HF_HUB_OFFLINE": "0",
                "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO / "src")})
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def fetch_model_code(name: str, hub_id: str, out: Path) -> str:
    return ("import json; from esrepro.models.fetch import fetch_hub_model; "
            f"print(json.dumps(fetch_hub_model({name!r}, {hub_id!r}, 'main', {str(out)!r})))")


def repo(mirror: dict, kind: str, repo_id: str) -> dict:
    return mirror["index"]["repos"][f"{kind}:{repo_id}"]


def token_ids(model_dir: Path, *tokens: str) -> list[int]:
    added = json.loads((model_dir / "tokenizer.json").read_text())["added_tokens"]
    by_name = {t["content"]: t["id"] for t in added}
    return [by_name[t] for t in tokens]


def test_replica_bytes_depend_only_on_the_seed(tmp_path):
    from esrepro.rehearsal.replicas import build_replica

    config = json.loads((REPO / "config" / "model_configs" / "llama-3.2-1b-instruct.json").read_text())
    entry = {"hub_id": LLAMA, "dtype": "bfloat16", "config": config}
    digests = []
    for run in ("a", "b"):
        summary = build_replica("llama", entry, tmp_path / run, seed=3)
        digests.append({f: hashlib.sha256((tmp_path / run / f).read_bytes()).hexdigest() for f in summary["files"]})
    assert digests[0] == digests[1]
    assert "model.safetensors" in digests[0] and "original/consolidated.00.pth" in digests[0]


def test_qwen_replica_fetched_at_main_resolves_and_loads(mirror):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from esrepro.models.loading import load_tokenizer

    out = mirror["tmp"] / "fetched" / "qwen"
    proc = hub_python(mirror, fetch_model_code("qwen", QWEN, out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    commit = repo(mirror, "model", QWEN)["commit"]
    assert {k: record[k] for k in ("hub_id", "revision", "commit")} == {"hub_id": QWEN, "revision": "main",
                                                                         "commit": commit}
    assert "model.safetensors" in record["files"] and not (out / ".cache").exists()  # nothing of the hub client
    assert f"resolved to {commit}" in proc.stderr
    assert f"/tree/{commit}" in mirror["log"].read_text()

    config = json.loads((out / "config.json").read_text())
    assert (config["architectures"], config["rope_theta"], config["max_position_embeddings"]) == \
        (["Qwen2ForCausalLM"], 1000000.0, 32768)
    assert config["tie_word_embeddings"] is True and config["torch_dtype"] == "bfloat16"
    tok, auto = load_tokenizer(out), AutoTokenizer.from_pretrained(out)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    text = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                    "<|im_end|>\n<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n")
    assert tok(text)["input_ids"] == auto(text)["input_ids"]
    im_end, endoftext = token_ids(out, "<|im_end|>", "<|endoftext|>")
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [im_end, endoftext]
    assert (tok.eos_token_id, tok.pad_token_id) == (im_end, endoftext)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "Qwen2ForCausalLM" and str(model.dtype) == "torch.bfloat16"
    assert model.config.vocab_size % 64 == 0 and model.config.vocab_size >= len(tok)


def test_gated_llama_needs_a_token(mirror):
    from transformers import AutoModelForCausalLM

    from esrepro.models.loading import load_tokenizer

    out = mirror["tmp"] / "fetched" / "llama"
    denied = hub_python(mirror, fetch_model_code("llama", LLAMA, out))
    assert denied.returncode != 0 and not out.exists()
    assert "could not fetch meta-llama/Llama-3.2-1B-Instruct@main" in denied.stderr
    assert "gated repo" in denied.stderr and "401" in denied.stderr

    proc = hub_python(mirror, fetch_model_code("llama", LLAMA, out), token="hf_rehearsal")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["commit"] == repo(mirror, "model", LLAMA)["commit"]
    # only what the model needs: not Meta's consolidated weights the repository also carries
    assert not (out / "original").exists() and (out / "model.safetensors").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["rope_theta"] == 500000.0
    assert config["tie_word_embeddings"] is True
    tok = load_tokenizer(out)
    bos, end, eom, eot = token_ids(out, "<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
    assert tok("12 + 30")["input_ids"][0] == bos
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date")
    assert text.endswith("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [end, eom, eot]
    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "LlamaForCausalLM"


def test_the_rehearsal_registry_states_the_config_the_mirror_serves(mirror):
    """A fetch checks the downloaded config.json against its entry's config: the rehearsal's registry states each hub
    model by its replica's, so the rehearsal's fetch passes that check, where the real model's config is refused
    field by field (nothing written)."""
    from esrepro.config import read_config
    from esrepro.planning.load import load_pipeline
    from esrepro.planning.rehearsal_registry import rehearsal_registry
    from esrepro.settings.pipeline import Rehearsal

    p = load_pipeline(read_config(mirror["tmp"] / "small.yaml", REPO), mirror["tmp"] / "small.yaml", root=REPO)
    real = p.model("qwen2.5-0.5b-instruct")
    rehearsed = rehearsal_registry({"qwen2.5-0.5b-instruct": real}, Rehearsal())["qwen2.5-0.5b-instruct"]
    for name, config, ok in (("rehearsed", rehearsed.config, True), ("real", real.config, False)):
        out = mirror["tmp"] / "fetched-checked" / name
        code = ("import json; from esrepro.models.fetch import fetch_hub_model; "
                f"print(json.dumps(fetch_hub_model('qwen2.5-0.5b-instruct', {QWEN!r}, 'main', {str(out)!r}, "
                f"config={config!r})))")
        proc = hub_python(mirror, code)
        assert (proc.returncode == 0) == ok, proc.stderr[-2000:]
        assert out.is_dir() == ok
    assert "hidden_size: stated 896, the model's config.json has 128" in proc.stderr


def test_url_sources_come_from_the_mirror_verified(mirror, tmp_path, monkeypatch):
    from esrepro.data.fetch import ChecksumError, fetch_url

    monkeypatch.setenv("ESREPRO_URL_MIRROR", mirror["url"])
    pins = yaml.safe_load((mirror["root"] / "sources.yaml").read_text())
    source = CONFIG["data"]["countdown"]["source"]
    record = mirror["index"]["urls"][source["url"]]
    expected = pins.get("data", {}).get("countdown", {}).get("source", {}).get("sha256", source["sha256"])
    assert (record["origin"] == "copy") == (expected == source["sha256"])
    assert fetch_url(source["url"], tmp_path / "countdown.json", expected).is_file()

    served = mirror["root"] / record["path"]
    original = served.read_bytes()
    try:
        served.write_bytes(original + b" ")
        with pytest.raises(ChecksumError, match="does not match pinned"):
            fetch_url(source["url"], tmp_path / "tampered.json", expected)
        assert not (tmp_path / "tampered.json").exists()
    finally:
        served.write_bytes(original)


def test_url_mirror_rewrites_only_http_urls(monkeypatch):
    from esrepro.data.fetch import mirrored_url

    monkeypatch.delenv("ESREPRO_URL_MIRROR", raising=False)
    assert mirrored_url("https://host/a/b.json") == "https://host/a/b.json"
    monkeypatch.setenv("ESREPRO_URL_MIRROR", "http://127.0.0.1:9/")
    assert mirrored_url("https://host/a/b.json") == "http://127.0.0.1:9/urls/host/a/b.json"
    assert mirrored_url("file:///data/b.json") == "file:///data/b.json"


def test_prm800k_stand_in_prepares_through_its_url_source(mirror, tmp_path, monkeypatch):
    from esrepro.tasks import prm800k_data

    monkeypatch.setenv("ESREPRO_URL_MIRROR", mirror["url"])
    pins = yaml.safe_load((mirror["root"] / "sources.yaml").read_text())["data"]["prm800k"]["source"]
    source = {**PAPER["data"]["prm800k"]["source"], "raw_dir": str(tmp_path / "raw")}
    source["files"] = {s: {**f, **pins["files"][s]} for s, f in source["files"].items()}
    info = prm800k_data.prepare(tmp_path / "prepared", source, seed=0)
    assert info["splits"]["train"]["n"] == 12000 and info["splits"]["test"]["n"] == 500


def test_hub_dataset_file_through_fetch_hub_file(mirror, tmp_path):
    pins = yaml.safe_load((mirror["root"] / "sources.yaml").read_text())["data"]["gsm8k"]["source"]
    test = pins["files"]["test"]
    commit = repo(mirror, "dataset", "openai/gsm8k")["commit"]
    dest = tmp_path / "test.parquet"
    code = ("from esrepro.data.fetch import fetch_hub_file; "
            f"print(fetch_hub_file('openai/gsm8k', {test['path']!r}, {commit!r}, {str(dest)!r}, {test['sha256']!r}))")
    proc = hub_python(mirror, code)
    assert proc.returncode == 0, proc.stderr
    import pyarrow.parquet as pq

    table = pq.read_table(dest)
    assert table.column_names == ["question", "answer"] and table.num_rows == 1319
    assert "####" in table.column("answer")[0].as_py()


@pytest.mark.vllm
def test_replicas_generate_in_vllm(mirror):
    """Each replica, as downloaded (bf16, its config semantics), loads in vLLM's CPU build and generates."""
    vllm = pytest.importorskip("vllm", reason="vLLM runs in .venv-vllm (make test)")
    for hub_id in (QWEN, LLAMA):
        model_dir = mirror["root"] / "models" / hub_id
        llm = vllm.LLM(model=str(model_dir), dtype="bfloat16", kv_cache_memory_bytes=64 * 2**20, seed=0,
                       max_model_len=512)
        out = llm.generate(["Compute 12 + 30."], vllm.SamplingParams(max_tokens=4, temperature=0.0))
        assert len(out[0].outputs[0].token_ids) >= 1
        del llm
