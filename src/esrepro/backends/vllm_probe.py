"""Where each transformers tensor lands in vLLM's model, found by pushing marked tensors through the model's own
``load_weights``: no table typed per architecture.

vLLM knows how a checkpoint's tensors map onto its parameters only as code: each model class's ``load_weights``
(renaming, stacking q/k/v and gate/up into packed parameters, splitting a fused tensor) and each layer's weight
loader (the tensor-parallel slice of a rank, vocabulary padding). This module asks that code. A copy of the model
is built on torch's meta device (no memory) with float64 parameters; each HF tensor is then loaded as a *mark*:
a float64 tensor of the HF shape whose every element holds its own flat index. A :class:`~torch.utils.
_python_dispatch.TorchDispatchMode` watches every ``copy_`` into a parameter: the destination's view geometry says
where in which parameter the copy lands, and the copied values say which HF elements arrive there. Each copy must
be one box of the HF tensor placed in one box of the parameter, narrowed along at most one dimension; that is a
:class:`~esrepro.backends.vllm_layout.Piece`. A copy that permutes, scales or casts what it loads, a tensor the
model does not load, or a box narrowed along two dimensions, is refused, naming the model type and the tensor.

Only the parameters' geometry on meta tensors and the marks on the CPU are touched: the probe allocates one HF
tensor's mark at a time (8 bytes an element) and compares in row chunks. Its cost grows with the model: about 8 ns
an element on this project's 2-core CPU (measured on Qwen2.5-0.5B's embedding, 136M elements, 1.1 s), so about a
minute per tensor-parallel rank of a 7B model and a few minutes at 32B, at engine start (ranks probe in parallel).

Facts about vLLM used (the version pinned in ``pyproject.toml``, 0.32.0): a model class's ``load_weights(weights)``
takes an iterable of ``(HF name, tensor)`` pairs (``vllm/model_executor/models/*.py``); model construction
follows ``vllm.model_executor.model_loader.utils.initialize_model(vllm_config=, prefix=)``, whose attention layers
register themselves in ``vllm_config.compilation_config.static_forward_context`` under ``prefix`` (a second copy
takes a prefix of its own, and its entries are removed after the probe); parameters are created in
``torch.get_default_dtype()`` unless a layer is given a dtype (``vllm.utils.torch_utils.set_default_torch_dtype``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from esrepro.backends.vllm_layout import HFTensor, Piece, ShardSpec

#: Elements compared at a time when a copy's values are checked against its mark.
CHUNK = 1 << 24
#: The prefix of the probe's copy of the model (its attention layers' names in vLLM's forward context).
PROBE_PREFIX = "es_layout_probe"


class LayoutError(ValueError):
    """vLLM's model places an HF tensor in a way ES cannot follow (names the model type and the tensor)."""


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _box(offset: int, shape: Sequence[int], strides: Sequence[int], base: Sequence[int]) -> tuple[int, ...] | None:
    """The start of a view of a contiguous tensor of shape ``base`` as a box (per-dimension starts), or None when the
    view is not a box of it (other strides, another rank)."""
    if len(shape) != len(base):
        return None
    full = _contiguous_strides(base)
    for n, s, f in zip(shape, strides, full, strict=True):
        if n > 1 and s != f:
            return None
    starts = []
    for n, f, b in zip(shape, full, base, strict=True):
        start, offset = divmod(offset, f)
        if start + n > b:
            return None
        starts.append(start)
    return tuple(starts) if offset == 0 else None


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for f in _contiguous_strides(shape):
        i, flat = divmod(flat, f)
        out.append(i)
    return tuple(out)


