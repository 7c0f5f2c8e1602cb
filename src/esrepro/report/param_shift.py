"""The paper's Figures 7-9 (v1; 8-10 in v2): histograms of |theta_final - theta_base| against a random walk.

The paper (Appendix "Parameter Magnitude Shifts by Evolutionary fine-tuning") shows, per
model, the histogram of the absolute parameter shifts Delta "overlaid with random walk"
(left) and "the difference between Delta and the random walk" (right). It does not define
the walk. The one it can mean, since ES's shifts "deviate very little" from it, is the walk
ES itself would make if its rewards carried no information about its noise:

    theta_t = theta_{t-1} + alpha / N * sum_n z_n eps_n,    eps_n ~ N(0, I) iid, z independent of eps.

Given the z's, each coordinate's step is normal with variance (alpha/N)^2 * sum_n z_n^2;
steps are independent across iterations (fresh seeds), so after T iterations each coordinate
has moved by N(0, s^2) with

    s = alpha / N * sqrt(sum_t sum_n z_{t,n}^2),

and |Delta| is half-normal with scale s. The authors z-score with the population std
(numpy's default; ``esrepro.perturb.ops.zscore``), so sum_n z_n^2 = N exactly (0 in an
iteration whose rewards are all equal) and s = alpha * sqrt(T / N): 2.04e-3 for the paper's
alpha = 5e-4, T = 500, N = 30. With the sample std it would be N - 1 per iteration. The
paper's "learning rate digestion" (alpha absorbs 1/sigma) does not change this: alpha is the
coefficient actually applied, and sigma does not enter. The alternative, a walk of T steps
of sigma * eps (the perturbation scale), has s = sigma * sqrt(T) = 2.2e-2, ten times ES's
scale, so it could not "deviate very little" from ES's shifts. :class:`RandomWalk` holds
both; :meth:`RandomWalk.from_run` takes the exact sum of z^2 from a run's log. A run with EGGROLL's recipe options
(:mod:`esrepro.es.strategy`) walks by its own weights and step: alpha' / N * sqrt(sum_t sum_j v_j^2), v its shaped
weights, or with antithetic pairs the difference of each pair's two weights (one draw of noise per pair).

What the walk leaves out: with the authors' "correlated" noise (every tensor reseeded with
the member's seed) same-shaped tensors move identically; each coordinate's law, hence the
expected histogram, is unchanged, but the counts scatter more around it. In bf16 without
float32 master weights, a step below half an ulp of a weight rounds away, so the observed
histogram has extra exact zeros and fewer small shifts than the walk (the paper's
"precision issues around zero"); the figure reports the unchanged share apart.

Counting is streamed: tensor by tensor, in row chunks read with safetensors' lazy slices,
so a 7B checkpoint never sits in memory. Counts are float64; exact zeros (unchanged
parameters, common in bf16, where a small step rounds away), values below and above the
bin range, and non-finite values are counted apart from the bins.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from esrepro.io import read_json, read_jsonl, write_json
from esrepro.report.figures import save_figure, write_frame_csv

PathLike = str | os.PathLike
BinKind = Literal["linear", "log"]

DEFAULT_CHUNK = 1 << 24  # elements per slice read: 128 MiB of float64 per operand


# --- the random-walk reference ----------------------------------------------------------
@dataclass(frozen=True)
class RandomWalk:
    """T steps of ``alpha / N * sum_n z_n eps_n`` with z unrelated to eps; ``sum_z2`` = sum over all z^2.

    A walk of plain ``sigma * eps`` steps is the case N = 1, z = 1, alpha = sigma.
    """

    steps: int
    population: int
    alpha: float
    sum_z2: float
    label: str = "random walk"

    def __post_init__(self) -> None:
        if self.steps < 0 or self.population < 1 or not self.alpha > 0 or self.sum_z2 < 0:
            raise ValueError(f"RandomWalk needs steps >= 0, population >= 1, alpha > 0, sum_z2 >= 0; got {self}")

    @property
    def scale(self) -> float:
        """Per-coordinate std of the total displacement: ``alpha / N * sqrt(sum_z2)``."""
        return self.alpha / self.population * math.sqrt(self.sum_z2)

    @classmethod
    def es(cls, alpha: float, population: int, steps: int, ddof: int = 0) -> "RandomWalk":
        """ES's walk with z-scores from the population std (``ddof=0``: sum z^2 = N per step) or sample std."""
        if ddof not in (0, 1):
            raise ValueError(f"ddof must be 0 (population std) or 1 (sample std), got {ddof}")
        return cls(steps, population, alpha, float(steps * (population - ddof)),
                   f"ES random walk (T={steps}, N={population}, alpha={alpha:g})")

    @classmethod
    def es_from_log(cls, log_rows: Sequence[Mapping], alpha: float, population: int,
                    recipe: Mapping | None = None) -> "RandomWalk":
        """ES's walk with the exact sum of z^2 of a run: each log row's ``rewards`` z-scored as the trainer does.

        ``recipe``: the run's settings ``sigma``, ``antithetic``, ``fitness`` and ``step`` (EGGROLL's options,
        :mod:`esrepro.es.strategy`; absent: ES's). The weights are then shaped as the trainer shapes them, a
        mirrored pair's one draw of noise counts once with its weights' difference ((w_2j - w_2j+1) eps_j), and the
        step is the update's alpha' / N.
        """
        from esrepro.es.strategy import ESStrategy

        r = dict(recipe or {})
        strategy = ESStrategy(population, float(r.get("sigma", 1.0)), alpha, 0, antithetic=bool(r.get("antithetic")),
                              fitness=r.get("fitness", "zscore"), step=r.get("step", "alpha_over_n"))
        total = 0.0
        for i, row in enumerate(log_rows):
            rewards = row.get("rewards")
            if rewards is None or len(rewards) != population:
                raise ValueError(f"log row {i}: expected {population} member rewards under 'rewards', "
                                 f"got {rewards!r:.80}")
            w = strategy.weights(rewards).astype(np.float64)
            if strategy.antithetic:
                w = w[0::2] - w[1::2]
            total += float(np.sum(w ** 2))
        return cls(len(log_rows), population, strategy.update_alpha(population), total,
                   f"ES random walk (T={len(log_rows)}, N={population}, alpha={alpha:g})")

    @classmethod
    def plain(cls, sigma: float, steps: int) -> "RandomWalk":
        """T steps of ``sigma * eps``: the perturbation-scale walk (not ES's; see the module docstring)."""
        return cls(steps, 1, sigma, float(steps), f"random walk of sigma steps (T={steps}, sigma={sigma:g})")

    @classmethod
    def from_run(cls, run_dir: PathLike) -> "RandomWalk":
        """ES's walk for an ES run directory: alpha and N from ``manifest.json``, z's from ``log.jsonl``."""
        run = Path(run_dir)
        settings = read_json(run / "manifest.json").get("settings", {})
        missing = [k for k in ("alpha", "population") if k not in settings]
        if missing:
            raise ValueError(f"{run / 'manifest.json'}: settings lack {', '.join(missing)} (not an ES run?)")
        log = read_jsonl(run / "log.jsonl")
        alpha, population = float(settings["alpha"]), int(settings["population"])
        if log and all("rewards" in r for r in log):
            return cls.es_from_log(log, alpha, population, settings)
        recipe = {k: settings[k] for k in ("antithetic", "fitness", "step") if k in settings}
        if recipe:
            raise ValueError(f"{run / 'log.jsonl'}: no member rewards, which the walk of EGGROLL's recipe "
                             f"({recipe}) needs")
        return cls.es(alpha, population, len(log))


