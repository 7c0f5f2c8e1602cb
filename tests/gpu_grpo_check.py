"""One-GPU check of the paper-scale GRPO path (run by hand on a GPU machine; CPU tests cannot reach it).

``python tests/gpu_grpo_check.py trainer``: GRPOTrainer built as :func:`esrepro.rl.grpo.train_grpo` builds it
from a bf16 registry model, bf16 and gradient checkpointing on: prints the policy's and the reference's dtypes
(float32 master weights expected), accelerate's mixed precision (bf16) and how many parameters two steps at
lr 1e-6 moved (nearly all expected; none would with bf16 master weights). ``... run``: train_grpo end to end
with a resume folder (final weights in the registry dtype).
``torchrun --standalone --nnodes 1 --nproc-per-node G tests/gpu_grpo_check.py fsdp``: the FSDP2 path
(accelerate's distributed type, the policy gathered whole on rank 0). Each prints a ``CHECK`` line.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import make_model_dir
from test_rl_trainers import GRPO, SHORT, LengthTask
import accelerate

seen = {}
init = accelerate.Accelerator.__init__
def recorded(self, *a, **k):
    init(self, *a, **k)
    seen.update(distributed_type=str(self.distributed_type), mixed_precision=str(self.mixed_precision),
                fsdp_version=getattr(getattr(self.state, "fsdp_plugin", None), "fsdp_version", None))
accelerate.Accelerator.__init__ = recorded

from esrepro.rl.grpo import train_grpo, grpo_config_kwargs, _policy, _dataset
from esrepro.rl.reward import trl_reward_func
from esrepro.models.loading import load_tokenizer
mode = sys.argv[1]
root = Path(os.environ.get("WORK", "/tmp/gc")); root.mkdir(parents=True, exist_ok=True)
md = root / "model"
if int(os.environ.get("RANK", "0")) == 0 and not (md / "config.json").exists():
    make_model_dir(md)
while not (md / "config.json").exists(): time.sleep(0.2)
S = {**GRPO, "bf16": True, "gradient_checkpointing": True, "learning_rate": 1e-6, "beta": 0.05, "resume_every": 1}
out = {"mode": mode, "cuda": torch.cuda.is_available()}
if mode == "trainer":  # the wiring train_grpo uses, inspected inside TRL
    from trl import GRPOConfig, GRPOTrainer
    tok = load_tokenizer(md); tok.padding_side = "left"
    policy, kw = _policy(md, None, "bfloat16")
    with tempfile.TemporaryDirectory() as d:
        cfg = GRPOConfig(**grpo_config_kwargs(S, steps=2, seed=0, output_dir=d, on_cpu=False), model_init_kwargs=kw)
        t = GRPOTrainer(model=policy, reward_funcs=[trl_reward_func(LengthTask())], args=cfg,
                        train_dataset=_dataset(LengthTask(), SHORT, False), processing_class=tok)
        before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
        t.train()
        moved = sum(int(not torch.equal(before[n], p.detach())) for n, p in t.model.named_parameters())
        out.update(policy_dtype=str(t.model.dtype), ref_dtype=str(t.ref_model.dtype), params=len(before),
                   params_moved_lr1e6=moved, log=[{k: v for k, v in r.items() if k in ("loss", "reward", "kl")}
                                                   for r in t.state.log_history][:2])
elif mode == "run":  # train_grpo end to end: resume dir written, final weights in the registry dtype
    rd = root / "resume"
    model, tok, rows = train_grpo(md, LengthTask(), SHORT, S, steps=3, seed=0, dtype="bfloat16", resume_dir=rd)
    out.update(rows=len(rows), final_dtype=str(model.dtype), resume=sorted(p.name for p in rd.iterdir()))
elif mode == "fsdp":
    model, tok, rows = train_grpo(md, LengthTask(), SHORT, {**S, "sharding": "fsdp", "keep_every": 1}, steps=2,
                                  seed=0, dtype="bfloat16", snapshot_dir=root / "snapshots")
    if int(os.environ.get("RANK", "0")) == 0:
        sd = model.state_dict()
        out.update(rows=len(rows), final_dtype=str(model.dtype), type=type(model).__name__,
                   snapshots=sorted(p.name for p in (root / "snapshots").iterdir()),
                   dtensor=any(type(v).__name__ == "DTensor" for v in sd.values()), n=len(sd))
out["accelerate"] = seen
print("CHECK", json.dumps(out), flush=True)