def _same_values(src: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``src`` equals ``expected`` (same shape), compared a chunk of rows at a time."""
    if src.shape != expected.shape:
        return False
    if src.dim() == 0 or src.shape[0] == 0:
        return bool(torch.equal(src, expected))
    rows = max(1, CHUNK // max(1, src[0].numel()))
    return all(torch.equal(src[i:i + rows], expected[i:i + rows]) for i in range(0, src.shape[0], rows))


class _Copies(TorchDispatchMode):
    """Records, for every ``copy_`` into a probed parameter, the box of the parameter written and the values."""

    def __init__(self, params: dict[int, tuple[str, tuple[int, ...]]]) -> None:
        super().__init__()
        self.params = params
        self.copies: list[tuple[str, tuple[int, ...], torch.Tensor | None, torch.Tensor]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            key = StorageWeakRef(dst.untyped_storage()).cdata
            if key in self.params:
                name, base = self.params[key]
                start = _box(dst.storage_offset(), tuple(dst.shape), tuple(dst.stride()), base)
                self.copies.append((name, tuple(dst.shape), None if start is None else start,
                                    src.expand(dst.shape) if src.dim() < dst.dim() else src))
                return dst
        return func(*args, **kwargs)


def _pieces_of(t: HFTensor, mark: torch.Tensor, copies, shapes: dict[str, tuple[int, ...]],
               where: str) -> list[tuple[str, Piece]]:
    """The (vLLM parameter, piece) pairs of one HF tensor's recorded copies."""
    out = []
    for name, shape, start, src in copies:
        what = f"{where}: HF tensor {t.name} {t.shape} into vLLM parameter {name} {shapes[name]}"
        if start is None:
            raise LayoutError(f"{what}: written through a view that is not a box of the parameter")
        if src.device.type != "cpu" or src.dtype != torch.float64:
            raise LayoutError(f"{what}: the loader moved or cast the tensor ({src.dtype} on {src.device}) before "
                              "copying it, so where its elements land cannot be read")
        if src.numel() == 0:
            continue
        first = int(src.reshape(-1)[0].item())
        if len(t.shape) != len(shape) or not 0 <= first < mark.numel():
            raise LayoutError(f"{what}: the copy {tuple(shape)} is not a box of the HF tensor")
        src_start = _unravel(first, t.shape)
        if any(s + n > d for s, n, d in zip(src_start, shape, t.shape, strict=True)):
            raise LayoutError(f"{what}: the copy {tuple(shape)} is not a box of the HF tensor")
        expected = mark[tuple(slice(s, s + n) for s, n in zip(src_start, shape, strict=True))]
        if not _same_values(src, expected):
            raise LayoutError(f"{what}: the loader permutes, scales or otherwise transforms the values it copies")
        base = shapes[name]
        partial = [d for d in range(len(shape))
                   if not (src_start[d] == 0 and start[d] == 0 and shape[d] == t.shape[d] == base[d])]
        if len(partial) > 1:
            raise LayoutError(f"{what}: the copy is cut along dimensions {partial}; ES follows cuts along one")
        d = partial[0] if partial else 0
        for e in range(len(shape)):
            if e != d and not (shape[e] == t.shape[e] == base[e]):
                raise LayoutError(f"{what}: dimension {e} differs between the tensor and the parameter")
        out.append((name, Piece(t, d, src_start[d], start[d], shape[d])))
    return out


def _merged(pieces: Iterable[Piece]) -> list[Piece]:
    """Pieces with duplicates dropped and runs of one tensor that continue one another joined."""
    out: list[Piece] = []
    for pc in pieces:
        if pc in out:
            continue
        last = out[-1] if out else None
        if (last is not None and last.hf == pc.hf and last.dim == pc.dim and last.src + last.length == pc.src
                and last.dst + last.length == pc.dst):
            out[-1] = Piece(pc.hf, pc.dim, last.src, last.dst, last.length + pc.length)
        else:
            out.append(pc)
    return out


def probe_shards(model: torch.nn.Module, hf: Sequence[HFTensor], load: Callable[[list], Any] | None = None,
                 where: str = "the model") -> tuple[ShardSpec, ...]:
    """The vLLM parameters of ``model`` (built on the meta device, float64; a parameter some layer makes on another
    device is probed alike, never written) that hold ``hf``'s tensors, each with
    the pieces filling it, ordered by the HF index of their first piece; ``load`` (default ``model.load_weights``)
    takes a list of ``(HF name, tensor)`` pairs. Refuses (:class:`LayoutError`) an HF tensor the model does not
    load, or places in a way :class:`~esrepro.backends.vllm_layout.Piece` cannot say."""
    load = load or model.load_weights
    params = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, p in model.named_parameters():
        params[StorageWeakRef(p.untyped_storage()).cdata] = (name, tuple(p.shape))
        shapes[name] = tuple(p.shape)
    grouped: dict[str, list[Piece]] = {}
    for t in hf:
        n = 1
        for d in t.shape:
            n *= d
        mark = torch.arange(n, dtype=torch.float64).reshape(t.shape)
        with _Copies(params) as rec:
            try:
                load([(t.name, mark)])
            except LayoutError:
                raise
            except Exception as exc:  # the model's own loader refused the tensor: say which, and why
                raise LayoutError(f"{where}: vLLM's loader refused HF tensor {t.name} {t.shape}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        found = _pieces_of(t, mark, rec.copies, shapes, where)
        if not found:
            raise LayoutError(f"{where}: HF tensor {t.name} {t.shape} lands in no vLLM parameter (its loader "
                              "skipped it), so ES noise on it would never reach vLLM")
        for name, pc in found:
            grouped.setdefault(name, []).append(pc)
    specs = [ShardSpec(name, shapes[name], tuple(_merged(pcs))) for name, pcs in grouped.items()]
    return tuple(sorted(specs, key=lambda s: (s.pieces[0].hf.index, s.name)))


def probe_worker_shards(vllm_config, hf: Sequence[HFTensor]) -> tuple[ShardSpec, ...]:
    """:func:`probe_shards` on a copy of the model a vLLM worker serves (its ``vllm_config``, inside the worker, so
    every layer takes this rank's tensor-parallel slice), built on the meta device in float64 and dropped after."""
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    context = vllm_config.compilation_config.static_forward_context
    before = set(context)
    model_type = getattr(vllm_config.model_config.hf_config, "model_type", "?")
    try:
        with set_default_torch_dtype(torch.float64), torch.device("meta"):
            model = initialize_model(vllm_config=vllm_config, prefix=PROBE_PREFIX)
        return probe_shards(model, hf, where=f"model_type {model_type!r} ({type(model).__name__})")
    finally:
        for key in set(context) - before:
            del context[key]