# --- bins and histograms --------------------------------------------------------------
@dataclass(frozen=True)
class Bins:
    """``n`` half-open bins [e_i, e_{i+1}) between ``lo`` and ``hi``, linear or log-spaced."""

    kind: BinKind
    lo: float
    hi: float
    n: int

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "log"):
            raise ValueError(f"bin kind must be 'linear' or 'log', got {self.kind!r}")
        if self.n < 1 or not self.hi > self.lo or self.lo < 0 or (self.kind == "log" and self.lo <= 0):
            raise ValueError(f"bad bins {self}: need n >= 1, hi > lo >= 0 (lo > 0 for log bins)")

    def edges(self) -> np.ndarray:
        if self.kind == "linear":
            return np.linspace(self.lo, self.hi, self.n + 1)
        return np.geomspace(self.lo, self.hi, self.n + 1)

    @classmethod
    def for_scale(cls, scale: float, kind: BinKind = "linear", n: int = 100) -> "Bins":
        """Bins sized to a walk of scale ``s``: [0, 5 s) linear, or [1e-4 s, 10 s) log-spaced."""
        if not scale > 0:
            raise ValueError(f"the walk's scale must be > 0 to size bins, got {scale}")
        return cls("linear", 0.0, 5.0 * scale, n) if kind == "linear" else cls("log", 1e-4 * scale, 10.0 * scale, n)


