"""Seeds and noise: everything is a pure function of (run seed, iteration, member, tensor).

Nothing random is stored: a member's noise is regenerated from its seed whenever it
is needed (perturb, subtract-restore, update), tensor by tensor.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch

NoiseVariant = Literal["iid", "correlated"]

#: Elements drawn per call of CUDA's normal kernel. That kernel (ATen's DistributionTemplates.h,
#: ``calc_execution_policy``) launches ceil(n / 256) blocks of 256 threads, capped at the GPU's SMs x
#: (threads per SM / 256); below the cap, element i is the first normal of Philox(seed, subsequence i,
#: offset), and every call advances the offset by 4, whatever the GPU. Above it, a thread draws several
#: elements and the values depend on the SM count (an H100 PCIe has 114 SMs, an SXM 132). So noise is drawn in
#: chunks of this size: the same bits on every GPU with at least CUDA_NOISE_CHUNK threads in all (64 SMs of
#: 2,048 threads: V100, A100, H100, H200, B200, L40S).
CUDA_NOISE_CHUNK = 1 << 17


def _hash_words(*words: int, n: int = 1) -> list[int]:
    """Well-mixed 32-bit words from integers (numpy's SeedSequence hash)."""
    return [int(w) for w in np.random.SeedSequence([int(w) for w in words]).generate_state(n, np.uint32)]


def member_seed(run_seed: int, iteration: int, member: int) -> int:
    """Seed of population member ``member`` at ``iteration`` of the run seeded ``run_seed``.

    Kept below 2**30 like the authors' seeds, so either noise variant can use it as is.
    """
    return _hash_words(run_seed, iteration, member)[0] & ((1 << 30) - 1)


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
    """
    device = torch.device(device)
    gen = generator if generator is not None else torch.Generator(device=device)
    gen.manual_seed(tensor_seed(seed, index, variant))
    if device.type != "cuda":
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32, device=device)
    out = torch.empty(tuple(shape), dtype=torch.float32, device=device)
    flat = out.view(-1)
    for start in range(0, flat.numel(), CUDA_NOISE_CHUNK):  # see CUDA_NOISE_CHUNK: bits independent of the SMs
        flat[start:start + CUDA_NOISE_CHUNK].normal_(generator=gen)
    return out


def tensor_noise(
    param: torch.Tensor, seed: int, index: int, variant: NoiseVariant, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Standard normal float32 noise shaped like ``param``, on its device, for tensor ``index``."""
    return noise_like(param.shape, param.device, seed, index, variant, generator)
