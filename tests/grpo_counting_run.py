"""The train step of one GRPO run, counting every completion the task scores (run by the GRPO scaling tests).

``python tests/grpo_counting_run.py COUNT_DIR TRAIN_KWARGS_JSON`` (alone or under ``torchrun``) makes the
Countdown task score a response by its length (min(characters, 40) / 40, so rewards vary for an untrained
tiny model and the policy moves) and append a line to ``COUNT_DIR/rank<RANK>.txt`` per scored completion,
then runs :func:`esrepro.steps.train.train` with the keyword arguments given. Afterwards each process writes
``COUNT_DIR/accelerate<RANK>.json``: the distributed type accelerate ran (e.g. MULTI_CPU, FSDP).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from esrepro.steps.train import train
from esrepro.tasks.base import Score
from esrepro.tasks.countdown import CountdownTask


def main() -> None:
    counts = Path(sys.argv[1])
    counts.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    out = counts / f"rank{rank}.txt"

    def counted(self, response, example):  # noqa: ANN001, ANN202 - Task.score's signature
        with out.open("a") as f:
            f.write("1\n")
        return Score(min(len(response), 40) / 40, False)

    CountdownTask.score = counted
    import accelerate

    seen: dict = {}
    init = accelerate.Accelerator.__init__

    def recorded(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - Accelerator's signature
        init(self, *args, **kwargs)
        plugin = getattr(self.state, "fsdp_plugin", None)
        seen.update(distributed_type=str(self.distributed_type), num_processes=self.num_processes,
                    fsdp_version=getattr(plugin, "fsdp_version", None),
                    fsdp_wrap=sorted(getattr(plugin, "transformer_cls_names_to_wrap", None) or []))

    accelerate.Accelerator.__init__ = recorded
    train(**json.loads(sys.argv[2]))
    (counts / f"accelerate{rank}.json").write_text(json.dumps(seen))

if __name__ == "__main__":
    main()