@dataclass
class DeltaHistogram:
    """Counts of |delta| over parameters: per bin, plus exact zeros, below/above range, non-finite."""

    bins: Bins
    counts: np.ndarray = field(repr=False)
    zero: float = 0.0
    underflow: float = 0.0
    overflow: float = 0.0
    nonfinite: float = 0.0
    n_params: int = 0
    n_tensors: int = 0
    sum_abs: float = 0.0
    sum_sq: float = 0.0
    max_abs: float = 0.0

    @classmethod
    def empty(cls, bins: Bins) -> "DeltaHistogram":
        return cls(bins, np.zeros(bins.n, dtype=np.float64))

    @property
    def rms(self) -> float:
        finite = self.n_params - self.nonfinite
        return math.sqrt(self.sum_sq / finite) if finite else math.nan

    def add(self, absdelta) -> None:
        """Count |delta| values: a float64 torch tensor (any device) or anything numpy can read.

        Bin i holds edges[i] <= x < edges[i + 1] (``torch.bucketize(right=True)``, as
        ``np.searchsorted(side="right")``); exact zeros are counted apart, not in a bin.
        """
        import torch

        d = absdelta if isinstance(absdelta, torch.Tensor) else torch.from_numpy(np.asarray(absdelta))
        d = d.to(torch.float64).reshape(-1)
        self.n_params += d.numel()
        finite = torch.isfinite(d)
        n_finite = int(finite.sum())
        if n_finite != d.numel():
            self.nonfinite += float(d.numel() - n_finite)
            d = d[finite]
        if d.numel() == 0:
            return
        edges = torch.from_numpy(self.bins.edges()).to(d.device)
        zeros = int((d == 0.0).sum())
        ext = torch.bincount(torch.bucketize(d, edges, right=True), minlength=self.bins.n + 2)
        ext = ext.to(torch.float64).cpu().numpy()
        ext[int(np.searchsorted(self.bins.edges(), 0.0, side="right"))] -= zeros  # zeros are not in a bin
        self.zero += float(zeros)
        self.underflow += ext[0]
        self.counts += ext[1:-1]
        self.overflow += ext[-1]
        self.sum_abs += float(d.sum())
        self.sum_sq += float(torch.dot(d, d))
        self.max_abs = max(self.max_abs, float(d.max()))

    def to_dict(self) -> dict:
        return {"bins": asdict(self.bins), "counts": self.counts.tolist(),
                **{k: getattr(self, k) for k in ("zero", "underflow", "overflow", "nonfinite", "n_params",
                                                 "n_tensors", "sum_abs", "sum_sq", "max_abs")}}

    @classmethod
    def from_dict(cls, d: Mapping) -> "DeltaHistogram":
        bins = Bins(**d["bins"])
        counts = np.asarray(d["counts"], dtype=np.float64)
        if counts.shape != (bins.n,):
            raise ValueError(f"histogram has {counts.size} counts for {bins.n} bins")
        return cls(bins, counts, **{k: d[k] for k in ("zero", "underflow", "overflow", "nonfinite", "n_params",
                                                      "n_tensors", "sum_abs", "sum_sq", "max_abs")})


# --- streaming over two checkpoints ------------------------------------------------------
def checkpoint_tensors(model_dir: PathLike) -> dict[str, Path]:
    """Tensor name -> safetensors file of an HF checkpoint directory (sharded via its index, or not)."""
    from safetensors import safe_open

    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.exists():
        return {name: root / fname for name, fname in read_json(index)["weight_map"].items()}
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root}: no *.safetensors files (not an HF safetensors checkpoint)")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(f, framework="pt") as fh:
            for name in fh.keys():
                if name in out:
                    raise ValueError(f"{root}: tensor {name!r} is in both {out[name].name} and {f.name}")
                out[name] = f
    return out


