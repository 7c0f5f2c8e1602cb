"""RL baselines of the paper: GRPO and Dr.GRPO, also as VERL runs them (TRL's GRPOTrainer) and PPO (ours, verl-style).

Every trainer writes the same run directory as ES (``checkpoint/``, ``log.jsonl``,
``manifest.json``), scores with the same ``Task.score``, and runs for the number of
optimiser steps that matches the ES run's sample budget (:mod:`esrepro.rl.budget`).
"""

from esrepro.settings.methods import GRPO_ALGORITHMS

RL_ALGORITHMS = (*GRPO_ALGORITHMS, "ppo")
