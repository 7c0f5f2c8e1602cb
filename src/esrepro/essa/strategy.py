"""CMA-ES over ESSA's singular values, as ask/tell with an exactly resumable state.

The optimiser is ``cmaes.SepCMA`` (separable CMA-ES: diagonal covariance) from the
``cmaes`` package, pinned, by default (``covariance="separable"``); ``covariance="full"``
runs ``cmaes.CMA`` (a full d x d covariance), which the ESSA paper's description (mean and
covariance) reads as, for small search spaces. Why separable by default:

- Dimension. ESSA's search space has one coordinate per selected singular value:
  hundreds to several thousands (e.g. 28 layers x 4 projections x 26 values = 2,912).
  Full CMA-ES stores a d x d covariance, decomposes it every generation (O(d^3)) and
  learns it at a rate ~ 2/d^2, negligible at populations of 96-608; the separable
  variant learns a per-coordinate scale at a rate ~ 1/d and costs O(d) per sample.
- State. ``SepCMA`` (and ``CMA``) keeps its whole state in a few numpy arrays and scalars and draws
  from its own ``numpy.random.RandomState`` (``_rng``). pycma by default draws from
  numpy's *global* RNG (its ``randn`` option is ``np.random.randn``) and carries a far
  larger object graph.
- Resume. ``cmaes`` pickling drops the RNG (``__getstate__`` leaves out ``_rng`` and
  ``__setstate__`` puts a fresh, unseeded one back), so an unpickled optimiser does not
  continue the same run. ``state_dict`` here is explicit instead: every attribute of
  the optimiser (arrays, numbers, None) plus the RNG's full state (MT19937 key and
  position and the cached Gaussian), saved as a numpy ``.npz`` without pickle. Loading
  rebuilds the optimiser from its constructor arguments and overwrites every
  attribute, and refuses a state written by another ``cmaes`` version.

Rewards are maximised; ``cmaes`` minimises, so it is told ``-reward``.
"""

from __future__ import annotations

import importlib.metadata
import io
from typing import Literal, Mapping, Sequence

import numpy as np
from cmaes import CMA, SepCMA

STATE_FORMAT = 1
LIBRARY = "cmaes"
#: ``covariance`` values and the ``cmaes`` optimiser each runs (a state without the key is separable).
OPTIMIZERS: dict[str, type] = {"separable": SepCMA, "full": CMA}
Covariance = Literal["separable", "full"]


def _library_version() -> str:
    return importlib.metadata.version(LIBRARY)


