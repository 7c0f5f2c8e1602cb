"""The papers' claims this pipeline tests: one :class:`Claim` per row family, with where the paper makes it, its
wording in a few words and the rule that decides it (docs/claims.md sets each wording beside its rule).

A claim made per model (ES against every RL baseline, v2 Sec. 4.1) is one row per model: its row id is
``{key}.{model}`` (:func:`row_id`). Claims that a paper version makes but this pipeline does not plan (ESSA v3's
abstract-only numbers) have rows too, marked not planned, so a reader sees every claim and why it is not tested.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """One claim of a paper: ``key`` (its row id, or the prefix of its per-model rows), a title a table can show,
    the place in the paper, the claim's wording (paraphrased, with its deciding words quoted), the rule that
    decides it on a run, and whether this pipeline plans the runs it needs."""

    key: str
    title: str
    where: str
    wording: str
    rule: str
    planned: bool = True
    per_model: bool = False


#: v1 Table 1's RL baselines (v1 had no VERL variants): what v1's own claims compare ES with.
V1_RL: tuple[str, ...] = ("ppo", "grpo8", "grpo30")

ES_CLAIMS: tuple[Claim, ...] = (
    Claim("es_improves_base", "ES improves every base model", "ES v2 Table 1, Sec. 4.1",
          "ES fine-tuning raises every Table 1 model's Countdown accuracy above the original model's.",
          "Per model, the margin ES - Original clears 0 (rule 2); every model must."),
    Claim("es_beats_rl", "ES beats every RL baseline", "ES v2 Sec. 4.1, Table 1",
          "ES \"improves upon RL baselines across all tested models\": above PPO, GRPO and Dr.GRPO in both "
          "implementation variants, per model.",
          "Per model, the margin ES - each RL method clears 0 (rule 2); one row per model.", per_model=True),
    Claim("es_ahead_throughout", "ES is ahead of RL throughout training", "ES v2 App. A.5, Fig. 7",
          "ES outperforms RL on every model \"throughout training\" (accuracy against training samples).",
          "At every point of each RL method's test-accuracy curve after the start, ES's curve (interpolated at the "
          "same sample count) is above it by more than two binomial standard errors at every point; refuted when "
          "Holm's procedure over every point of every model-method pair finds ES below at one."),
    Claim("es_sample_efficiency_v1", "ES needs under 20% of RL's samples (v1)", "ES v1 Sec. 4.1, App. A.4 Fig. 6",
          "To reach RL's level, ES needs \"less than 20%\" of the training samples \"in most cases\" "
          "(v1 only: v2 no longer states it).",
          "Per model and v1 RL method (PPO, GRPO with groups of 8 and 30): samples ES's mean curve needs to reach "
          "the RL method's best accuracy, over the RL method's budget (its last point's samples); holds when under "
          "0.2 in more than half of the cases (point estimates: never refuted); a method that never rises above its "
          "start is left out."),
    Claim("es_small_models_v1", "ES improves the smallest model, where RL does not (v1)", "ES v1 Sec. 4.1, Table 1",
          "On the smallest model (Qwen2.5-0.5B-Instruct) PPO and GRPO stay at 0.3% while ES reaches 14.4%: ES elicits "
          "reasoning even from the smallest base model.",
          "On the smallest Table 1 model (by the registry's size): the margins ES - Original and ES - each of v1's "
          "RL baselines (PPO, GRPO with groups of 8 and 30) clear 0 (rule 2, Holm over the comparisons)."),
    Claim("rl_sensitive_hyperparameters", "RL is sensitive to its hyperparameters", "ES v2 Sec. 4.1, App. A.2 Table 4",
          "RL methods are sensitive to the KL penalty and the learning rate, and make little progress unless both "
          "are set precisely; ES runs every experiment with one setting.",
          "Per model and grid-trained RL method: the best grid cell's final training reward (mean over its last "
          "quarter of steps, the selection's score) minus the worst cell's clears 0, Welch t over those steps with "
          "the lower end Bonferroni-widened for choosing the pair; every grid must. A largest gap is never negative: "
          "not refuted, only open."),
    Claim("es_pareto", "ES's reward-KL front lies above GRPO's", "ES v2 Sec. 4.2, Fig. 1",
          "ES's Pareto front is \"higher and to the left\" of GRPO's (reward against KL to the base model).",
          "Over the KL range ES's front covers, ES's front reward (the best ES point at no more KL) minus each "
          "GRPO front point's reward; every gap's 95% interval (Welch t over the two checkpoints' seeds) clears 0; "
          "refuted when Holm over the compared front points finds a GRPO point above ES's front."),
    Claim("es_pareto_lr", "ES's front lies above GRPO's over learning rates", "ES v2 App. A.4, Fig. 4b",
          "Over GRPO's learning rates and betas, ES's front still dominates GRPO's.",
          "The front rule of Fig. 1 with GRPO's points from the learning-rate sweep."),
    Claim("grpo_lr_raises_reward_kl", "GRPO's reward and KL rise with its learning rate", "ES v2 App. A.4, Fig. 4a",
          "Over the learning-rate sweep, both GRPO's mean reward and its mean KL to the base model increase with the "
          "learning rate.",
          "Per beta, the least-squares slopes of reward and of KL (k3) on log10 learning rate, every seed a point: "
          "holds when every slope's 95% t interval lies above 0; refuted when one lies below 0 at Holm's bound over "
          "the slopes."),
    Claim("grpo_near_base_es_shifts", "GRPO at small learning rates stays near the base reward; ES moves it up",
          "ES v2 App. A.4, Fig. 5",
          "At the sweep's smaller learning rates every GRPO model's reward distribution stays close to the base "
          "model's, while ES shifts it towards higher rewards.",
          "At the sweep's two smallest learning rates: ES's mean reward (its best configuration) minus the base "
          "model's and minus each GRPO configuration's clears 0 (Welch t over seeds; one-sample t against the base "
          "model), every comparison; refuted at Holm's bound over the comparisons and the choice of ES's "
          "configuration."),
    Claim("grpo_small_beta_hacks", "GRPO with small beta hacks the reward; ES does not", "ES v2 Sec. 4.2, Table 2",
          "GRPO at beta 0 and 0.01 \"sometimes\" hacks the conciseness reward; ES shows no hacking.",
          "A run hacks when its share of non-word responses exceeds the base model's by the study's hacking "
          "margin; holds when some run at beta <= 0.01 hacks and no ES run does (counts of runs, no interval)."),
    Claim("es_stable_across_runs", "ES's reward varies less over seeds than GRPO's", "ES v2 Sec. 4.2, Table 2",
          "GRPO's reward standard deviation over four seeds is 15.5x ES's, among configurations above the "
          "0.85 reward cut-off.",
          "GRPO's largest std over seeds over ES's smallest, above the cut-off; the F interval of the ratio, "
          "Bonferroni-widened for choosing that pair among all GRPO-ES pairs, clears 1 (rule 3)."),
    Claim("es_kl_stable", "ES's KL varies less over seeds than GRPO's", "ES v2 Sec. 4.2, Table 2",
          "The KL to the base model shows the same pattern as the reward: GRPO's spread over four seeds is larger "
          "than ES's.",
          "The stability rule on KL (k3): GRPO's largest KL std over seeds over ES's smallest, among the "
          "configurations above the reward cut-off; the Bonferroni-widened F interval of the ratio clears 1 "
          "(rule 3)."),
    Claim("es_correlated_noise", "Correlated noise does as well as i.i.d. noise", "ES v2 App. A.2",
          "Seeding every tensor alike (the released code's correlated noise) gives results not significantly "
          "different from i.i.d. noise.",
          "Not planned: no configuration trains ES with noise: correlated beside noise: iid on one model and task; "
          "both are ES options (esrepro options es), so a configuration can add the pair.", planned=False),
    Claim("es_random_walk", "ES's parameter shifts are close to a random walk", "ES v2 App. A.7",
          "For most models the distribution of ES's parameter shifts deviates little from a random walk's, except "
          "near zero; conciseness on the largest model deviates systematically.",
          "Not planned as a verdict: the parameter-shift figure draws ES's shifts beside a random walk's, but the "
          "paper states no distance that counts as close.", planned=False),
    Claim("es_improves_math", "ES improves the base model on every math benchmark", "ES v2 Sec. 4.3, Fig. 2",
          "ES \"significantly improved the base models across each benchmark\".",
          "Per benchmark, the margin ESCHKPT-1 - Qwen2.5-Math-7B clears 0 (rule 2); every benchmark must."),
    Claim("es_competitive_math", "ES is competitive with the RL checkpoints on math", "ES v2 Sec. 4.3, Fig. 2",
          "ES is \"competitive\" with the SOTA RL checkpoints \"in all the benchmarks\".",
          "Non-inferiority per benchmark and RL checkpoint: the margin ESCHKPT-1 - RL clears -5 points (rule 2 "
          "with a null of -5; the paper states no margin, 5 points is ours)."),
    Claim("es_lifts_sudoku", "ES lifts Sudoku from near zero", "ES v2 Table 3, Sec. 4.4, App. A.8",
          "The base model fails Sudoku; ES fine-tuning improves it significantly.",
          "The base model at most 5% and the margin ES - Original clears 0 (rule 2)."),
    Claim("es_lifts_arc", "ES lifts ARC-AGI from near zero", "ES v2 Table 3, Sec. 4.4, App. A.9",
          "The base model fails ARC-AGI; ES fine-tuning improves it significantly.",
          "The base model at most 5% and the margin ES - Original clears 0 (rule 2)."),
)

ESSA_CLAIMS: tuple[Claim, ...] = (
    Claim("essa_faster_than_grpo", "ESSA reaches 0.80 in under half GRPO's time", "ESSA Sec. 5.4, Fig. 8",
          "With 100 problems resampled per generation and the top 40% of singular values, ESSA passes 0.80 "
          "accuracy in under 25 minutes on 8 GPUs, GRPO needs over 50: \"less than half the time\".",
          "Training seconds until the held-out accuracy (mean over seeds) first reaches 0.80: ESSA's at most half "
          "GRPO's, or GRPO never reaches it (times, no interval)."),
    Claim("essa_data_efficiency", "ESSA needs fewer training problems than GRPO", "ESSA abstract, Sec. 1, Sec. 6",
          "ESSA is \"more data efficient\" than GRPO: it reaches competitive accuracy with fewer samples.",
          "Training problems drawn until the held-out accuracy first reaches 0.80 (ESSA: generations x problems "
          "per generation; GRPO: steps x prompts per step): ESSA's fewer (counts, no interval)."),
    Claim("essa_fig8_accuracy", "ESSA ends above GRPO's accuracy", "ESSA Sec. 5.4, Fig. 8",
          "ESSA reaches higher accuracy than GRPO and plateaus there (Qwen2.5-Math-7B on GSM8K, 8 GPUs).",
          "Per model: ESSA's last held-out accuracy (mean over seeds) minus GRPO's clears 0, a normal interval of "
          "two proportions on the held-out problems (rule 2); refuted at Holm's bound over the models."),
    Claim("essa_low_tuning", "ESSA needs little hyperparameter tuning", "ESSA abstract",
          "ES removes the need for extensive hyperparameter tuning, making alignment simpler and more stable.",
          "Not planned: a statement about the effort of tuning, which no run measures; the ES paper's row on RL's "
          "sensitivity to its hyperparameters is the nearest measured claim.", planned=False),
    Claim("essa_time_falls_with_gpus", "ESSA's time to 0.76 falls as GPUs are added", "ESSA Sec. 5.1, Fig. 2",
          "Time to 0.76 GSM8K accuracy falls near-linearly with GPUs: about 290 minutes on 8, under 80 on 128.",
          "Training seconds to held-out accuracy 0.76 fall with every added engine count (times, no interval)."),
    Claim("essa_moderate_population", "A moderate ESSA population is best", "ESSA Sec. 5.2, Fig. 4",
          "Growing the population past a moderate size brings no further gain.",
          "Best held-out accuracy per population: the largest is no higher than a smaller one's and the best is "
          "above the smallest's (three or more populations; point estimates)."),
    Claim("essa_population_speed", "A moderate ESSA population converges fastest", "ESSA Sec. 5.2, Fig. 4",
          "Growing the population to a moderate size speeds convergence; very large populations slow it.",
          "Generations until the held-out accuracy (mean over seeds) first reaches the level every population "
          "reaches: fastest at a population that is neither the smallest nor the largest (generation counts, no "
          "interval: holds when they agree, else not resolved)."),
    Claim("essa_rank", "ESSA's largest LoRA rank does worse than a smaller one", "ESSA Sec. 5.3, Fig. 7",
          "The largest LoRA rank reaches a lower accuracy than smaller ranks.",
          "Best held-out accuracy of the largest rank below a smaller rank's (three or more ranks; point "
          "estimates)."),
    Claim("essa_rank_speed", "ESSA's largest LoRA rank converges slower than a smaller one", "ESSA Sec. 5.3, Fig. 7",
          "Moderate ranks converge faster; the largest rank slows progress.",
          "Generations to the level every rank reaches: the largest rank's more than a smaller rank's (generation "
          "counts, no interval: holds when they agree, else not resolved)."),
    Claim("essa_quantised", "ESSA with INT8 and INT4 does at least as well as BF16", "ESSA Sec. 5.5, Fig. 9",
          "INT4 and INT8 slightly outperform BF16 in convergence speed and final accuracy.",
          "Best held-out accuracy of INT8 and INT4 at least BF16's (point estimates)."),
    Claim("essa_quantised_speed", "ESSA with INT8 and INT4 converges at least as fast as BF16",
          "ESSA Sec. 5.5, Fig. 9",
          "INT4 and INT8 slightly outperform BF16 in convergence speed.",
          "Generations to the level every precision reaches: INT8's and INT4's at most BF16's (generation counts, no "
          "interval: holds when they agree, else not resolved)."),
    Claim("essa_improves_over_training", "ESSA improves accuracy over training", "ESSA Sec. 5.2, Fig. 6",
          "ESSA \"consistently improves accuracy over training steps\" for Llama-3.1-8B on PRM800K and Qwen2.5-32B "
          "on GSM8K.",
          "Per run, the last held-out accuracy minus the first (the SFT start) clears 0 with a normal interval "
          "of two proportions (rule 2)."),
    Claim("essa_v3_gsm8k", "ESSA beats GRPO by 12.6% on GSM8K (v3)", "ESSA v3 abstract; Sec. 4.4.1, Fig. 4; App. H",
          "Abstract: Qwen2.5-Math-7B's GSM8K test accuracy 12.6% above GRPO's (points or relative is not said). The "
          "body prints no 12.6: in Fig. 4 (LoRA ranks 2-32, 1,319 scored problems, 8 GPUs) ESSA nears 0.85-0.90 in "
          "10-20 minutes and GRPO in 60-100, and at ranks 16 and 32 both end near 0.88-0.90.",
          "Not planned: the body gives no quantity the 12.6% is computed from, and its GRPO (VERL, lr 1e-5, global "
          "batch 512, mini batch 64, ranks 2-32) is not the GRPO this pipeline runs on Qwen2.5-Math-7B (v1's lr 1e-4, "
          "80 prompts x 4, rank 16: the v1 rows essa_faster_than_grpo and essa_fig8_accuracy). A configuration would "
          "add v3's GRPO settings and rank sweep; the paper would have to say what the 12.6% compares.",
          planned=False),
    Claim("essa_v3_prm800k", "ESSA beats GRPO by 14.8% on PRM800K (v3)",
          "ESSA v3 abstract; App. F.2, Fig. 32; App. C, Fig. 11",
          "Abstract: Qwen2.5-Math-7B's PRM800K test accuracy 14.8% above GRPO's. The body's only such comparison is "
          "Fig. 32 (accuracy against time on 500 scored problems, ranks 2-32), whose values it does not print: ESSA "
          "climbs faster and often plateaus higher, most at small ranks. ESSA's best in Fig. 11's grid is 0.784.",
          "Not planned: this pipeline's PRM800K run is Llama-3.1-8B with ESSA alone (studies.essa.scaling, v1's "
          "Fig. 6; grpo null). The claim needs Qwen2.5-Math-7B on PRM800K with ESSA and a GRPO arm (v3: VERL, lr "
          "1e-5, global batch 512, mini batch 64) from one SFT start, and a stated gap: the body prints no number "
          "that gives 14.8%.", planned=False),
    Claim("essa_v3_ifeval", "ESSA beats GRPO by 22.5% on IFEval (v3)", "ESSA v3 abstract; Sec. 4.4.3, Fig. 6; App. H",
          "Abstract: Llama-3.1-8B's IFEval accuracy 22.5% above GRPO's. Fig. 6 (LoRA rank 8, trained on 3,414 "
          "IFEval-like prompts, scored on IFEval's 541): ESSA near 0.6 within an hour and after; GRPO rising slowly, "
          "near 0.45 after over four hours. Those levels (0.6, 0.45) give neither 22.5 points nor 22.5% relative.",
          "Not planned: this pipeline has no IFEval task (no IFEval-like training prompts, no instruction-checking "
          "reward) and no Llama-3.1-8B run for it. A configuration would need that task, its SFT start (1,700 "
          "prompts), ESSA (rank 8, population 24, batch 500) and GRPO (VERL, lr 1e-5, global batch 512, mini batch "
          "64) arms, and the paper would have to say what the 22.5% compares.", planned=False),
    Claim("essa_v3_32b_speed", "ESSA reaches near-optimal accuracy 2-6x faster than GRPO on 32B (v3)",
          "ESSA v3 abstract; Sec. 4.2, Fig. 3",
          "Time to 0.835 accuracy (the abstract's near-optimal) for Qwen2.5-32B on PRM800K: GRPO about 400 minutes "
          "on 16 GPUs and 150 on 128, ESSA about 200 and under 20, so about twice GRPO's speed on 16 GPUs and six "
          "times on 128 (ESSA rank 16, population 128, batch 256; GRPO rank 16, lr 1e-5, global batch 512).",
          "Not planned: this pipeline runs Qwen2.5-32B only on GSM8K (v1's Fig. 6 and Fig. 9) and sweeps GPUs (8-128) "
          "only for ESSA on Qwen2.5-Math-7B to 0.76 (v1's Fig. 2). The claim needs Qwen2.5-32B on PRM800K with ESSA "
          "and GRPO (sharded over the nodes) at 16 and 128 GPUs each, timed to 0.835.", planned=False),
)

#: Questions this pipeline asks beyond the papers, decided by the same rules (their Where says whose question it is).
OWN_CLAIMS: tuple[Claim, ...] = (
    Claim("eggroll_matches_es", "Low-rank ES keeps full-rank ES's gain at equal budget",
          "This pipeline's question, not either paper's: EGGROLL (arXiv 2511.16652) beside ES v2 Table 1",
          "ES whose members perturb each weight matrix by a rank-r product (EGGROLL) keeps at least 80% of the gain "
          "over the base model that full-rank ES on the same linear projections makes, at the same population, "
          "sigma, alpha, iterations and training problems.",
          "Per model and rank against the control arm C (ES with noise_on: linear) and the base model B: the contrast "
          "L - 0.8 C - 0.2 B clears 0 on paired problems and, with two seeds or more per arm, over seeds (Welch); "
          "refuted by the seed interval where there is one, under Holm over the model-rank cases; not resolved "
          "while the control arm's own gain is not established."),
)

CLAIMS: tuple[Claim, ...] = ES_CLAIMS + ESSA_CLAIMS + OWN_CLAIMS
BY_KEY: dict[str, Claim] = {c.key: c for c in CLAIMS}


def row_id(key: str, model: str | None = None) -> str:
    """A row's id: the claim's key, with ``.{model}`` for a per-model claim."""
    return f"{key}.{model}" if model else key


def claim_of(row: str) -> Claim:
    """The claim a row id belongs to (a per-model row's id starts with its claim's key)."""
    if row in BY_KEY:
        return BY_KEY[row]
    key = row.split(".", 1)[0]
    if key in BY_KEY and BY_KEY[key].per_model:
        return BY_KEY[key]
    raise KeyError(f"{row!r} is not a claim of the table (known: {', '.join(BY_KEY)})")


def markdown() -> str:
    """Every claim with its wording beside its rule, as a Markdown table (docs/claims.md holds it)."""
    lines = ["| claim | where | the paper's wording, in short | the rule |", "|---|---|---|---|"]
    for c in CLAIMS:
        title = c.title + (" (one row per model)" if c.per_model else "")
        lines.append(f"| {title} | {c.where} | {c.wording} | {c.rule} |")
    return "\n".join(lines) + "\n"
