"""RL baselines of the paper: GRPO and Dr.GRPO (TRL's GRPOTrainer) and PPO (ours, verl-style).

Every trainer writes the same run directory as ES (``checkpoint/``, ``log.jsonl``,
``manifest.json``), scores with the same ``Task.score``, and runs for the number of
optimiser steps that matches the ES run's sample budget (:mod:`esrepro.rl.budget`).
"""

RL_ALGORITHMS = ("grpo", "dr_grpo", "ppo")
