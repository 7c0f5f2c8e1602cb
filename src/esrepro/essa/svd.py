"""ESSA's search space: the top singular values of every LoRA adapter.

Each adapter's update ``scaling * B @ A`` is factorised once as ``U diag(S) V^T``
(thin SVD, singular values in descending order). The search space holds, for every
adapter, its top ``ceil(fraction * r)`` singular values (``selection="per_adapter"``,
our reading of the paper), or the largest ``ceil(fraction * total)`` over all adapters
together (``selection="global"``); a candidate is one flat float64 vector of them, and
``x0`` is the SFT values.

A candidate is applied to the merged SFT weights in residual form,

    W = W_merged_sft + U_sel diag(x - s_sel) V_sel^T        (per adapted module),

so at ``x = x0`` the weights are the SFT weights bit for bit (modules whose values are
unchanged are not touched at all) and the singular directions left out of the search
are never recomputed.

Precision: the factorisation and the corrections are computed in float64. The
adapter product has rank r (4-64), so the SVD is taken through thin QRs of ``B`` and
``A^T`` and an SVD of the r x r core, which costs O((out + in) r^2) instead of an
SVD of the full out x in matrix; float64 makes ``U diag(S) V^T`` reproduce
``scaling * B @ A`` to about 1e-15 relative, so an adapter rebuilt from a candidate
(``adapter_factors``) matches what was evaluated far below float32 resolution. The
corrected weight is ``W_sft + delta`` formed in float64 and rounded once to the
weight's dtype.

Every process of a run should load the same saved factorisation (``save``/``load``)
rather than recompute it: an SVD on other hardware may differ in the last bits.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Mapping

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from esrepro.essa.lora import LoraFactors, natural_key
from esrepro.io import atomic_path
from esrepro.runtime import numerics

Selection = Literal["per_adapter", "global"]
SPACE_FORMAT = 1


@dataclass(frozen=True)
class AdapterSVD:
    """``scaling * B @ A = U diag(S) V^T`` for one module, in float64.

    ``U`` is (out, k), ``S`` is (k,) descending, ``V`` is (in, k), with
    k = min(r, out, in); ``rank`` and ``scaling`` are the LoRA adapter's.
    """

    U: torch.Tensor
    S: torch.Tensor
    V: torch.Tensor
    rank: int
    scaling: float

    @property
    def shape(self) -> tuple[int, int]:
        """The adapted weight's shape (out_features, in_features)."""
        return int(self.U.shape[0]), int(self.V.shape[0])


def factorise(factors: LoraFactors) -> AdapterSVD:
    """Thin SVD of ``scaling * B @ A`` in float64, via QR of B and A^T and an SVD of the small core."""
    A = factors.A.detach().to("cpu", torch.float64)
    B = factors.B.detach().to("cpu", torch.float64)
    qb, rb = torch.linalg.qr(B)            # B = qb rb,    qb (out, kb)
    qa, ra = torch.linalg.qr(A.T)          # A^T = qa ra,  qa (in, ka)
    core = factors.scaling * (rb @ ra.T)   # (kb, ka)
    uc, s, vch = torch.linalg.svd(core, full_matrices=False)
    return AdapterSVD(U=qb @ uc, S=s, V=qa @ vch.T, rank=factors.rank, scaling=float(factors.scaling))


