"""The tiny scale's training steps at small shapes, each result as a sha256: run it on several CPUs and compare.

``python tests/cross_cpu_steps.py OUT.json`` (portable numerics in the environment, as every tiny job has them)
builds a small Qwen2 model and tokenizer, then runs what the tiny pipeline's training does, a few steps each:
the warm start's SFT (:func:`esrepro.models.tiny.sft`), ES perturbation, restore and update with z-scored
rewards, one GRPO and one PPO step through their trainers, ESSA's LoRA SFT through TRL, its SVD
reparametrisation and a few CMA-ES generations, and the KL estimate. ``tests/test_cross_cpu.py`` runs it natively
and under qemu-user with an AMD and an Intel CPU model: qemu computes the instructions whose exact result the x86
specification leaves to the implementation its own way, so a kernel built on them gives other bits there.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import SMALL_ARCH, make_model_dir  # noqa: E402
from test_rl_trainers import GRPO as GRPO_TEST  # noqa: E402
from test_rl_trainers import PPO as PPO_TEST  # noqa: E402
from test_rl_trainers import SHORT as EXAMPLES  # noqa: E402
from test_rl_trainers import LengthTask  # noqa: E402


def _digest(tensors: dict[str, torch.Tensor] | list[torch.Tensor] | np.ndarray) -> str:
    h = hashlib.sha256()
    if isinstance(tensors, np.ndarray):
        h.update(np.ascontiguousarray(tensors).tobytes())
    else:
        items = sorted(tensors.items()) if isinstance(tensors, dict) else enumerate(tensors)
        for _, t in items:
            h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def _state(model: torch.nn.Module) -> str:
    return _digest(dict(model.state_dict()))


PAIRS = [(f"Using the numbers [{a} {b}], make {a + b}. ", f"<think> {a} + {b} </think>\n<answer>{a} + {b}</answer>")
         for a in range(2, 10) for b in range(3, 5)]
#: The RL trainers' test settings, with a KL term and weight decay (more of each trainer's ops).
GRPO = {**GRPO_TEST, "beta": 0.04}
PPO = {**PPO_TEST, "beta": 0.01, "weight_decay": 0.01}


def warm_start(model_dir: Path) -> dict[str, str]:
    """Three steps of the tiny build's SFT (AdamW, warm-up and cosine schedule, gradient clipping)."""
    from esrepro.models.loading import load_model, load_tokenizer
    from esrepro.models.tiny import sft

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    losses = sft(model, tok, PAIRS[:12], epochs=1, learning_rate=3e-3, batch_size=4, seed=0)
    return {"warm_start_losses": _digest(torch.tensor(losses)), "warm_start_weights": _state(model)}


def es_update(model_dir: Path) -> dict[str, str]:
    """Two ES iterations: perturb, score (greedy forward), restore by subtraction, z-scored update."""
    from esrepro.es.strategy import ESStrategy
    from esrepro.models.loading import load_model
    from esrepro.perturb.weights import ESWeights

    model = load_model(model_dir)
    ids = torch.tensor([[5, 9, 13, 21, 34, 55, 89, 144]])
    weights = ESWeights(list(model.parameters()), restore="subtract")
    strategy = ESStrategy(population=4, sigma=1e-2, alpha=5e-3, seed=0)
    for it in range(2):
        seeds, rewards = strategy.ask(it), []
        for s in seeds:
            weights.perturb(s, strategy.sigma)
            with torch.no_grad():
                rewards.append(float(model(input_ids=ids).logits[0, -1].log_softmax(-1).max()))
            weights.restore(s, strategy.sigma)
        update = strategy.tell(seeds, rewards)
        weights.apply_update(update.seeds, update.weights, update.alpha)
    return {"es_weights": _state(model)}


def rl_steps(model_dir: Path) -> dict[str, str]:
    """One GRPO step (TRL, KL to the reference) and one PPO step (actor, critic, reference)."""
    from esrepro.rl.grpo import train_grpo
    from esrepro.rl.ppo import train_ppo

    task = LengthTask()
    grpo, _, _ = train_grpo(model_dir, task, EXAMPLES, GRPO, steps=1, seed=0)
    ppo, _, _ = train_ppo(model_dir, task, EXAMPLES, PPO, steps=1, seed=0, progress=False)
    return {"grpo_weights": _state(grpo), "ppo_weights": _state(ppo)}


