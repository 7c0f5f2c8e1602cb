"""Generation with an FSDP2-sharded PPO actor, one process of ``torchrun --nproc-per-node 2``:
``python fsdp_generate_job.py MODEL_DIR OUT``.

The rollout: rank 0's sequences end at their first token (every id is an end-of-sequence id there), rank 1's run
to ``max_new_tokens``, so the ranks must keep generating in step (each forward gathers every rank's shards). Then
the periodic evaluation as PPO runs it: the weights gathered on both ranks, rank 0 generating alone while rank 1
waits at a barrier. Writes ``OUT/rank<R>.json`` with the generated lengths and rank 0's evaluation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from esrepro.models.loading import load_tokenizer
from esrepro.rl import ppo_parallel as par
from esrepro.rl.ppo import _generate_padded
from esrepro.runtime.distributed import barrier, init_process_group, world
from esrepro.settings.methods import PPOSettings
from esrepro.train.periodic import model_generator


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    init_process_group("cpu")
    here = world()
    tok = load_tokenizer(model_dir)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if here.rank == 0:
        actor.generation_config.eos_token_id = list(range(actor.config.vocab_size))
    else:
        actor.generation_config.eos_token_id = None
    actor = par.wrap(actor, "fsdp", here, "cpu", bf16=False)
    enc = tok(["1 2 3", "4 5 6"], return_tensors="pt", padding=True)
    cfg = PPOSettings(max_new_tokens=12)
    seqs = _generate_padded(actor, dict(enc), 2, cfg, tok)
    record: dict = {"width": seqs.shape[1] - enc["input_ids"].shape[1]}
    actor.generation_config.eos_token_id = None
    with par.gathered(actor):
        if here.rank == 0:
            record["evaluated"] = model_generator(actor, tok, "cpu", 2, False, alone=True)(["1 2 3", "4 5 6"], 6)
        barrier()
    (out / f"rank{here.rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
