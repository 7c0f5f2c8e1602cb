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

Scale (the paper's 0.5B-8B models on 4 or 8 GPUs): float32 master weights for actor and critic whatever
the registry dtype, bf16 autocast (or FSDP2's bf16 parameters) on GPUs (``bf16``); one process per GPU,
each rolling out its share of the step's prompts, gradients averaged by DDP or FSDP2 (``sharding``), the
advantages whitened over the global batch (:mod:`esrepro.rl.ppo_parallel`); rollouts in calls of
``rollout_batch_size``; a resume state every ``resume_every`` steps (:mod:`esrepro.rl.ppo_state`).

The pure functions (:func:`gae`, :func:`policy_loss`, :func:`value_loss`, :func:`token_rewards`)
are unit-tested against their defining properties.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from esrepro.models.loading import DTYPES, load_tokenizer
from esrepro.models.responses import eos_token_ids, response_mask
from esrepro.models.tokens import adds_special_tokens
from esrepro.rl import phases, ppo_state
from esrepro.rl import ppo_parallel as par
from esrepro.rl.meta_load import rebuild_buffers
from esrepro.runtime import numerics
from esrepro.runtime.distributed import barrier, init_process_group, world
from esrepro.settings.methods import PPOSettings
from esrepro.tasks.base import Task
from esrepro.train.resume import announce_resume


# --- the algorithm's pieces (pure, tested) ----------------------------------------------------
def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def masked_mean(x: torch.Tensor, mask: torch.Tensor, total: Callable[[torch.Tensor], torch.Tensor] = _same
                ) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1; ``total`` sums the two sums over the processes
    (:func:`esrepro.rl.ppo_parallel.all_sum`) for the global batch's mean."""
    return total((x * mask).sum()) / total(mask.sum()).clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8,
                  total: Callable[[torch.Tensor], torch.Tensor] = _same) -> torch.Tensor:
    """``(x - mean) / std`` over masked positions (population variance); zero elsewhere; ``total`` as in
    :func:`masked_mean` (whitening over the global batch)."""
    mean = masked_mean(x, mask, total)
    var = masked_mean((x - mean) ** 2, mask, total)
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
    """A causal LM's backbone (no LM head) with a scalar value head on its last hidden state (zero-initialised)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
        self.head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:  # noqa: ANN001
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        h = out.last_hidden_state
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1)


def load_master(model_dir: str | Path, device: str) -> nn.Module:
    """A trained model's float32 master weights, whatever the registry dtype: an AdamW update of ``lr`` 1e-6
    to a bf16 weight above ~4e-4 rounds back to the same bf16 value; to a float32 one it does not."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)


def sharded_load(sharding: str) -> bool:
    """Whether a run loads its models sharded (``sharding: fsdp``): built on the meta device, sharded by
    ``fully_shard``, materialised empty on the process's device, and filled from the one copy rank 0 reads on CPU
    (:func:`_load_sharded`). Otherwise every process loads whole copies to its device (DDP keeps them whole)."""
    return sharding == "fsdp"


def _generation_config(model_dir: str | Path, model: nn.Module) -> None:
    """The checkpoint's ``generation_config.json`` on a model built from its config (as ``from_pretrained`` sets)."""
    from transformers import GenerationConfig

    try:
        model.generation_config = GenerationConfig.from_pretrained(str(model_dir))
    except OSError:  # no generation_config.json: the one derived from the model config stays
        pass


def _no_dropout(model: nn.Module) -> None:
    """Dropout off: old and new log-probs must agree before an update."""
    for mod in model.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0


def _trainable(model: nn.Module, lm: nn.Module, checkpointing: bool) -> None:
    """A trained model (actor, critic) as PPO trains it, before wrapping: no dropout, and gradient checkpointing on
    its causal LM ``lm`` when ``checkpointing``."""
    _no_dropout(model)
    if checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _load_sharded(model_dir: str | Path, cfg: PPOSettings, here, device: str, dtype: str, bf16: bool
                  ) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """Actor, critic and (``beta > 0``) reference, sharded by FSDP2 without any process holding a whole copy on its
    device: each is built on the meta device and sharded there, materialised empty, and filled from the state dicts
    rank 0 reads once on CPU (float32 master weights; the reference in the registry dtype, cast from them exactly),
    broadcast shard by shard (``set_model_state_dict(broadcast_from_rank0=True)``). Values are those of
    :func:`load_master` and ``from_pretrained``: a run's results do not depend on the loading. The critic's value
    head is created on CPU as in the whole path (its initialisation draws from torch's generator the same way)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        actor = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        critic_lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        ref = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype]) if cfg.beta > 0 else None
    critic = Critic(critic_lm)  # the head on CPU, drawn as the whole path draws it
    _generation_config(model_dir, actor)
    states: dict[str, dict] = {"actor": {}, "critic": {}, "ref": {}}
    if here.is_main:
        whole = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        states["actor"] = dict(whole.state_dict())
        head = {"head.weight": torch.zeros_like(critic.head.weight), "head.bias": torch.zeros_like(critic.head.bias)}
        states["critic"] = {**{f"lm.{k}": v for k, v in whole.get_decoder().state_dict().items()}, **head}
        if ref is not None:
            states["ref"] = {k: v.to(DTYPES[dtype]) for k, v in states["actor"].items()}
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    out = []
    for name, model in (("actor", actor), ("critic", critic), ("ref", ref)):
        if model is None:
            out.append(None)
            continue
        if name == "ref":
            model.eval().requires_grad_(False)
            _no_dropout(model)
        else:
            _trainable(model, model if name == "actor" else model.lm, effective(cfg, device)["gradient_checkpointing"])
        model = par.wrap(model, "fsdp", here, device, bf16 and name != "ref", frozen=name == "ref")
        model.to_empty(device=device)
        rebuild_buffers(model, device)
        set_model_state_dict(model, states[name], options=opts)
        states[name] = {}
        out.append(model)
    return out[0], out[1], out[2]


def effective(cfg: PPOSettings, device: str) -> dict[str, bool]:
    """bf16 and gradient checkpointing as the run uses them: forced off on CPU."""
    on_gpu = device.startswith("cuda")
    return {"bf16": cfg.bf16 and on_gpu, "gradient_checkpointing": cfg.gradient_checkpointing and on_gpu}


def cpu_overrides(settings: dict | PPOSettings, device: str) -> dict[str, bool]:
    """The settings the CPU path changed (recorded in the manifest)."""
    cfg = _settings(settings)
    used = effective(cfg, device)
    return {k: False for k in ("bf16", "gradient_checkpointing") if getattr(cfg, k) and not used[k]}


def _settings(settings: dict | PPOSettings) -> PPOSettings:
    return settings if isinstance(settings, PPOSettings) else PPOSettings.model_validate({"algorithm": "ppo",
                                                                                          **settings})


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
    resume_dir: str | Path | None = None,
    device: str | None = None,
    load: str | None = None,
) -> tuple[nn.Module, Any, list[dict]]:
    """Train the policy in ``model_dir`` with PPO for ``steps`` steps; returns (policy, tokenizer, log rows).

    Every process of a distributed job calls it (:mod:`esrepro.rl.ppo_parallel`); on return rank 0 holds the
    whole policy (unsharded, in the registry ``dtype``), and the rows are the job's (reduced over processes).
    ``periodic``: (:class:`esrepro.train.periodic.PeriodicEval`, samples per step): evaluate the policy
    greedily before training and every ``eval_every`` steps (v2, Figure 7; rank 0 evaluates).
    ``resume_dir``: write the resume state there every ``resume_every`` steps and continue from it when it
    exists (None: no resume state). ``device``: this process's device (None: its GPU when there is one).
    ``load``: ``sharded`` or ``whole`` (None: :func:`sharded_load` of the settings' sharding, sharded under FSDP).

    One log row per step: ``step``, ``reward_mean``/``std``, ``pg_loss``, ``vf_loss``, ``clipfrac``,
    ``entropy``, ``completion_length``, ``seconds`` and, only when ``beta > 0``, ``kl``.
    """
    from transformers import AutoModelForCausalLM

    cfg = _settings(settings)
    here = world()
    device = device or here.device("cuda" if torch.cuda.is_available() else "cpu")
    init_process_group(device, cfg.collective_timeout)
    share = par.shares(cfg, here.world_size)
    use = effective(cfg, device)
    torch.manual_seed(seed + here.rank)  # each process samples its own responses (rank 0: the 1-process stream)
    tok = load_tokenizer(model_dir)
    tok.padding_side = "left"
    if load is None:  # sharded under FSDP in a process group (a launcher's); one bare process loads whole
        import torch.distributed as dist

        load = "sharded" if sharded_load(cfg.sharding) and dist.is_available() and dist.is_initialized() else "whole"
    if load == "sharded":
        if cfg.sharding != "fsdp":
            raise ValueError("a sharded load needs sharding: fsdp")
        actor, critic, ref = _load_sharded(model_dir, cfg, here, device, dtype, use["bf16"])
        actor.generation_config.pad_token_id = tok.pad_token_id
    else:
        actor = load_master(model_dir, device)
        actor.generation_config.pad_token_id = tok.pad_token_id
        critic = Critic(load_master(model_dir, device)).to(device)
        ref = None
        if cfg.beta > 0:  # frozen: stays in the registry dtype
            ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(device).eval() \
                .requires_grad_(False)
        _trainable(actor, actor, use["gradient_checkpointing"])
        _trainable(critic, critic.lm, use["gradient_checkpointing"])
        actor = par.wrap(actor, cfg.sharding, here, device, use["bf16"])
        critic = par.wrap(critic, cfg.sharding, here, device, use["bf16"])
    policy = par.inner(actor)  # generates and is evaluated (DDP: the wrapped module)
    opt_a = numerics.adamw(actor.parameters(), lr=cfg.actor_learning_rate, weight_decay=cfg.weight_decay)
    opt_c = numerics.adamw(critic.parameters(), lr=cfg.critic_learning_rate, weight_decay=cfg.weight_decay)
    eos_ids = eos_token_ids(tok, policy)
    amp = lambda: par.autocast(device, use["bf16"], actor)  # noqa: E731

    def fmt(e: dict) -> str:
        text = task.prompt(e)
        if chat:
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        return text

    rng = np.random.default_rng(seed)
    run_key = ppo_state.key(cfg, seed, here.world_size, dtype)
    models = {"actor": actor, "critic": critic, "actor_optim": opt_a, "critic_optim": opt_c}
    periodic_rows = periodic[0].rows if periodic is not None else []
    resumed = ppo_state.load(resume_dir, run_key, rng, models, device, here.rank)
    start, order, rows = 0, [], []
    if resumed is not None:
        start, order, rows = resumed.step, resumed.order, resumed.rows
        periodic_rows[:] = resumed.periodic_rows
        announce_resume("PPO", resume_dir, start, steps)
    from tqdm import tqdm

    def evaluate_now(done: int) -> None:
        from esrepro.train.periodic import policy_point

        phases.enter(phases.EVALUATE)
        evaluation, per_step = periodic
        with par.gathered(actor):  # FSDP2: every process holds the whole weights; the main process evaluates alone
            if here.is_main:
                with amp():
                    policy_point(evaluation, done, per_step, policy, tok, device, cfg.eval_batch_size, chat,
                                 alone=True)
            barrier()

    if periodic is not None and resumed is None:
        evaluate_now(0)

    lo, hi = here.rank * share.prompts_per_process, (here.rank + 1) * share.prompts_per_process
    for step in tqdm(range(start, steps), desc="PPO", disable=not progress or not here.is_main,
                     initial=start, total=steps):
        t0 = time.perf_counter()
        while len(order) < cfg.prompts_per_step:  # epochs over the training set, reshuffled each time
            order += rng.permutation(len(examples)).tolist()
        idx, order = order[: cfg.prompts_per_step], order[cfg.prompts_per_step :]
        batch = [examples[i] for i in idx[lo:hi]]  # this process's share; the union is the step's batch
        texts = [fmt(e) for e in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=adds_special_tokens(tok, texts)).to(device)
        n_prompt = enc["input_ids"].shape[1]

        # rollout
        actor.eval()
        with torch.no_grad(), par.gathered(actor), amp():
            seq = _generate_padded(policy, enc, share.rollout_batch_size, cfg, tok)
        resp = seq[:, n_prompt:]
        mask = response_mask(resp, eos_ids).float()
        attn = torch.cat([enc["attention_mask"], mask.long()], dim=1)
        texts = tok.batch_decode(resp * mask.long() + tok.pad_token_id * (1 - mask.long()), skip_special_tokens=True)
        scores = torch.tensor([task.score(t, e).reward for t, e in zip(texts, batch, strict=True)],
                              dtype=torch.float32, device=device)

        mb = share.micro_batch_size
        with torch.no_grad(), amp():
            old_logp, old_v, ref_logp = [], [], []
            for i in range(0, share.prompts_per_process, mb):
                s, a = seq[i:i + mb], attn[i:i + mb]
                old_logp.append(_response_logp(actor, s, a, n_prompt, cfg.temperature)[0])
                old_v.append(critic(s, a, _positions(a))[:, n_prompt - 1 : -1].float())
                if ref is not None:
                    ref_logp.append(_response_logp(ref, s, a, n_prompt, cfg.temperature)[0])
            old_logp_t, old_v_t = torch.cat(old_logp), torch.cat(old_v)
            ref_logp_t = torch.cat(ref_logp) if ref is not None else None
            rewards, kl = token_rewards(scores, old_logp_t, ref_logp_t, mask, cfg.beta)
            adv, returns = gae(rewards, old_v_t, mask, cfg.gamma, cfg.lam)
            adv = masked_whiten(adv, mask, total=par.all_sum)  # over the global batch's tokens

        # updates: each process takes its share of every mini-batch; gradients are averaged over processes
        actor.train()
        critic.train()
        stats: dict[str, list[float]] = {"pg_loss": [], "vf_loss": [], "clipfrac": [], "entropy": []}
        n_micro = share.mini_batch_per_process // mb
        for _ in range(cfg.ppo_epochs):
            perm = torch.from_numpy(rng.permutation(share.prompts_per_process)).to(device)
            for m0 in range(0, share.prompts_per_process, share.mini_batch_per_process):
                opt_a.zero_grad(set_to_none=True)
                opt_c.zero_grad(set_to_none=True)
                for u0 in range(m0, m0 + share.mini_batch_per_process, mb):
                    last = u0 + mb >= m0 + share.mini_batch_per_process
                    j = perm[u0:u0 + mb]
                    s, a, mk = seq[j], attn[j], mask[j]
                    with par.no_sync(actor, last):
                        with amp():
                            logp, ent = _response_logp(actor, s, a, n_prompt, cfg.temperature)
                        pg, cf = policy_loss(logp, old_logp_t[j], adv[j], mk, cfg.clip_ratio)
                        ent_m = masked_mean(ent, mk)
                        ((pg - cfg.entropy_coef * ent_m) / n_micro).backward()
                    with par.no_sync(critic, last):
                        with amp():
                            v = critic(s, a, _positions(a))[:, n_prompt - 1 : -1].float()
                        vf = value_loss(v, old_v_t[j], returns[j], mk, cfg.value_clip)
                        (vf / n_micro).backward()
                    for k, val in (("pg_loss", pg), ("vf_loss", vf), ("clipfrac", cf), ("entropy", ent_m)):
                        stats[k].append(float(val.detach()))
                torch.nn.utils.clip_grad_norm_(actor.parameters(), cfg.max_grad_norm)
                torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
                opt_a.step()
                opt_c.step()
        all_scores = par.gather_cat(scores)
        row = {
            "step": step,
            "reward_mean": float(all_scores.mean()),
            "reward_std": float(all_scores.std(unbiased=False)),
            **{k: float(np.mean(par.gather_floats(v, device))) for k, v in stats.items()},
            "completion_length": float(par.gather_cat(mask.sum(-1)).mean()),
            "seconds": time.perf_counter() - t0,
        }
        if kl is not None:
            row["kl"] = float(masked_mean(kl, mask, par.all_sum))
        rows.append(row)
        if periodic is not None and periodic[0].due(step + 1):
            evaluate_now(step + 1)
        if resume_dir is not None and ((step + 1) % cfg.resume_every == 0 or step + 1 == steps):
            ppo_state.save(resume_dir, run_key, ppo_state.Progress(step + 1, order, rows, periodic_rows), rng,
                           models, device, here.is_main)
    actor.eval()
    return _whole_policy(actor, model_dir, dtype, here.is_main), tok, rows


def _whole_policy(actor: nn.Module, model_dir: str | Path, dtype: str, is_main: bool) -> nn.Module:
    """The trained policy, unsharded, in the registry dtype (FSDP: gathered to rank 0, a collective)."""
    if not par.sharded(actor):
        return par.inner(actor).to(DTYPES[dtype])
    state = par.full_model_state(actor)
    if not is_main:
        return actor
    from transformers import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    whole.load_state_dict(state)
    whole.generation_config.pad_token_id = actor.generation_config.pad_token_id
    return whole.to(DTYPES[dtype]).eval()


def _generate_padded(actor: nn.Module, enc: dict, per_call: int, cfg: PPOSettings, tok: Any) -> torch.Tensor:
    """Generate in calls of ``per_call`` prompts and right-pad the sequences to one length (a sharded actor: every
    process calls this, and transformers keeps them stepping together, ``synced_gpus``, as each forward gathers
    every process's shards)."""
    outs = []
    n = enc["input_ids"].shape[0]
    for i in range(0, n, per_call):
        outs.append(actor.generate(
            input_ids=enc["input_ids"][i:i + per_call],
            attention_mask=enc["attention_mask"][i:i + per_call],
            do_sample=True, temperature=cfg.temperature, top_p=1.0, top_k=0,
            max_new_tokens=cfg.max_new_tokens, pad_token_id=tok.pad_token_id))
    width = max(o.shape[1] for o in outs)
    return torch.cat([nn.functional.pad(o, (0, width - o.shape[1]), value=tok.pad_token_id) for o in outs])