def grpo_advantages() -> dict[str, str]:
    """GRPO's std-scaled advantages as TRL computes them once esrepro's GRPO has set up TRL, at the tiny runs' shape
    (16 groups of 8 Countdown-like rewards, and over the whole batch): the step above has only 2 groups of 2, whose
    square roots agree on every CPU even through oneMKL's vector math."""
    from trl.trainer import grpo_trainer

    from esrepro.runtime import numerics

    numerics.portable_trl()  # what esrepro.rl.grpo.train_grpo does before it builds the trainer
    rewards = torch.from_numpy(np.random.default_rng(0).choice([0.0, 0.1, 1.0], size=128).astype(np.float32))
    groups = rewards.view(-1, 8)
    group = (groups - groups.mean(dim=1, keepdim=True)) / (grpo_trainer.nanstd(groups, dim=1).unsqueeze(1) + 1e-4)
    batch = (rewards - rewards.mean()) / (grpo_trainer.nanstd(rewards) + 1e-4)
    return {"grpo_advantages": _digest([group, batch])}


def essa_steps(model_dir: Path, work: Path) -> dict[str, str]:
    """ESSA's LoRA SFT (TRL), the SVD of its adapters, three CMA-ES generations and the candidate's factors."""
    from esrepro.essa.lora import load_lora, sft_lora
    from esrepro.essa.strategy import CMAStrategy
    from esrepro.essa.svd import SingularValueSpace

    out = work / "adapter"
    sft_lora(model_dir, PAIRS[:8], rank=4, alpha=8.0, epochs=1, learning_rate=1e-3, batch_size=4, seed=0,
             out_dir=out)
    adapters = load_lora(model_dir, out)
    space = SingularValueSpace.build(adapters, fraction=0.5)
    cma = CMAStrategy(space.x0, sigma0=0.05, population=6, seed=0)
    target = space.x0 * 1.5
    for _ in range(3):
        xs = cma.ask()
        cma.tell(xs, [-float(np.sum((x - target) ** 2)) for x in xs])
    best = cma.ask()[0]
    factors = space.adapter_factors(best)
    return {
        "essa_adapter": _digest({n: torch.cat([f.A.flatten(), f.B.flatten()]) for n, f in adapters.items()}),
        "essa_svd": _digest({n: s.S for n, s in space.svds.items()}),
        "essa_cma": _digest(best),
        "essa_factors": _digest({n: torch.cat([f.A.flatten(), f.B.flatten()]) for n, f in factors.items()}),
    }


def kl_estimate(model_dir: Path) -> dict[str, str]:
    """Per-token log-probabilities of a perturbed model against the base (what KL estimation computes)."""
    from esrepro.models.loading import load_model

    base, tuned = load_model(model_dir), load_model(model_dir)
    with torch.no_grad():
        for i, p in enumerate(tuned.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 1e-2)
        ids = torch.tensor([[5, 9, 13, 21, 34, 55, 89, 144, 7, 3]])
        lp, lq = (m(input_ids=ids).logits.log_softmax(-1) for m in (tuned, base))
        kl = (lp.exp() * (lp - lq)).sum(-1)
    return {"kl_per_token": _digest([kl])}


def main(out: str) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="cross-cpu-") as tmp:
        work = Path(tmp)
        model_dir = make_model_dir(work / "model", {**SMALL_ARCH, "hidden_size": 64, "intermediate_size": 128})
        results = {"model": _digest(load_file(str(model_dir / "model.safetensors")))}
        results.update(warm_start(model_dir))
        results.update(es_update(model_dir))
        results.update(kl_estimate(model_dir))
        results.update(rl_steps(model_dir))
        results.update(grpo_advantages())
        results.update(essa_steps(model_dir, work))
    Path(out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