class CMAStrategy:
    """CMA-ES (separable or full covariance), maximising: ``ask()`` a whole population, ``tell`` its rewards.

    ``ask()`` is idempotent within a generation: asked again before ``tell`` it returns
    the same population, also after a save and load, so a generation interrupted mid-way
    resumes with the same candidates.
    """

    def __init__(self, x0: np.ndarray, sigma0: float, population: int, seed: int,
                 bounds: np.ndarray | None = None, covariance: Covariance = "separable"):
        x0 = np.array(x0, dtype=np.float64)  # a copy: the optimiser updates its mean in place
        if covariance not in OPTIMIZERS:
            raise ValueError(f"covariance must be one of {sorted(OPTIMIZERS)}, got {covariance!r}")
        if x0.ndim != 1 or x0.size < 2:
            raise ValueError(f"x0 must be a vector of at least 2 values, got shape {x0.shape}")
        if not np.all(np.isfinite(x0)):
            raise ValueError("x0 has non-finite values")
        if not sigma0 > 0:
            raise ValueError(f"sigma0 must be positive, got {sigma0}")
        if population < 2:
            raise ValueError(f"population must be at least 2, got {population}")
        if bounds is not None:
            bounds = np.array(bounds, dtype=np.float64)
            if bounds.shape != (x0.size, 2) or np.any(bounds[:, 0] > x0) or np.any(x0 > bounds[:, 1]):
                raise ValueError(f"bounds must be ({x0.size}, 2) [low, high] rows containing x0")
        self.x0 = x0
        self.sigma0 = float(sigma0)
        self.population = int(population)
        self.seed = int(seed)
        self.bounds = bounds
        self.covariance: Covariance = covariance
        self._opt = self._new_optimizer()
        self._pending: np.ndarray | None = None
        self._best_x: np.ndarray | None = None
        self._best_reward = -np.inf

    def _new_optimizer(self) -> SepCMA | CMA:
        opt = OPTIMIZERS[self.covariance](mean=self.x0.copy(), sigma=self.sigma0, seed=self.seed,
                                          bounds=None if self.bounds is None else self.bounds.copy(),
                                          population_size=self.population)
        # Both allocate its history of best/worst values with np.empty; entries not yet written
        # hold whatever was in memory. They are read only by should_stop() once every entry has been
        # written, but zeroing them makes a saved state a function of the run alone (comparable bit for bit).
        opt._funhist_values[:] = 0.0
        return opt

    # -- ask / tell -------------------------------------------------------------------

    def ask(self) -> list[np.ndarray]:
        """The current generation's population (``population`` vectors, float64 copies)."""
        if self._pending is None:
            self._pending = np.stack([self._opt.ask() for _ in range(self.population)])
        return [row.copy() for row in self._pending]

    def tell(self, candidates: Sequence[np.ndarray], rewards: Sequence[float]) -> None:
        """Update the distribution with the rewards (higher is better) of the asked population.

        ``candidates`` must be the population ``ask()`` returned, in any order (each is
        matched to its reward and the pairs are handed to CMA-ES in the asked order, so
        the update does not depend on the order results came back in); a vector that was
        not asked is an error.
        """
        if self._pending is None:
            raise RuntimeError("tell() without ask(): no population is waiting for rewards")
        xs = np.stack([np.asarray(c, dtype=np.float64) for c in candidates])
        r = np.asarray(rewards, dtype=np.float64)
        if xs.shape != self._pending.shape or r.shape != (self.population,):
            raise ValueError(f"tell() needs {self.population} candidates of dimension {self.dim} and as many "
                             f"rewards; got candidates {xs.shape}, rewards {r.shape}")
        if not np.all(np.isfinite(r)):
            raise ValueError("rewards must be finite")
        index = {row.tobytes(): i for i, row in enumerate(self._pending)}
        order = [index.get(row.tobytes(), -1) for row in xs]
        if sorted(order) != list(range(self.population)):
            raise ValueError("tell() candidates are not the population ask() returned")
        by_asked = np.empty(self.population)
        by_asked[order] = r
        i = int(np.argmax(by_asked))  # first best in asked order
        if by_asked[i] > self._best_reward:
            self._best_reward, self._best_x = float(by_asked[i]), self._pending[i].copy()
        self._opt.tell([(x.copy(), -float(v)) for x, v in zip(self._pending, by_asked, strict=True)])
        self._pending = None

    # -- read-outs ---------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return int(self.x0.size)

    @property
    def generation(self) -> int:
        """Number of completed ``tell`` calls."""
        return int(self._opt.generation)

    @property
    def mean(self) -> np.ndarray:
        """The distribution's mean (a copy): the run's current solution."""
        return np.array(self._opt.mean, dtype=np.float64)

    @property
    def sigma(self) -> float:
        """The global step size."""
        return float(self._opt._sigma)

    @property
    def best(self) -> tuple[np.ndarray | None, float]:
        """The best candidate told so far and its reward (None, -inf before the first tell)."""
        return (None if self._best_x is None else self._best_x.copy()), self._best_reward

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to continue bit-identically, as named numpy arrays (no objects)."""
        state: dict[str, np.ndarray] = {
            "format": np.array(STATE_FORMAT),
            "library": np.array(LIBRARY),
            "library_version": np.array(_library_version()),
            "x0": self.x0.copy(),
            "sigma0": np.array(self.sigma0),
            "population": np.array(self.population),
            "seed": np.array(self.seed),
            "covariance": np.array(self.covariance),
            "best_reward": np.array(self._best_reward),
        }
        if self.bounds is not None:
            state["bounds"] = self.bounds.copy()
        if self._best_x is not None:
            state["best_x"] = self._best_x.copy()
        if self._pending is not None:
            state["pending"] = self._pending.copy()
        for name, value in vars(self._opt).items():
            key = f"opt.{name}"
            if name == "_rng":
                kind, keys, pos, has_gauss, cached = value.get_state()
                state["rng.kind"], state["rng.keys"] = np.array(kind), keys.copy()
                state["rng.pos"], state["rng.has_gauss"] = np.array(pos), np.array(has_gauss)
                state["rng.cached_gaussian"] = np.array(cached)
            elif value is None:
                state[key + ":none"] = np.array(0)
            elif isinstance(value, np.ndarray):
                state[key + ":array"] = value.copy()
            elif isinstance(value, (bool, np.bool_)):
                state[key + ":bool"] = np.array(bool(value))
            elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                state[key + (":int" if isinstance(value, int) else ":np")] = np.array(value)
            elif isinstance(value, (float, np.floating)):
                state[key + (":float" if type(value) is float else ":np")] = np.array(value)
            else:
                raise TypeError(f"cannot save {type(self._opt).__name__} attribute {name!r} of type "
                                f"{type(value).__name__}")
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray] | bytes) -> "CMAStrategy":
        """The strategy saved by ``state_dict`` (or its ``to_bytes`` form), ready to continue."""
        if isinstance(state, (bytes, bytearray)):
            with np.load(io.BytesIO(state), allow_pickle=False) as npz:
                state = {k: npz[k] for k in npz.files}
        if int(state["format"]) != STATE_FORMAT or str(state["library"]) != LIBRARY:
            raise ValueError(f"not a CMAStrategy state of format {STATE_FORMAT}")
        saved_version, version = str(state["library_version"]), _library_version()
        if saved_version != version:
            raise ValueError(f"CMA state was written with cmaes {saved_version}, this is cmaes {version}: "
                             "resuming across versions is not guaranteed to be identical")
        covariance = str(state["covariance"]) if "covariance" in state else "separable"
        strategy = cls(state["x0"], float(state["sigma0"]), int(state["population"]), int(state["seed"]),
                       bounds=state.get("bounds"), covariance=covariance)
        strategy._best_reward = float(state["best_reward"])
        strategy._best_x = state["best_x"].copy() if "best_x" in state else None
        strategy._pending = state["pending"].copy() if "pending" in state else None
        opt = strategy._opt
        expected = set(vars(opt))
        restored = {"_rng"}
        for key, value in state.items():
            if not key.startswith("opt."):
                continue
            name, kind = key[4:].rsplit(":", 1)
            if name not in expected:
                raise ValueError(f"CMA state has attribute {name!r} that this {type(opt).__name__} does not have")
            if kind == "none":
                setattr(opt, name, None)
            elif kind == "array":
                setattr(opt, name, value.copy())
            elif kind == "bool":
                setattr(opt, name, bool(value))
            elif kind == "int":
                setattr(opt, name, int(value))
            elif kind == "float":
                setattr(opt, name, float(value))
            elif kind == "np":
                setattr(opt, name, value[()])
            else:
                raise ValueError(f"CMA state: unknown kind {kind!r} for {name!r}")
            restored.add(name)
        if restored != expected:
            raise ValueError(f"CMA state lacks {type(opt).__name__} attributes {sorted(expected - restored)}")
        opt._rng.set_state((str(state["rng.kind"]), state["rng.keys"].copy(), int(state["rng.pos"]),
                            int(state["rng.has_gauss"]), float(state["rng.cached_gaussian"])))
        return strategy

    def to_bytes(self) -> bytes:
        """``state_dict`` as an uncompressed ``.npz`` (loadable without pickle)."""
        buf = io.BytesIO()
        np.savez(buf, **self.state_dict())
        return buf.getvalue()