def _row_chunks(shape: Sequence[int], chunk_elems: int) -> list[slice] | None:
    """Row slices of at most ``chunk_elems`` elements; None when the tensor fits in one chunk."""
    numel = int(np.prod(shape)) if len(shape) else 1
    if numel <= chunk_elems or len(shape) == 0:
        return None
    per_row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    rows = max(1, chunk_elems // per_row)
    return [slice(i, min(i + rows, shape[0])) for i in range(0, shape[0], rows)]


def histogram_checkpoints(
    base_dir: PathLike,
    final_dir: PathLike,
    bins: Bins,
    chunk_elems: int = DEFAULT_CHUNK,
    skip: Iterable[str] = (),
    device: str = "cpu",
) -> DeltaHistogram:
    """Histogram of |final - base| over every tensor both checkpoints hold, in float64, chunk by chunk.

    Tensors are visited in name order and read in row slices of at most ``chunk_elems``
    elements, so memory stays at a few chunks whatever the model size. The two checkpoints
    must hold the same tensor names (minus ``skip``) with the same shapes; dtypes may differ.
    ``device="cuda"`` does the arithmetic on the GPU (same counts; reading stays on the CPU).
    """
    import torch
    from safetensors import safe_open

    a_map, b_map = checkpoint_tensors(base_dir), checkpoint_tensors(final_dir)
    skip = set(skip)
    a_names, b_names = set(a_map) - skip, set(b_map) - skip
    if a_names != b_names:
        only_a, only_b = sorted(a_names - b_names), sorted(b_names - a_names)
        raise ValueError(f"checkpoints differ in tensors: only in {base_dir}: {only_a[:5]}"
                         f"{' ...' if len(only_a) > 5 else ''}; only in {final_dir}: {only_b[:5]}"
                         f"{' ...' if len(only_b) > 5 else ''}")
    hist = DeltaHistogram.empty(bins)
    handles: dict[Path, object] = {}
    try:
        for name in sorted(a_names):
            fa = handles.setdefault(a_map[name], safe_open(a_map[name], framework="pt").__enter__())
            fb = handles.setdefault(b_map[name], safe_open(b_map[name], framework="pt").__enter__())
            sa, sb = fa.get_slice(name), fb.get_slice(name)
            shape_a, shape_b = list(sa.get_shape()), list(sb.get_shape())
            if shape_a != shape_b:
                raise ValueError(f"tensor {name!r}: shape {shape_a} in {base_dir} but {shape_b} in {final_dir}")
            chunks = _row_chunks(shape_a, chunk_elems)
            if chunks is None:
                pairs = [(fa.get_tensor(name), fb.get_tensor(name))]
            else:
                pairs = ((sa[c], sb[c]) for c in chunks)
            for ta, tb in pairs:
                hist.add((tb.to(device, torch.float64) - ta.to(device, torch.float64)).abs_())
            hist.n_tensors += 1
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)
    return hist


# --- the reference, closed form and sampled ------------------------------------------------
def half_normal_counts(bins: Bins, n_params: int, scale: float) -> DeltaHistogram:
    """Expected counts of |X| for n_params iid X ~ N(0, scale^2), in ``bins`` (and below / above them).

    P(a <= |X| < b) = erfc(a / (s sqrt 2)) - erfc(b / (s sqrt 2)) (erfc keeps the tails accurate).
    """
    if scale == 0:  # a walk that never moved (every iteration's rewards equal): all mass at 0
        ref = DeltaHistogram.empty(bins)
        ref.zero, ref.n_params = float(n_params), n_params
        return ref
    if not scale > 0:
        raise ValueError(f"the walk's scale must be >= 0, got {scale}")
    tail = np.array([math.erfc(e / (scale * math.sqrt(2.0))) for e in bins.edges()])
    ref = DeltaHistogram.empty(bins)
    ref.counts = n_params * (tail[:-1] - tail[1:])
    ref.underflow = n_params * (1.0 - tail[0])
    ref.overflow = n_params * tail[-1]
    ref.n_params = n_params
    ref.sum_sq = n_params * scale**2
    ref.sum_abs = n_params * scale * math.sqrt(2.0 / math.pi)
    return ref


