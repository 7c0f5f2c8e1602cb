"""Seeds and noise: everything is a pure function of (run seed, iteration, member, tensor).

Nothing random is stored: a member's noise is regenerated from its seed whenever it
is needed (perturb, subtract-restore, update), tensor by tensor.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch

NoiseVariant = Literal["iid", "correlated"]


def _hash_words(*words: int, n: int = 1) -> list[int]:
    """Well-mixed 32-bit words from integers (numpy's SeedSequence hash)."""
    return [int(w) for w in np.random.SeedSequence([int(w) for w in words]).generate_state(n, np.uint32)]


def member_seed(run_seed: int, iteration: int, member: int) -> int:
    """Seed of population member ``member`` at ``iteration`` of the run seeded ``run_seed``.

    Kept below 2**30 like the authors' seeds, so either noise variant can use it as is.
    """
    return _hash_words(run_seed, iteration, member)[0] & ((1 << 30) - 1)


#: Bit 30 of a member seed marks the mirrored member of an antithetic pair (member seeds are below 2**30).
MIRROR_BIT = 1 << 30


def mirror(seed: int) -> int:
    """The antithetic partner of member ``seed``: the same noise, negated (bit 30 set)."""
    if not 0 <= int(seed) < MIRROR_BIT:
        raise ValueError(f"member seed {seed} is not below 2**30, so it cannot be mirrored")
    return int(seed) | MIRROR_BIT


def noise_source(seed: int) -> tuple[int, bool]:
    """(the seed whose noise member ``seed`` draws, whether it negates that noise): a mirrored member draws its
    partner's noise and negates it; any other seed draws its own."""
    return int(seed) & ~MIRROR_BIT, bool(int(seed) & MIRROR_BIT)


def tensor_seed(seed: int, index: int, variant: NoiseVariant) -> int:
    """Generator seed for tensor ``index`` under member seed ``seed``.

    ``iid`` keys the generator on (seed, index), so tensors of the same shape get
    independent noise. ``correlated`` reseeds every tensor with ``seed`` itself, as the
    authors' released code does: same-shaped tensors then receive identical noise.
    """
    if variant == "iid":
        hi, lo = _hash_words(seed, index, n=2)
        return (hi << 32) | lo
    if variant == "correlated":
        return int(seed)
    raise ValueError(f"unknown noise variant {variant!r}; expected 'iid' or 'correlated'")


def noise_like(
    shape: Sequence[int],
    device: torch.device | str,
    seed: int,
    index: int,
    variant: NoiseVariant,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Standard normal float32 noise of ``shape`` on ``device`` for tensor ``index`` under ``seed``.

    What :func:`tensor_noise` returns for a tensor of that shape on that device; for code that
    holds only part of a tensor (a tensor-parallel shard) and regenerates the whole tensor's noise.
    A mirrored seed (:func:`mirror`) gets minus its partner's noise, exactly.
    """
    device = torch.device(device)
    gen = generator if generator is not None else torch.Generator(device=device)
    source, negate = noise_source(seed)
    gen.manual_seed(tensor_seed(source, index, variant))
    eps = torch.randn(tuple(shape), generator=gen, dtype=torch.float32, device=device)
    return eps.neg_() if negate else eps


def tensor_noise(
    param: torch.Tensor, seed: int, index: int, variant: NoiseVariant, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Standard normal float32 noise shaped like ``param``, on its device, for tensor ``index``."""
    return noise_like(param.shape, param.device, seed, index, variant, generator)
