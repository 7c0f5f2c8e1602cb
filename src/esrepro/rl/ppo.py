"""PPO with a learned critic, after verl's recipe as TinyZero runs it (the paper's PPO baseline).

No maintained PPO fits both scales here: verl (the paper's own) needs Ray and GPUs,
OpenRLHF needs DeepSpeed and GPUs, and TRL dropped PPO in 1.13 (its experimental
PPOTrainer of 0.26-1.12 expects a reward model and cannot share an environment with
the TRL that GRPO uses). So this module is a small, hand-written, tested PPO:

- rollout: one sampled response per prompt (``prompts_per_step`` prompts per step);
- reward: ``Task.score`` on the final response token, minus ``beta x (log pi - log pi_ref)``
  on every token (verl's ``kl_ctrl`` in-reward penalty; no reference model when ``beta == 0``);
- advantages: GAE (``gamma``, ``lam``; verl: 1, 1), whitened over the batch's tokens;
- actor loss: clipped ratio (``clip_ratio``) with an entropy bonus (``entropy_coef``);
- critic: a copy of the base LM with a scalar head, clipped value loss (``value_clip``);
- ``ppo_epochs`` passes over the rollout in mini-batches of ``mini_batch_size``, one optimiser
  step each, accumulated over micro-batches of ``micro_batch_size``; token-mean losses.

The pure functions (:func:`gae`, :func:`policy_loss`, :func:`value_loss`, :func:`token_rewards`)
are unit-tested against their defining properties.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from esrepro import numerics
from esrepro.models.loading import DTYPES, load_tokenizer
from esrepro.settings.methods import PPOSettings
from esrepro.models.responses import eos_token_ids, response_mask
from esrepro.models.tokens import adds_special_tokens
from esrepro.tasks.base import Task


# --- the algorithm's pieces (pure, tested) ----------------------------------------------------
def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / std`` over masked positions (population variance); zero elsewhere."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def token_rewards(scores: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor | None, mask: torch.Tensor,
                  beta: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token rewards: ``-beta x (logp - ref_logp)`` on every response token, plus the score on the last.

    Returns (rewards, per-token KL or None when ``beta == 0``).
    """
    rewards = torch.zeros_like(logp)
    kl = None
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs the reference log-probabilities")
        kl = (logp - ref_logp) * mask
        rewards = rewards - beta * kl
    last = (mask.cumsum(-1) * mask).argmax(-1)  # index of the last response token
    rewards[torch.arange(len(scores)), last] += scores
    return rewards * mask, kl


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens; returns (advantages, returns).

    ``delta_t = r_t + gamma V_{t+1} - V_t`` with ``V`` zero past the last token;
    ``A_t = delta_t + gamma lam A_{t+1}``; returns ``= A + V``. Padded positions get 0.
    """
    values = values * mask
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        adv[:, t] = last
    return adv, (adv + values) * mask


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, token-mean; returns (loss, fraction of tokens clipped)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float) -> torch.Tensor:
    """Clipped value loss ``0.5 x max((V - R)^2, (V_clip - R)^2)``, token-mean."""
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (v_clip - returns) ** 2), mask)


# --- models ------------------------------------------------------------------------------------
class Critic(nn.Module):
    """A causal LM's backbone with a scalar value head on its last hidden state (zero-initialised)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:  # noqa: ANN001
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      output_hidden_states=True, use_cache=False)
        h = out.hidden_states[-1]
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _response_logp(model: nn.Module, seq: torch.Tensor, attn: torch.Tensor, n_prompt: int, temperature: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities and entropies of the response tokens ``seq[:, n_prompt:]`` under ``model``."""
    logits = model(input_ids=seq, attention_mask=attn, position_ids=_positions(attn), use_cache=False).logits
    logits = logits[:, n_prompt - 1 : -1].float() / temperature
    logprobs = torch.log_softmax(logits, -1)
    logp = logprobs.gather(-1, seq[:, n_prompt:, None]).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return logp, entropy


def train_ppo(
    model_dir: str | Path,
    task: Task,
    examples: list[dict],
    settings: dict | PPOSettings,
    *,
    steps: int,
    seed: int,
    dtype: str = "float32",
    chat: bool = False,
    progress: bool = True,
    periodic: tuple[Any, int] | None = None,
) -> tuple[nn.Module, Any, list[dict]]:
    """Train the policy in ``model_dir`` with PPO for ``steps`` steps; returns (policy, tokenizer, log rows).

    ``periodic``: (:class:`esrepro.train.periodic.PeriodicEval`, samples per step): evaluate the policy
    greedily before training and every ``eval_every`` steps (v2, Figure 6).

    One log row per step: ``step``, ``reward_mean``/``std``, ``pg_loss``, ``vf_loss``, ``clipfrac``,
    ``entropy``, ``completion_length``, ``seconds`` and, only when ``beta > 0``, ``kl``.
    """
    from transformers import AutoModelForCausalLM

    cfg = settings if isinstance(settings, PPOSettings) else PPOSettings.model_validate({"algorithm": "ppo", **settings})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    tok = load_tokenizer(model_dir)
    tok.padding_side = "left"
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(device)  # noqa: E731
    actor = load()
    actor.generation_config.pad_token_id = tok.pad_token_id
    critic = Critic(load()).to(device)
    ref = None
    if cfg.beta > 0:
        ref = load().eval().requires_grad_(False)
    for m in (actor, critic):
        for mod in m.modules():  # no dropout: old and new log-probs must agree before an update
            if isinstance(mod, nn.Dropout):
                mod.p = 0.0
    opt_a = numerics.adamw(actor.parameters(), lr=cfg.actor_learning_rate, weight_decay=cfg.weight_decay)
    opt_c = numerics.adamw(critic.parameters(), lr=cfg.critic_learning_rate, weight_decay=cfg.weight_decay)
    eos_ids = eos_token_ids(tok, actor)

    def fmt(e: dict) -> str:
        text = task.prompt(e)
        if chat:
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        return text

    rng = np.random.default_rng(seed)
    order: list[int] = []
    rows: list[dict] = []
    from tqdm import tqdm

    def evaluate_now(done: int) -> None:
        from esrepro.train.periodic import policy_point

        evaluation, per_step = periodic
        policy_point(evaluation, done, per_step, actor, tok, device, cfg.eval_batch_size, chat)

    if periodic is not None:
        evaluate_now(0)

    for step in tqdm(range(steps), desc="PPO", disable=not progress):
        t0 = time.perf_counter()
        while len(order) < cfg.prompts_per_step:  # epochs over the training set, reshuffled each time
            order += rng.permutation(len(examples)).tolist()
        idx, order = order[: cfg.prompts_per_step], order[cfg.prompts_per_step :]
        batch = [examples[i] for i in idx]
        texts = [fmt(e) for e in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=adds_special_tokens(tok, texts)).to(device)
        n_prompt = enc["input_ids"].shape[1]

        # rollout
        actor.eval()
        with torch.no_grad():
            seq = _generate_padded(actor, enc, cfg, tok)
        resp = seq[:, n_prompt:]
        mask = response_mask(resp, eos_ids).float()
        attn = torch.cat([enc["attention_mask"], mask.long()], dim=1)
        texts = tok.batch_decode(resp * mask.long() + tok.pad_token_id * (1 - mask.long()), skip_special_tokens=True)
        scores = torch.tensor([task.score(t, e).reward for t, e in zip(texts, batch, strict=True)],
                              dtype=torch.float32, device=device)

        with torch.no_grad():
            old_logp, old_v, ref_logp = [], [], []
            for i in range(0, cfg.prompts_per_step, cfg.micro_batch_size):
                s, a = seq[i:i + cfg.micro_batch_size], attn[i:i + cfg.micro_batch_size]
                old_logp.append(_response_logp(actor, s, a, n_prompt, cfg.temperature)[0])
                old_v.append(critic(s, a, _positions(a))[:, n_prompt - 1 : -1].float())
                if ref is not None:
                    ref_logp.append(_response_logp(ref, s, a, n_prompt, cfg.temperature)[0])
            old_logp_t, old_v_t = torch.cat(old_logp), torch.cat(old_v)
            ref_logp_t = torch.cat(ref_logp) if ref is not None else None
            rewards, kl = token_rewards(scores, old_logp_t, ref_logp_t, mask, cfg.beta)
            adv, returns = gae(rewards, old_v_t, mask, cfg.gamma, cfg.lam)
            adv = masked_whiten(adv, mask)

        # updates
        actor.train()
        critic.train()
        stats: dict[str, list[float]] = {"pg_loss": [], "vf_loss": [], "clipfrac": [], "entropy": []}
        n_micro = cfg.mini_batch_size // cfg.micro_batch_size
        for _ in range(cfg.ppo_epochs):
            perm = torch.from_numpy(rng.permutation(cfg.prompts_per_step)).to(device)
            for m0 in range(0, cfg.prompts_per_step, cfg.mini_batch_size):
                opt_a.zero_grad(set_to_none=True)
                opt_c.zero_grad(set_to_none=True)
                for u0 in range(m0, m0 + cfg.mini_batch_size, cfg.micro_batch_size):
                    j = perm[u0:u0 + cfg.micro_batch_size]
                    s, a, mk = seq[j], attn[j], mask[j]
                    logp, ent = _response_logp(actor, s, a, n_prompt, cfg.temperature)
                    pg, cf = policy_loss(logp, old_logp_t[j], adv[j], mk, cfg.clip_ratio)
                    ent_m = masked_mean(ent, mk)
                    ((pg - cfg.entropy_coef * ent_m) / n_micro).backward()
                    v = critic(s, a, _positions(a))[:, n_prompt - 1 : -1].float()
                    vf = value_loss(v, old_v_t[j], returns[j], mk, cfg.value_clip)
                    (vf / n_micro).backward()
                    for k, val in (("pg_loss", pg), ("vf_loss", vf), ("clipfrac", cf), ("entropy", ent_m)):
                        stats[k].append(float(val.detach()))
                torch.nn.utils.clip_grad_norm_(actor.parameters(), cfg.max_grad_norm)
                torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
                opt_a.step()
                opt_c.step()
        row = {
            "step": step,
            "reward_mean": float(scores.mean()),
            "reward_std": float(scores.std(unbiased=False)),
            **{k: float(np.mean(v)) for k, v in stats.items()},
            "completion_length": float(mask.sum(-1).mean()),
            "seconds": time.perf_counter() - t0,
        }
        if kl is not None:
            row["kl"] = float(masked_mean(kl, mask))
        rows.append(row)
        if periodic is not None and periodic[0].due(step + 1):
            evaluate_now(step + 1)
    actor.eval()
    return actor, tok, rows


def _generate_padded(actor: nn.Module, enc: dict, cfg: PPOSettings, tok: Any) -> torch.Tensor:
    """Generate in micro-batches and right-pad the sequences to one length."""
    outs = []
    for i in range(0, cfg.prompts_per_step, cfg.micro_batch_size):
        outs.append(actor.generate(
            input_ids=enc["input_ids"][i:i + cfg.micro_batch_size],
            attention_mask=enc["attention_mask"][i:i + cfg.micro_batch_size],
            do_sample=True, temperature=cfg.temperature, top_p=1.0, top_k=0,
            max_new_tokens=cfg.max_new_tokens, pad_token_id=tok.pad_token_id))
    width = max(o.shape[1] for o in outs)
    return torch.cat([nn.functional.pad(o, (0, width - o.shape[1]), value=tok.pad_token_id) for o in outs])