def simulate_walk(n_coords: int, walk: RandomWalk, seed: int, chunk: int = 1 << 16) -> np.ndarray:
    """Displacements of ``n_coords`` coordinates after ``walk.steps`` real ES updates on unrelated rewards.

    Each step draws N rewards independent of everything (standard normal), z-scores them as
    the trainer does (:func:`esrepro.perturb.ops.zscore`; z = 1 when N = 1) and adds
    ``alpha / N * sum_n z_n eps_n`` with fresh eps. Cost: steps x N x n_coords normal draws,
    so this is for checking the closed form on small counts. Seeded: bit-identical per seed.
    """
    from esrepro.perturb.ops import zscore

    zrng = np.random.default_rng(np.random.SeedSequence([int(seed), 1]))
    n = walk.population
    zs = [np.ones(1) if n == 1 else zscore(zrng.standard_normal(n)).astype(np.float64) for _ in range(walk.steps)]
    out = np.zeros(n_coords, dtype=np.float64)
    for c, start in enumerate(range(0, n_coords, chunk)):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2, c]))  # one stream per chunk
        stop = min(start + chunk, n_coords)
        acc = np.zeros(stop - start)
        for z in zs:
            acc += z @ rng.standard_normal((n, stop - start))
        out[start:stop] = walk.alpha / n * acc
    return out


def sampled_walk_histogram(
    bins: Bins, n_params: int, walk: RandomWalk, seed: int, max_coords: int = 200_000
) -> DeltaHistogram:
    """Histogram of a simulated walk on min(n_params, max_coords) coordinates, counts scaled to n_params."""
    m = min(n_params, max_coords)
    hist = DeltaHistogram.empty(bins)
    hist.add(np.abs(simulate_walk(m, walk, seed)))
    factor = n_params / m
    hist.counts *= factor
    for k in ("zero", "underflow", "overflow", "nonfinite", "sum_abs", "sum_sq"):
        setattr(hist, k, getattr(hist, k) * factor)
    hist.n_params = n_params
    return hist


def ks_distance_half_normal(values: np.ndarray, scale: float) -> float:
    """Kolmogorov-Smirnov distance between the empirical law of |values| and half-normal(scale).

    Written out (a sort and erf) because scipy is not a dependency of the project.
    """
    x = np.sort(np.abs(np.asarray(values, dtype=np.float64)))
    n = x.size
    cdf = np.array([math.erf(v / (scale * math.sqrt(2.0))) for v in x])
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n)))


# --- pipeline entry points ----------------------------------------------------------------
def build_shift_histogram(
    base_dir: PathLike,
    final_dir: PathLike,
    out_json: PathLike,
    walk: RandomWalk,
    label: str,
    bins: Bins | None = None,
    chunk_elems: int = DEFAULT_CHUNK,
    device: str = "cpu",
) -> Path:
    """Count |final - base| of one run (bins sized to ``walk`` unless given) and write it with its walk as JSON."""
    bins = bins or Bins.for_scale(walk.scale)
    hist = histogram_checkpoints(base_dir, final_dir, bins, chunk_elems, device=device)
    write_json(out_json, {"label": label, "base": str(base_dir), "final": str(final_dir),
                          "walk": asdict(walk), "histogram": hist.to_dict()})
    return Path(out_json)


def read_shift_histogram(path: PathLike) -> tuple[str, DeltaHistogram, RandomWalk]:
    """(label, histogram, walk) from a :func:`build_shift_histogram` JSON."""
    rec = read_json(path)
    missing = [k for k in ("label", "walk", "histogram") if k not in rec]
    if missing:
        raise ValueError(f"{path}: shift-histogram JSON lacks {', '.join(missing)}")
    return rec["label"], DeltaHistogram.from_dict(rec["histogram"]), RandomWalk(**rec["walk"])


def shift_table(panels: Sequence[tuple[str, DeltaHistogram, RandomWalk, DeltaHistogram | None]]) -> pd.DataFrame:
    """The plotted numbers: per run and bin, observed and expected counts and their difference."""
    rows = []
    for label, hist, walk, sampled in panels:
        ref = half_normal_counts(hist.bins, hist.n_params, walk.scale)
        edges = hist.bins.edges()
        spans = [("zero", 0.0, 0.0, hist.zero, ref.zero, sampled.zero if sampled else math.nan),
                 ("underflow", 0.0, edges[0], hist.underflow, ref.underflow,
                  sampled.underflow if sampled else math.nan)]
        spans += [(f"{i}", edges[i], edges[i + 1], hist.counts[i], ref.counts[i],
                   sampled.counts[i] if sampled else math.nan) for i in range(hist.bins.n)]
        spans.append(("overflow", edges[-1], math.inf, hist.overflow, ref.overflow,
                      sampled.overflow if sampled else math.nan))
        for name, lo, hi, obs, exp, smp in spans:
            rows.append({"label": label, "bin": name, "lo": lo, "hi": hi, "observed": obs, "walk_expected": exp,
                         "walk_sampled": smp, "difference": obs - exp, "n_params": hist.n_params,
                         "walk_scale": walk.scale})
    return pd.DataFrame(rows)


