"""Every path the pipeline writes, as one template each; rules and library code both use these.

Templates use Snakemake's wildcard names, so a rule's output is a template as it stands
and library code fills it with :func:`fill`. The module's templates are the repository's
(``data/prepared/...``, ``results/...``); a config with a ``workspace`` writes under that folder
instead, through :class:`Workspace` (``Plan.paths``), so configs with different workspaces run in
one checkout without touching each other's files. Raw downloads (``data/raw``, checked against
their pinned checksums) and the names inside a run directory are shared.
"""

from __future__ import annotations

from typing import Any

PREPARED = "data/prepared/{task}"  # {split}.jsonl + manifest.json
RAW = "data/raw"
BASE_MODEL = "results/models/{model}/base"  # a built or fetched model, with its manifest.json inside
REBUILD = "results/models/{model}/rebuild.json"  # a pinned build rebuilt from scratch and compared (verify_models)
RUN = "results/runs/{task}/{model}/{method}/seed{seed}"  # every method's run directory (same shape)
CELL_RUN = "results/runs/{task}/{model}/{method}/grid/{cell}/seed{seed}"  # one RL grid cell's run
EVAL = "results/eval/{task}/{model}/{method}/seed{seed}/{split}"  # metrics.json, responses.jsonl, manifest.json
KL = "results/kl/{task}/{model}/{method}/seed{seed}"  # kl.json, samples.jsonl, manifest.json
TABLES = "results/tables"
FIGURES = "results/figures"
REPORTS = "results/reports"
LOGS = "results/logs"
CRATE = "results/ro-crate"

# Inside a run directory.
CHECKPOINT = "checkpoint"  # final weights (HF safetensors + tokenizer)
TRAIN_LOG = "log.jsonl"  # one row per iteration / step
MANIFEST = "manifest.json"
SELECTION = "selection.json"  # RL: the grid cell kept
SNAPSHOTS = "checkpoints"  # weights kept every keep_every iterations: checkpoints/iter000010/ ...
RESUME = "resume"  # resume state: ES, ESSA, PPO (esrepro.train.resume), GRPO (esrepro.rl.trl_resume); not an output
CMA_STATE = "cma_state.npz"  # ESSA: the CMA-ES state, in the resume state and beside the final run

# Tables and figures (stems: .csv/.md/.tex or .png/.pdf are added).
TABLE1 = f"{TABLES}/table1_countdown"
TABLE2 = f"{TABLES}/table2_conciseness"
# The conciseness runs' reward std over seeds, GRPO against ES (the ES paper's run-to-run comparison, v2 Sec. 4.2)
CONCISENESS_STABILITY = f"{TABLES}/conciseness_stability"
TABLE3 = f"{TABLES}/table3_rl_hyperparameters"
CURVES = f"{FIGURES}/countdown_curves"
PARETO = f"{FIGURES}/conciseness_pareto"
DISTRIBUTION = f"{FIGURES}/conciseness_distribution"
EVAL_SUMMARY = f"{REPORTS}/eval_summary.metrics.json"
# The ESSA study (ESSA paper, arXiv 2507.04453): a summary table and Figures 2, 4, 7, 8, 9.
ESSA_TABLE = f"{TABLES}/essa_summary"
ESSA_POPULATION = f"{FIGURES}/essa_population"  # Fig. 4: accuracy against generations; maximum against population
ESSA_RANK = f"{FIGURES}/essa_rank"  # Fig. 7: accuracy against LoRA rank
ESSA_ENGINES = f"{FIGURES}/essa_engines"  # Fig. 2: time to the target accuracy against engines
ESSA_PRECISION = f"{FIGURES}/essa_precision"  # Fig. 9: accuracy against generations per precision
ESSA_WALLCLOCK = f"{FIGURES}/essa_wallclock"  # Fig. 8: ESSA against GRPO in wall-clock time
ESSA_SCALING = f"{FIGURES}/essa_scaling"  # Fig. 6: ESSA against GRPO in wall-clock time per GPU count
ANALYSIS = f"{REPORTS}/analysis"  # .ipynb and .html


def fill(template: str, **values: Any) -> str:
    """A template with its wildcards filled in (every wildcard must be given)."""
    return template.format(**values)


def snapshot_name(iteration: int) -> str:
    """The directory name of the weights kept after ``iteration`` iterations."""
    return f"iter{iteration:06d}"


# --- the ES paper v2's remaining tables and figures --------------------------------------------------------------
PERIODIC_EVAL = "periodic_eval.jsonl"  # inside a run directory: test accuracy during training (eval_every)
PARAM_SHIFT = "results/param_shift/{task}/{model}/{method}/seed{seed}"  # histogram.json + manifest.json per ES run
GAINS = f"{FIGURES}/gains_{{task}}"  # Figure 6: accuracy improvement over the base model
SAMPLE_CURVES = f"{FIGURES}/sample_curves_{{task}}"  # Figure 7: test accuracy against training samples
PARAM_SHIFT_FIGURE = f"{FIGURES}/param_shift_{{task}}"  # Figures 8-10: |theta_final - theta_base| vs a random walk
LR_SWEEP = f"{FIGURES}/conciseness_lr_sweep"  # Figure 3: GRPO over learning rates and beta, against ES
LR_DISTRIBUTIONS = f"{FIGURES}/conciseness_lr_distributions"  # Figure 4: reward distributions per learning rate
TRAIN_TASKS = f"{TABLES}/train_tasks"  # accuracy per training task, test set, model and method
MATH_TABLE = f"{TABLES}/math"  # the v2 math table beside the published RL baselines
MATH_FIGURE = f"{FIGURES}/math_fig2"  # v2 Figure 2: base, RL and ES checkpoints per math benchmark
PUZZLE_TABLE = f"{TABLES}/puzzles"  # the v2 puzzle table (Sudoku, ARC-AGI): Original vs ES
STABILITY = f"{TABLES}/stability"  # mean and std over seeds per method (cross-run stability)
ES_VARIANTS = f"{TABLES}/es_variants"  # beyond the papers: low-rank ES (EGGROLL) beside full-rank ES, equal budgets
CLAIMS = f"{TABLES}/claims"  # the papers' claims tested by the run: evidence, interval, verdict (the headline)
CLAIMS_FIGURE = f"{FIGURES}/claims_margins"  # the claims' margins with their intervals
CLAIM = "results/claims/{claim}"  # one claim's row alone (.csv, .md, .tex): the target that runs only its jobs


# --- workspaces -------------------------------------------------------------------------------------------------
#: The templates a workspace moves: everything under data/prepared and results/.
ROOTED: dict[str, str] = {k: v for k, v in dict(globals()).items()
                          if k.isupper() and isinstance(v, str) and v.startswith(("data/prepared", "results/"))}


class Workspace:
    """One config's output templates: each of :data:`ROOTED` under ``root`` (None or "": the repository's own), as
    attributes of the same names (``Workspace("work/essa_tiny").RUN``)."""

    def __init__(self, root: str | None = None) -> None:
        self.root = (root or "").strip("/")
        for name, template in ROOTED.items():
            setattr(self, name, self.under(template))

    def __getattr__(self, name: str) -> str:  # the names a workspace does not move (e.g. MANIFEST) stay as they are
        value = globals().get(name)
        if not (name.isupper() and isinstance(value, str)):
            raise AttributeError(name)
        return value

    def under(self, path: str) -> str:
        """A repository-relative path (``results/dvc_record.json``) inside this workspace."""
        return f"{self.root}/{path}" if self.root else path

