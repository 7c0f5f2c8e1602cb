"""ES as ask/tell: the population of an iteration is a list of seeds, and an update is seeds and weights.

Nothing here touches weights: :meth:`ESStrategy.ask` is a pure function of (run seed,
iteration), and :meth:`ESStrategy.tell` turns the members' rewards into the update every
engine applies (z-scores as weights, the paper's alpha).
"""

from __future__ import annotations

from esrepro.perturb.noise import member_seed
from esrepro.perturb.ops import Update, zscore


class ESStrategy:
    """The paper's ES: N seeded Gaussian perturbations per iteration, z-scored rewards as update weights."""

    def __init__(self, population: int, sigma: float, alpha: float, seed: int) -> None:
        self.population, self.sigma, self.alpha, self.seed = population, sigma, alpha, seed

    def ask(self, iteration: int) -> list[int]:
        """The member seeds of ``iteration`` (a pure function of the run seed and the iteration)."""
        return [member_seed(self.seed, iteration, n) for n in range(self.population)]

    def tell(self, seeds: list[int], rewards: list[float]) -> Update:
        """The update for members ``seeds`` with mean rewards ``rewards``."""
        if len(seeds) != len(rewards):
            raise ValueError(f"{len(seeds)} seeds but {len(rewards)} rewards")
        return Update(tuple(seeds), tuple(float(w) for w in zscore(rewards)), self.alpha)