def shift_figure(
    panels: Sequence[tuple[str, DeltaHistogram, RandomWalk, DeltaHistogram | None]],
    out_stem: PathLike,
    title: str = "Parameter shifts |θ_final − θ_base| against a random walk",
) -> list[Path]:
    """One row per run: observed fraction of parameters per bin vs the walk's (left), their difference (right)."""
    if not panels:
        raise ValueError("shift_figure: no histograms")
    fig = Figure(figsize=(13.5, 3.1 * len(panels) + 0.6), layout="constrained")
    axes = fig.subplots(len(panels), 2, squeeze=False)
    for (ax, dax), (label, hist, walk, sampled) in zip(axes, panels, strict=True):
        n = hist.n_params
        ref = half_normal_counts(hist.bins, n, walk.scale)
        edges = hist.bins.edges()
        centers = np.sqrt(edges[:-1] * edges[1:]) if hist.bins.kind == "log" else 0.5 * (edges[:-1] + edges[1:])
        ax.stairs(hist.counts / n, edges, fill=True, color="C0", alpha=0.35, label="observed |Δ|")
        ax.stairs(hist.counts / n, edges, color="C0", linewidth=1.0)
        ax.plot(centers, ref.counts / n, color="k", linewidth=1.3,
                label=f"{walk.label}: half-normal, s={walk.scale:.3g}")
        if sampled is not None:
            ax.plot(centers, sampled.counts / n, "o", color="C3", markersize=2.5, label="simulated walk (seeded)")
        diff = (hist.counts - ref.counts) / n
        dax.bar(edges[:-1], diff, width=np.diff(edges), align="edge",
                color=np.where(diff >= 0, "C2", "C3"), linewidth=0)
        dax.axhline(0.0, color="0.2", linewidth=0.8)
        for a in (ax, dax):
            if hist.bins.kind == "log":
                a.set_xscale("log")
            a.set_xlabel("|θ_final − θ_base| (parameter units)")
            a.grid(True, alpha=0.3)
        ax.set_ylabel("fraction of parameters per bin")
        dax.set_ylabel("observed − walk (fraction per bin)")
        ax.set_title(f"{label}: |Δ| and the random walk", fontsize="medium")
        dax.set_title(f"{label}: difference", fontsize="medium")
        ax.legend(loc="upper right", fontsize="x-small")
        pct = lambda v: 100.0 * v / n if n else math.nan  # noqa: E731, B023 - used in this iteration only
        ratio = f"{hist.rms / walk.scale:.3f}" if walk.scale > 0 else "n/a (the walk never moved)"
        note = (f"{n:,} parameters; RMS |Δ| / s = {ratio}\n"
                f"unchanged (Δ = 0): {pct(hist.zero):.2f}%\n"
                f"below range: {pct(hist.underflow):.2f}% (walk {pct(ref.underflow):.2f}%)\n"
                f"above range: {pct(hist.overflow):.2f}% (walk {pct(ref.overflow):.2f}%)")
        dax.text(1.03, 1.0, note, transform=dax.transAxes, ha="left", va="top", fontsize="x-small",
                 bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"})
    fig.suptitle(title)
    return save_figure(fig, out_stem)


def build_param_shift(
    histogram_paths: Sequence[PathLike],
    out_stem: PathLike,
    sampled_coords: int | None = None,
    seed: int = 0,
    title: str = "Parameter shifts |θ_final − θ_base| against a random walk",
) -> list[Path]:
    """Figure (PNG, PDF) and CSV from :func:`build_shift_histogram` JSONs, one row per run.

    ``sampled_coords``: also simulate each row's walk on that many coordinates (seeded by
    ``seed``), scaled to the run's parameter count, to check the closed form.
    """
    panels = []
    for path in histogram_paths:
        label, hist, walk = read_shift_histogram(path)
        sampled = (sampled_walk_histogram(hist.bins, hist.n_params, walk, seed, sampled_coords)
                   if sampled_coords else None)
        panels.append((label, hist, walk, sampled))
    paths = shift_figure(panels, out_stem, title=title)
    return [*paths, write_frame_csv(shift_table(panels), Path(f"{out_stem}.csv"))]
