"""ES operations on one copy of a model's weights: perturb, restore, update, checksum, resume state.

Every engine (transformers in-process, a Ray actor, a vLLM worker's tensor-parallel shard)
holds one :class:`ESWeights`; the noise is regenerated from seeds (:mod:`esrepro.perturb.ops`),
so an engine only ever receives seeds and scalars, and engines that apply the same
operations in the same order hold bit-identical weights, which :func:`checksum` proves.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Literal, Sequence

import torch

from esrepro.perturb.noise import NoiseVariant
from esrepro.perturb.ops import perturb_, update_

RestoreMode = Literal["exact", "subtract"]
PerturbFn = Callable[[Sequence[torch.Tensor], int, float, NoiseVariant], None]
UpdateFn = Callable[..., None]


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 24  # elements per step: bounded extra memory whatever the tensor's size
_MOD = 65521  # position weights 1..65521


def tensor_digest(t: torch.Tensor) -> bytes:
    """A 16-byte fingerprint of a tensor's bits, computed where the tensor lives (GPU or CPU).

    Two wrapping int64 sums over the raw bits: plain, and weighted by position. Integer sums
    are exact and order-free, so CPU and CUDA, any kernel, give the same value; any single
    changed element changes the first sum, and the weighted sum catches swaps. This compares
    engines every iteration at memory speed (a sha256 of a 7B model's bytes takes many
    seconds); checkpoints on disk are sha256-hashed by the manifests.
    """
    flat = t.detach().contiguous().reshape(-1)
    ints = flat.view(_INT_OF_WIDTH[flat.element_size()])
    plain = weighted = 0
    for start in range(0, ints.numel(), _CHUNK):
        x = ints[start : start + _CHUNK].to(torch.int64)
        pos = torch.arange(start, start + x.numel(), device=x.device, dtype=torch.int64) % _MOD + 1
        plain += int(x.sum())
        weighted += int((x * pos).sum())
    return (plain % 2**64).to_bytes(8, "little") + (weighted % 2**64).to_bytes(8, "little")


def combine_digests(entries: Iterable[tuple[str, torch.Tensor | tuple[torch.dtype, tuple[int, ...], bytes]]]) -> str:
    """The weights checksum from ``(name, tensor)`` or ``(name, (dtype, shape, digest))`` in HF order."""
    h = hashlib.sha256()
    for name, value in entries:
        if isinstance(value, torch.Tensor):
            value = (value.dtype, tuple(value.shape), tensor_digest(value))
        dtype, shape, digest = value
        h.update(f"{name}\0{str(dtype).removeprefix('torch.')}\0{','.join(map(str, shape))}\0".encode())
        h.update(digest)
    return h.hexdigest()


def hf_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A checksum of HF-layout weights (name, dtype, shape and bit fingerprint of each, in the order given).

    Every engine holding the same HF weights in the same dtype returns the same string,
    whatever it runs on (transformers or vLLM, any tensor-parallel size).
    """
    return combine_digests(named_tensors)


class ESWeights:
    """The ES state of one copy of the weights: the tensors changed in place, noise variant, restore mode, masters.

    ``perturb_fn``/``update_fn`` generate the noise for these tensors (default: one HF
    tensor per parameter, :mod:`esrepro.perturb.ops`; a vLLM shard passes its own). Exact
    restore copies back from the fp32 masters, or from a snapshot refreshed after every
    update (one copy of the weights, not one per member).
    """

    def __init__(self, params: Sequence[torch.Tensor], noise: NoiseVariant = "iid", restore: RestoreMode = "exact",
                 master_weights: Literal["float32"] | None = None, perturb_fn: PerturbFn = perturb_,
                 update_fn: UpdateFn = update_) -> None:
        if noise not in ("iid", "correlated"):
            raise ValueError(f"unknown noise variant {noise!r}; expected 'iid' or 'correlated'")
        if restore not in ("exact", "subtract"):
            raise ValueError(f"unknown restore mode {restore!r}; expected 'exact' or 'subtract'")
        if master_weights not in (None, "float32"):
            raise ValueError(f"unknown master_weights {master_weights!r}; expected None or 'float32'")
        self.params = list(params)
        self.noise, self.restore_mode = noise, restore
        self._perturb_fn, self._update_fn = perturb_fn, update_fn
        self.masters = [p.detach().to(torch.float32).clone() for p in self.params] if master_weights else None
        exact_copy = restore == "exact" and self.masters is None
        self._saved = [p.detach().clone() for p in self.params] if exact_copy else None
        self._perturbed: tuple[int, float] | None = None

    @torch.no_grad()
    def perturb(self, seed: int, sigma: float) -> None:
        """theta += sigma * eps(seed); the weights must not already be perturbed."""
        if self._perturbed is not None:
            raise RuntimeError(f"weights already perturbed with seed {self._perturbed[0]}; restore first")
        self._perturb_fn(self.params, seed, sigma, self.noise)
        self._perturbed = (seed, sigma)

    @torch.no_grad()
    def restore(self, seed: int, sigma: float) -> None:
        """Undo ``perturb(seed, sigma)``: copy back (exact) or subtract the same noise (the paper's)."""
        if self._perturbed != (seed, sigma):
            raise RuntimeError(f"restore({seed}, {sigma}) but the weights are perturbed with {self._perturbed}")
        if self.restore_mode == "exact":
            for p, s in zip(self.params, self.masters if self.masters is not None else self._saved, strict=True):
                p.copy_(s)
        else:
            self._perturb_fn(self.params, seed, -sigma, self.noise)
        self._perturbed = None

    @torch.no_grad()
    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> None:
        """theta += alpha / N * sum_n w_n * eps(seed_n), accumulated tensor by tensor in float32."""
        if self._perturbed is not None:
            raise RuntimeError(f"apply_update while perturbed with seed {self._perturbed[0]}; restore first")
        self._update_fn(self.params, list(seeds), [float(w) for w in weights], alpha, self.noise, self.masters)
        self._refresh()

    def _refresh(self) -> None:
        if self._saved is not None:
            for s, p in zip(self._saved, self.params, strict=True):
                s.copy_(p)

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors a resume needs: the weights and, with fp32 masters, the masters."""
        out = {f"p{k}": p.detach().cpu().contiguous() for k, p in enumerate(self.params)}
        if self.masters is not None:
            out.update({f"m{k}": m.detach().cpu().contiguous() for k, m in enumerate(self.masters)})
        return out

    @torch.no_grad()
    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Set the weights (and masters) from :meth:`state`'s tensors."""
        for k, p in enumerate(self.params):
            p.copy_(tensors[f"p{k}"])
        if self.masters is not None:
            for k, m in enumerate(self.masters):
                m.copy_(tensors[f"m{k}"])
        self._refresh()
        self._perturbed = None