def selected_count(rank: int, fraction: float) -> int:
    """ceil(fraction * rank), robust to float error (0.7 * 10 gives 7, not 8)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction of singular values must be in (0, 1], got {fraction}")
    return max(1, math.ceil(fraction * rank - 1e-9))


class SingularValueSpace:
    """The flat search space over the selected singular values of all adapters.

    Modules are kept in natural layer order; module m owns ``x[slices[m]]``, which are its
    top ``counts[m]`` singular values (a prefix of ``S``, since ``S`` is descending).
    """

    def __init__(self, svds: Mapping[str, AdapterSVD], counts: Mapping[str, int],
                 fraction: float, selection: Selection):
        if set(svds) != set(counts):
            raise ValueError("svds and counts name different modules")
        self.names: tuple[str, ...] = tuple(sorted(svds, key=natural_key))
        self.svds = {n: svds[n] for n in self.names}
        self.counts = {n: int(counts[n]) for n in self.names}
        for n in self.names:
            if not 0 <= self.counts[n] <= self.svds[n].S.numel():
                raise ValueError(f"module {n!r}: {self.counts[n]} selected of {self.svds[n].S.numel()} singular values")
        self.fraction = float(fraction)
        self.selection: Selection = selection
        self.slices: dict[str, slice] = {}
        start = 0
        for n in self.names:
            self.slices[n] = slice(start, start + self.counts[n])
            start += self.counts[n]
        self.dim = start
        if self.dim == 0:
            raise ValueError("the search space selects no singular values")
        self._x0 = np.concatenate([self.svds[n].S[: self.counts[n]].numpy() for n in self.names]).astype(np.float64)

    @classmethod
    def build(cls, adapters: Mapping[str, LoraFactors], fraction: float,
              selection: Selection = "per_adapter") -> "SingularValueSpace":
        """Factorise every adapter and select its top singular values.

        ``per_adapter``: ceil(fraction * r) per module (at most min(r, out, in)).
        ``global``: the ceil(fraction * sum of k) largest over all modules (ties broken by
        module order, then index), which selects a prefix of each module's values.
        """
        if not adapters:
            raise ValueError("no adapters to build a singular value space from")
        svds = {n: factorise(f) for n, f in adapters.items()}
        if selection == "per_adapter":
            counts = {n: min(selected_count(s.rank, fraction), s.S.numel()) for n, s in svds.items()}
        elif selection == "global":
            names = sorted(svds, key=natural_key)
            pool = [(-float(v), i, j) for i, n in enumerate(names) for j, v in enumerate(svds[n].S.tolist())]
            keep = sorted(pool)[: selected_count(len(pool), fraction)]
            counts = {n: 0 for n in names}
            for _, i, _ in keep:
                counts[names[i]] += 1
        else:
            raise ValueError(f"selection must be 'per_adapter' or 'global', got {selection!r}")
        return cls(svds, counts, fraction, selection)

    @property
    def x0(self) -> np.ndarray:
        """The SFT singular values of the selection (a fresh copy)."""
        return self._x0.copy()

    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.dim,):
            raise ValueError(f"candidate has shape {x.shape}, the search space has dimension {self.dim}")
        if not np.all(np.isfinite(x)):
            raise ValueError("candidate has non-finite values")
        return x

    def split(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Per-module selected values of a flat candidate."""
        x = self._check(x)
        return {n: x[self.slices[n]].copy() for n in self.names}

    def join(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        """The flat candidate holding per-module selected values."""
        missing = set(self.names) - set(values)
        if missing:
            raise KeyError(f"values missing for modules {sorted(missing, key=natural_key)[:3]}")
        x = np.empty(self.dim, dtype=np.float64)
        for n in self.names:
            v = np.asarray(values[n], dtype=np.float64)
            if v.shape != (self.counts[n],):
                raise ValueError(f"module {n!r}: {v.shape} values, expected ({self.counts[n]},)")
            x[self.slices[n]] = v
        return x

    def changes(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """``x - s_sel`` per module, for the modules whose values differ from x0."""
        dx = self._check(x) - self._x0
        return {n: dx[self.slices[n]] for n in self.names if np.any(dx[self.slices[n]])}

    def selected_vectors(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(U_sel, V_sel)`` of one module: its top singular vectors, (out, k) and (in, k), float64."""
        svd, k = self.svds[name], self.counts[name]
        return svd.U[:, :k], svd.V[:, :k]

    def corrections(self, x: np.ndarray, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """``U_sel diag(x - s_sel) V_sel^T`` (float64) for every module whose values differ from x0."""
        out: dict[str, torch.Tensor] = {}
        for n, d in self.changes(x).items():
            U, V = (t.to(device) for t in self.selected_vectors(n))
            out[n] = _correction(U, V, d)
        return out

    def singular_values(self, x: np.ndarray) -> dict[str, torch.Tensor]:
        """Every module's full singular values under candidate x (unselected ones are the SFT values)."""
        x = self._check(x)
        out = {}
        for n in self.names:
            s = self.svds[n].S.clone()
            s[: self.counts[n]] = torch.from_numpy(x[self.slices[n]])
            out[n] = s
        return out

    def adapter_factors(self, x: np.ndarray, dtype: torch.dtype = torch.float32) -> dict[str, LoraFactors]:
        """LoRA factors (B', A') with the original rank and scaling whose update is the candidate's:
        ``scaling * B' @ A' = U diag(S') V^T`` with ``S'`` = x on the selection, SFT values elsewhere.

        B' = U diag(sqrt|S'|) / sqrt(scaling), A' = diag(sign(S') sqrt|S'|) V^T / sqrt(scaling),
        zero-padded to rank r where min(out, in) < r. Computed in float64, returned in ``dtype``.
        """
        return {n: self.module_factors(n, s_new, dtype) for n, s_new in self.singular_values(x).items()}

    def module_factors(self, name: str, values: torch.Tensor, dtype: torch.dtype = torch.float32) -> LoraFactors:
        """One module's LoRA factors (B', A') for its full singular values ``values`` (see ``adapter_factors``)."""
        svd = self.svds[name]
        root = numerics.sqrt(values.abs()) / math.sqrt(svd.scaling)
        Bp = svd.U * root
        Ap = (torch.sign(values) * root)[:, None] * svd.V.T
        k, r = values.numel(), svd.rank
        if k < r:
            Bp = torch.cat([Bp, Bp.new_zeros(Bp.shape[0], r - k)], dim=1)
            Ap = torch.cat([Ap, Ap.new_zeros(r - k, Ap.shape[1])], dim=0)
        return LoraFactors(A=Ap.to(dtype), B=Bp.to(dtype), scaling=svd.scaling)

    def save(self, path: str | Path) -> None:
        """Write the factorisation and selection to one safetensors file (atomically)."""
        tensors = {}
        for i, n in enumerate(self.names):
            svd = self.svds[n]
            tensors[f"{i}.U"], tensors[f"{i}.S"], tensors[f"{i}.V"] = (
                svd.U.contiguous(), svd.S.contiguous(), svd.V.contiguous())
        meta = {
            "format": SPACE_FORMAT,
            "fraction": self.fraction,
            "selection": self.selection,
            "modules": [{"name": n, "count": self.counts[n], "rank": self.svds[n].rank,
                         "scaling": self.svds[n].scaling} for n in self.names],
        }
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={"essa_space": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | Path) -> "SingularValueSpace":
        """Read a factorisation written by ``save``."""
        from safetensors import safe_open

        from esrepro.io import reading

        with reading(path, "the singular value space"), safe_open(str(path), framework="pt") as fh:
            raw = (fh.metadata() or {}).get("essa_space")
        if raw is None:
            raise ValueError(f"{path}: not an ESSA singular value space (no 'essa_space' metadata)")
        meta = json.loads(raw)
        if meta.get("format") != SPACE_FORMAT:
            raise ValueError(f"{path}: space format {meta.get('format')}, this code reads {SPACE_FORMAT}")
        with reading(path, "the singular value space"):
            tensors = load_file(str(path))
        svds, counts = {}, {}
        for i, m in enumerate(meta["modules"]):
            svds[m["name"]] = AdapterSVD(U=tensors[f"{i}.U"], S=tensors[f"{i}.S"], V=tensors[f"{i}.V"],
                                         rank=int(m["rank"]), scaling=float(m["scaling"]))
            counts[m["name"]] = int(m["count"])
        return cls(svds, counts, meta["fraction"], meta["selection"])


def _correction(U: torch.Tensor, V: torch.Tensor, d: np.ndarray) -> torch.Tensor:
    """U diag(d) V^T on U's device, in U's dtype."""
    return (U * torch.from_numpy(d).to(U.device, U.dtype)) @ V.T


class _Candidates:
    """``with applier.candidate(x):`` the model carries candidate x inside the block, the SFT state after it."""

    def apply(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def candidate(self, x: np.ndarray) -> Iterator[None]:
        self.apply(x)
        try:
            yield
        finally:
            self.restore()


class CandidateApplier(_Candidates):
    """Applies candidates in place to a transformers model holding the merged SFT weights.

    On construction it keeps a copy of every adapted module's weight (``W_merged_sft``);
    ``apply(x)`` first restores any module a previous candidate changed, then sets
    ``W = round(W_sft + U_sel diag(x - s_sel) V_sel^T)`` for the modules whose values
    differ from x0; ``restore()`` copies the saved weights back (bit-exact). Only the
    adapted modules' weights are ever written.
    """

    def __init__(self, model: torch.nn.Module, space: SingularValueSpace):
        params = dict(model.named_parameters())
        self.model = model
        self.space = space
        self.weights: dict[str, torch.Tensor] = {}
        for n in space.names:
            key = f"{n}.weight"
            if key not in params:
                raise KeyError(f"the model has no parameter {key!r} for adapted module {n!r}")
            w = params[key]
            if tuple(w.shape) != space.svds[n].shape:
                raise ValueError(f"module {n!r}: model weight {tuple(w.shape)}, adapter {space.svds[n].shape}")
            self.weights[n] = w
        self.saved = {n: w.detach().clone() for n, w in self.weights.items()}
        # the selected singular vectors, once, on each weight's device
        self.vectors = {n: tuple(t.to(self.weights[n].device) for t in space.selected_vectors(n)) for n in space.names}
        self.modified: set[str] = set()

    @torch.no_grad()
    def restore(self) -> None:
        """Put the SFT weights back into every module a candidate changed (bit-exact)."""
        for n in sorted(self.modified, key=natural_key):
            self.weights[n].copy_(self.saved[n])
        self.modified.clear()

    @torch.no_grad()
    def apply(self, x: np.ndarray) -> None:
        """Set the model's adapted weights to candidate x (replacing any earlier candidate)."""
        changes = self.space.changes(x)
        self.restore()
        for n, d in changes.items():
            w = self.weights[n]
            new = self.saved[n].to(torch.float64) + _correction(*self.vectors[n], d)
            w.copy_(new.to(w.dtype))
            self.modified.add(n)



class AdapterApplier(_Candidates):
    """Applies candidates to a peft model whose LoRA adapters stay unmerged (a quantised base underneath).

    ``apply(x)`` rewrites ``lora_A``/``lora_B`` of the modules whose values differ from x0
    with the rebuilt factors (``module_factors``, rounded once to the adapter's dtype);
    ``restore()`` copies the SFT adapter's factors back (bit-exact). The base weights are
    never touched, so an INT8/INT4 base stays as bitsandbytes quantised it. Same interface
    as :class:`CandidateApplier`.
    """

    def __init__(self, model: torch.nn.Module, space: SingularValueSpace, adapter: str = "default"):
        modules = dict(model.named_modules())
        self.model = model
        self.space = space
        self.factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for n in space.names:
            found = [m for key, m in modules.items() if key.endswith(n) and hasattr(m, "lora_A")]
            if len(found) != 1:
                raise KeyError(f"the model has {len(found)} LoRA modules for adapted module {n!r}, expected 1")
            layer = found[0]
            A, B = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            out_f, in_f = space.svds[n].shape
            if B.shape[0] != out_f or A.shape[1] != in_f or A.shape[0] != B.shape[1]:
                raise ValueError(f"module {n!r}: adapter A {tuple(A.shape)}, B {tuple(B.shape)} do not fit the space")
            self.factors[n] = (A, B)
        self.saved = {n: (A.detach().clone(), B.detach().clone()) for n, (A, B) in self.factors.items()}
        self.modified: set[str] = set()

    @torch.no_grad()
    def restore(self) -> None:
        """Put the SFT adapter factors back into every module a candidate changed (bit-exact)."""
        for n in sorted(self.modified, key=natural_key):
            (A, B), (A0, B0) = self.factors[n], self.saved[n]
            A.copy_(A0)
            B.copy_(B0)
        self.modified.clear()

    @torch.no_grad()
    def apply(self, x: np.ndarray) -> None:
        """Set the adapters to candidate x (replacing any earlier candidate)."""
        changed = self.space.changes(x)
        values = self.space.singular_values(x)
        self.restore()
        for n in changed:
            A, B = self.factors[n]
            f = self.space.module_factors(n, values[n], dtype=torch.float64)
            A.copy_(f.A.to(A.device, A.dtype))
            B.copy_(f.B.to(B.device, B.dtype))
            self.modified.add(n)

