"""A small PPO job for the scale tests: ``python ppo_job.py MODEL_DIR OUT SETTINGS_JSON STEPS [RESUME_DIR]``.

Runs :func:`esrepro.rl.ppo.train_ppo` on four prompts with a length reward (one process, or each process
under torchrun) and writes ``OUT/rank<R>.json``: the responses this process scored; rank 0 adds the log
rows (without seconds) and the final weights (``OUT/weights.pt``). ``PPO_LOAD`` (sharded or whole) picks how it loads
its models (unset: the run's own choice).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from esrepro.rl.ppo import train_ppo
from esrepro.tasks.base import Score, Task

PROMPTS = [{"id": i, "prompt": f"Using the numbers [{a} {b}], make {a + b}."} for i, (a, b) in
           enumerate([(3, 4), (5, 9), (12, 2), (7, 7)])]


class CountingLengthTask(Task):
    """Reward = response length / 40 (capped at 1); counts the responses it scores."""

    name = "length"
    scored = 0

    def prompt(self, example: dict) -> str:
        return example["prompt"]

    def score(self, response: str, example: dict) -> Score:
        CountingLengthTask.scored += 1
        return Score(min(len(response), 40) / 40, False)


def main() -> None:
    model_dir, out, settings, steps = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
    resume = sys.argv[5] if len(sys.argv) > 5 else None
    torch.set_num_threads(1)
    model, _, rows = train_ppo(model_dir, CountingLengthTask(), PROMPTS, settings, steps=steps, seed=3,
                               progress=False, resume_dir=resume, load=os.environ.get("PPO_LOAD") or None)
    rank = int(os.environ.get("RANK", "0"))
    record: dict = {"scored": CountingLengthTask.scored}
    if rank == 0:
        record["rows"] = [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / "weights.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
