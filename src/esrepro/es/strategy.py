"""ES as ask/tell: the population of an iteration is a list of seeds, and an update is seeds and weights.

Nothing here touches weights: :meth:`ESStrategy.ask` is a pure function of (run seed,
iteration), and :meth:`ESStrategy.tell` turns the members' rewards into the update every
engine applies (z-scores as weights, the paper's alpha).

Options for EGGROLL's own recipe (ESHyperscale/HyperscaleES at b77f7d6, ``src/hyperscalees/noiser/eggroll.py``);
their defaults are ES's:

- ``antithetic``: members 2j and 2j + 1 are one draw of noise with +sigma and -sigma (their
  ``get_lora_update_params``: thread i draws noise i // 2, with sigma's sign from i's parity). Member 2j + 1's seed is
  member 2j's with bit 30 set (:func:`esrepro.perturb.noise.mirror`), which every noise draw turns into minus the
  partner's noise, so perturbations and the update sum_n w_n eps_n follow with no other change.
- ``fitness``: ``zscore`` (ES's) or ``centred`` (:func:`esrepro.perturb.ops.centred`, their ``convert_fitnesses``).
- ``step``: ``alpha_over_n`` (ES's theta += alpha / N sum_n w_n eps_n) or ``sigma_sqrt_n``: theta += alpha sigma /
  √N sum_n w_n eps_n, their update (``_simple_full_update`` / ``_simple_lora_update`` average w_n (±sigma) eps_n
  over the N members, ``_do_update`` multiplies by √N and SGD by the learning rate, here alpha). An
  :class:`~esrepro.perturb.ops.Update` applies alpha' / N, so it carries alpha' = alpha sigma √N.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np

from esrepro.perturb.noise import member_seed, mirror
from esrepro.perturb.ops import Update, centred, zscore

Fitness = Literal["zscore", "centred"]
Step = Literal["alpha_over_n", "sigma_sqrt_n"]


class ESStrategy:
    """The paper's ES: N seeded Gaussian perturbations per iteration, z-scored rewards as update weights (or, as
    options, EGGROLL's antithetic pairs, centred fitness and sigma / √N step)."""

    def __init__(self, population: int, sigma: float, alpha: float, seed: int, antithetic: bool = False,
                 fitness: Fitness = "zscore", step: Step = "alpha_over_n") -> None:
        if antithetic and population % 2:
            raise ValueError(f"population {population} is odd; antithetic members come in pairs")
        self.population, self.sigma, self.alpha, self.seed = population, sigma, alpha, seed
        self.antithetic, self.fitness, self.step = antithetic, fitness, step

    def ask(self, iteration: int) -> list[int]:
        """The member seeds of ``iteration`` (a pure function of the run seed and the iteration); antithetic: pairs
        (s_j, mirror(s_j)) with s_j the seed of pair j."""
        if not self.antithetic:
            return [member_seed(self.seed, iteration, n) for n in range(self.population)]
        pairs = (member_seed(self.seed, iteration, j) for j in range(self.population // 2))
        return [s for base in pairs for s in (base, mirror(base))]

    def weights(self, rewards: Sequence[float]) -> np.ndarray:
        """The members' update weights w_n from their mean rewards (``fitness``)."""
        if self.fitness == "zscore":
            return zscore(rewards)
        if self.fitness == "centred":
            return centred(rewards)
        raise ValueError(f"unknown fitness {self.fitness!r}; expected 'zscore' or 'centred'")

    def update_alpha(self, n: int) -> float:
        """alpha' of the :class:`Update` (applied as alpha' / N) that gives the ``step`` for ``n`` members."""
        if self.step == "alpha_over_n":
            return self.alpha
        if self.step == "sigma_sqrt_n":
            return self.alpha * self.sigma * math.sqrt(n)
        raise ValueError(f"unknown step {self.step!r}; expected 'alpha_over_n' or 'sigma_sqrt_n'")

    def tell(self, seeds: list[int], rewards: list[float]) -> Update:
        """The update for members ``seeds`` with mean rewards ``rewards``."""
        if len(seeds) != len(rewards):
            raise ValueError(f"{len(seeds)} seeds but {len(rewards)} rewards")
        weights = tuple(float(w) for w in self.weights(rewards))
        return Update(tuple(seeds), weights, self.update_alpha(len(seeds)))
