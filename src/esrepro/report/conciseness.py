"""The conciseness study: Table 2 (reward and KL per configuration, v2's layout), its stability comparison
and the data of its figures.

Everything is read from the ``kl.json`` files ``esrepro kl`` writes (one per run, and one
for the base model): each has the run's labels, its algorithm and hyperparameters
(``hyper``: sigma and alpha, or beta and learning_rate), the reward and the KL estimates of the
final weights, and the same for every snapshot kept along the way (``checkpoints``, the Pareto
figure's points); ``samples.jsonl`` beside it holds the sampled responses (the hacking marker's input).

Rewards are shown as the ES paper shows them (v2 App. A.2): the raw reward ``-|len(response) -
len(solution)|`` normalised to [0, 1] by :func:`normalise_reward` (0 = -2000, 1 = 0). Reward and KL
are measured on responses sampled from the fine-tuned model (``kl.<task>.n_samples`` per held-out
prompt; v2: 20), KL by Schulman's k3 estimator (v2 App. A.2).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from esrepro.io import read_json, read_jsonl
from esrepro.report.tables import STD_SUFFIX, load_published, write_table

PathLike = str | os.PathLike

#: algorithm -> (label, swept hyperparameter)
ALGORITHMS: dict[str, tuple[str, str | None]] = {
    "base": ("Original", None),
    "es": ("ES", "sigma"),
    "grpo": ("GRPO", "beta"),
    "dr_grpo": ("Dr.GRPO", "beta"),
    "ppo": ("PPO", "beta"),
}
KL_COLUMNS = {"exact": "KL exact", "k1": "KL k1", "k3": "KL k3"}
REQUIRED = ("model", "method", "seed", "algorithm", "reward", "k1", "k3", "exact", "checkpoints")
HYPER = ("sigma", "alpha", "beta", "learning_rate")
#: The raw reward the ES paper's normalised scale maps to 0 (v2 App. A.2); its best raw reward, 0, maps to 1.
REWARD_WORST = -2000.0
#: The KL estimator the ES paper reports (v2 App. A.2: Schulman's k3).
PAPER_KL = "k3"
TABLE2_KEY = "table2_conciseness"
#: A response is not words when fewer than this share of its non-space characters are letters or digits.
WORD_SHARE = 0.5


def normalise_reward(raw: float, worst: float | None = REWARD_WORST) -> float:
    """The ES paper's [0, 1] reward: ``(raw - worst) / -worst``, so ``worst`` (-2000) maps to 0 and 0 to 1;
    a raw reward below ``worst`` maps to 0 (clipped: the scale starts there). ``worst=None``: ``raw`` itself."""
    if worst is None:
        return float(raw)
    if not worst < 0:
        raise ValueError(f"reward_worst must be negative (the best reward is 0), got {worst}")
    return min(1.0, max(0.0, (float(raw) - worst) / -worst))


def is_nonword(response: str) -> bool:
    """Whether a response is symbols rather than words: fewer than half of its non-space characters are
    letters or digits (``str.isalnum``, any script). An empty response has no word and counts."""
    chars = [c for c in response if not c.isspace()]
    if not chars:
        return True
    return sum(c.isalnum() for c in chars) / len(chars) < WORD_SHARE


def nonword_share(responses: Iterable[str]) -> float:
    """The share of ``responses`` that :func:`is_nonword` flags (NaN for none)."""
    flags = [is_nonword(r) for r in responses]
    return sum(flags) / len(flags) if flags else math.nan


def load_kl(paths: Iterable[PathLike], worst: float | None = REWARD_WORST) -> pd.DataFrame:
    """One row per kl.json: labels, algorithm, swept value (``param``, ``value``), the hyperparameters
    (``sigma``, ``alpha``, ``beta``, ``learning_rate``), reward (greedy), reward_sampled, ``reward_norm`` (the
    sampled reward normalised, :func:`normalise_reward` with ``worst``), KL, and the share of its sampled
    responses that are not words (``nonword``; NaN without ``samples.jsonl``)."""
    rows = []
    for path in paths:
        rec = read_json(path)
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            raise ValueError(f"{path}: kl.json is missing field(s) {', '.join(missing)}")
        algo = rec["algorithm"]
        param = ALGORITHMS.get(algo, (algo, None))[1]
        hyper = rec.get("hyper", {}) or {}
        value = hyper.get(param) if param else None
        sampled = rec.get("reward_sampled", math.nan)
        samples = Path(path).with_name("samples.jsonl")
        share = nonword_share(str(s.get("response", "")) for s in read_jsonl(samples)) if samples.exists() else math.nan
        rows.append({
            "model": rec["model"], "method": rec["method"], "seed": rec["seed"], "algorithm": algo,
            "param": param, "value": value, **{k: hyper.get(k, math.nan) for k in HYPER},
            "iteration": rec.get("iteration"), "reward": rec["reward"], "reward_sampled": sampled,
            "reward_norm": math.nan if sampled is None or math.isnan(sampled) else normalise_reward(sampled, worst),
            **{k: rec[k] for k in KL_COLUMNS}, "nonword": share, "checkpoints": rec["checkpoints"], "path": str(path),
        })
    return pd.DataFrame(rows)


def _order(algo: str) -> int:
    """Table 2's order: GRPO first, as v2 prints it, then the other RL methods, then ES."""
    order = ["base", "grpo", "dr_grpo", "ppo", "es"]
    return order.index(algo) if algo in order else len(order)


def _g(x: Any) -> str:
    """A hyperparameter as a table cell: ``5e-06``, ``0.0167``; blank when missing."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x):g}"


def _key(algo: str, model: str, hyper: Mapping[str, Any]) -> tuple:
    """A configuration's identity for matching ours to the paper's rows: values equal to 3 significant digits."""
    names = ("sigma", "alpha") if algo == "es" else ("beta", "learning_rate")
    vals = [hyper.get(k) for k in names]
    return (algo, model, *("" if v is None or (isinstance(v, float) and math.isnan(v)) else float(f"{float(v):.3g}")
                           for v in vals))


def config_label(algo: str, hyper: Mapping[str, Any]) -> str:
    """A configuration's row label: ``ES sigma = 0.001``, ``GRPO beta = 0.01, lr = 5e-06``."""
    label = ALGORITHMS.get(algo, (algo, None))[0]
    if algo == "es":
        return f"{label} sigma = {_g(hyper.get('sigma'))}"
    return f"{label} beta = {_g(hyper.get('beta'))}, lr = {_g(hyper.get('learning_rate'))}"


def hacked_runs(runs: pd.DataFrame, margin: float) -> pd.Series:
    """Per run: whether it hacked the reward, i.e. its share of non-word sampled responses exceeds the base
    model's (the base run of the same model) by more than ``margin``; False where either share is unknown."""
    base = runs[runs["algorithm"] == "base"].groupby("model")["nonword"].mean()
    out = []
    for r in runs.itertuples(index=False):
        ref = base.get(r.model, math.nan)
        out.append(r.algorithm != "base" and not math.isnan(r.nonword) and not math.isnan(ref)
                   and r.nonword - ref > margin)
    return pd.Series(out, index=runs.index, dtype=bool)


def _stat(g: pd.DataFrame, col: str) -> tuple[float, float]:
    vals = g[col].astype(float)
    return float(vals.mean()), (float(vals.std()) if len(vals) > 1 else math.nan)


def paper_rows(published: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The paper's Table 2 rows (``config/published.yaml`` ``tables.table2_conciseness.rows``; [] without)."""
    if not published:
        return []
    block = published.get("tables", published).get(TABLE2_KEY, {}) if "tables" in published else published
    return list((block or {}).get("rows", []) or [])


def table2(runs: pd.DataFrame, reward_cutoff: float | None, published: Mapping[str, Any] | None = None,
           hacking_margin: float = 0.2, displays: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Table 2 as the ES paper lays it out: per configuration Model, beta, alpha (GRPO: its learning rate),
    sigma, the normalised reward and KL (k3), mean and sample std over seeds, ours beside the paper's, with the
    reward-hacking marks.

    Rows: every configuration of ours whose mean normalised reward is above ``reward_cutoff`` (``Status``
    kept; every one when the cut-off is None) and every configuration the paper lists, ours beside it
    whatever its reward (``below cut-off``; a paper row we did not run: ``not run``); when none of ours is
    above the cut-off, every configuration of ours (all ``below cut-off``). ``Hacking (ours)``: ``* (k/n)``
    when k of the n runs hacked the reward (:func:`hacked_runs`). The base model is not a row.
    """
    displays = dict(displays or {})
    runs = runs.assign(hacked=hacked_runs(runs, hacking_margin))
    trained = runs[runs["algorithm"] != "base"]
    paper = {_key(r["algorithm"], r["model"], r): r for r in paper_rows(published)}
    configs = []
    for (algo, _method), g in trained.groupby(["algorithm", "method"], sort=False):
        first = g.iloc[0]
        hyper = {k: first[k] for k in HYPER}
        reward, reward_std = _stat(g, "reward_norm")
        configs.append({"algo": algo, "model": first["model"], "hyper": hyper, "g": g, "reward": reward,
                        "reward_std": reward_std, "key": _key(algo, first["model"], hyper)})
    kept_any = any(reward_cutoff is None or c["reward"] > reward_cutoff for c in configs)
    records, labels, seen = [], [], set()

    def row(algo: str, model: str, hyper: Mapping[str, Any], c: dict | None, p: Mapping[str, Any] | None) -> None:
        label, _ = ALGORITHMS.get(algo, (algo, None))
        rec: dict[str, Any] = {
            "Model": displays.get(model, model),
            "β": "" if algo == "es" else _g(hyper.get("beta")),
            "α": _g(hyper.get("alpha") if algo == "es" else hyper.get("learning_rate")),
            "σ": _g(hyper.get("sigma")) if algo == "es" else "",
            "Method": label,
        }
        g = c["g"] if c else None
        rec["Seeds"] = str(len(g)) if g is not None else ""
        rec["Reward (ours)"], rec["Reward (ours)" + STD_SUFFIX] = (c["reward"], c["reward_std"]) if c else (math.nan,) * 2
        rec["Reward (paper)"] = p["reward"] if p else math.nan
        rec["Reward (paper)" + STD_SUFFIX] = p.get("reward_std", math.nan) if p else math.nan
        rec["KL (ours)"], rec["KL (ours)" + STD_SUFFIX] = _stat(g, PAPER_KL) if g is not None else (math.nan,) * 2
        rec["KL (paper)"] = p["kl"] if p else math.nan
        rec["KL (paper)" + STD_SUFFIX] = p.get("kl_std", math.nan) if p else math.nan
        n_hacked = int(g["hacked"].sum()) if g is not None else 0
        rec["Hacking (ours)"] = f"* ({n_hacked}/{len(g)})" if n_hacked else ""
        rec["Hacking (paper)"] = "*" if p and p.get("hacked") else ""
        rec["Non-word share"] = float(g["nonword"].mean()) if g is not None else math.nan
        rec["Raw reward"], rec["Raw reward" + STD_SUFFIX] = (_stat(g, "reward_sampled") if g is not None
                                                              else (math.nan,) * 2)
        if c is None:
            rec["Status"] = "not run"
        elif reward_cutoff is None or c["reward"] > reward_cutoff:
            rec["Status"] = "kept"
        else:
            rec["Status"] = "below cut-off"
        records.append(rec)
        labels.append(config_label(algo, hyper))

    for c in configs:
        if c["key"] in paper or not kept_any or reward_cutoff is None or c["reward"] > reward_cutoff:
            seen.add(c["key"])
            row(c["algo"], c["model"], c["hyper"], c, paper.get(c["key"]))
    for key, p in paper.items():
        if key not in seen:
            row(p["algorithm"], p["model"], p, None, p)
    df = pd.DataFrame(records)
    if df.empty:
        return df
    df.index = pd.Index(labels, name="configuration")
    sort = [(_order(a), 0 if s != "not run" else 1, float(b or 0) if b else 0.0, float(x or 0) if x else 0.0)
            for a, s, b, x in zip([_algo_of(m) for m in df["Method"]], df["Status"], df["β"], df["σ"], strict=True)]
    return df.iloc[sorted(range(len(df)), key=lambda i: sort[i])]


def _algo_of(label: str) -> str:
    return next((a for a, (lab, _) in ALGORITHMS.items() if lab == label), label)


def table2_notes(runs: pd.DataFrame, df: pd.DataFrame, reward_cutoff: float | None, hacking_margin: float,
                 published: Mapping[str, Any] | None) -> list[str]:
    """Table 2's notes: the scale, the cut-off rule and what it dropped, the hacking rule, the paper's source."""
    notes = ["Reward: the mean over the held-out prompts of the reward of the responses sampled from the model "
             "(the KL measurement's responses), normalised as the ES paper shows it (v2 App. A.2): 1 + R/2000 for "
             "the raw reward R = -|len(response) - len(solution)| in characters, 0 below R = -2000, 1 at the best, "
             "R = 0. Raw reward: R before normalisation. KL(fine-tuned || base): Schulman's k3 estimator (v2 App. "
             "A.2), summed per response, mean over responses and prompts. Mean ± sample std over seeds."]
    if reward_cutoff is None:
        notes.append("No reward cut-off: every configuration is kept.")
    else:
        trained = runs[runs["algorithm"] != "base"]
        below = {config_label(a, g.iloc[0]): float(g["reward_norm"].mean())
                 for (a, _), g in trained.groupby(["algorithm", "method"], sort=False)
                 if not float(g["reward_norm"].mean()) > reward_cutoff}
        rule = (f"Cut-off (v2 Sec. 4.2): a configuration is kept when its mean reward over seeds is above "
                f"{reward_cutoff:g}.")
        if not below:
            rule += " None of ours is below it."
        elif len(df) and (df["Status"] == "kept").any():
            if (df["Status"] == "below cut-off").any():
                rule += (" Rows marked 'below cut-off' are ours beside a configuration the paper lists (the paper "
                         "leaves such rows out).")
            left_out = [f"{k} ({r:.3f})" for k, r in below.items() if k not in df.index]
            if left_out:
                rule += " Left out, below it: " + ", ".join(left_out) + "."
        else:
            rule += (" No configuration of ours is above it: every configuration is listed, each marked 'below "
                     "cut-off', so that the table shows what was run.")
        notes.append(rule)
    base = runs[runs["algorithm"] == "base"]
    share = float(base["nonword"].mean()) if len(base) else math.nan
    notes.append(f"Hacking (ours): * (k/n) when k of a configuration's n runs hacked the reward, that is, the share "
                 f"of a run's sampled responses that are not words (fewer than half of a response's non-space "
                 f"characters letters or digits; an empty response counts) exceeds the base model's "
                 f"({'unknown' if math.isnan(share) else f'{share:.3f}'}) by more than {hacking_margin:g}. The paper "
                 "marks short responses of nonsensical symbols (v2 Sec. 4.2); how it decided is not stated.")
    if len(base):
        raw, _ = _stat(base, "reward_sampled")
        notes.append(f"Base model (not a row): reward {float(base['reward_norm'].mean()):.3f} (raw {raw:.1f}).")
    prov = ((published or {}).get("tables", {}).get(TABLE2_KEY, {}) or {}).get("provenance", {}) if published else {}
    if prov:
        notes.append(f"Paper columns: arXiv {prov.get('arxiv', '?')}{prov.get('version', '')}, {prov.get('table', '?')} "
                     "(Qwen2.5-7B-Instruct, four seeds, 1,000 iterations); * marks runs that hacked the reward; "
                     "'not run': a configuration the paper lists that this run did not train.")
    return notes


def build_table2(
    kl_paths: Sequence[PathLike],
    out_stem: PathLike,
    reward_cutoff: float | None,
    notes: Sequence[str] = (),
    model_display: str | None = None,
    published: PathLike | Mapping[str, Any] | None = None,
    hacking_margin: float = 0.2,
    displays: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Load the kl.json files, build Table 2 and write it as csv, md and tex (3 decimals)."""
    runs = load_kl(kl_paths)
    pub = load_published(published) if isinstance(published, (str, os.PathLike)) else published
    df = table2(runs, reward_cutoff, pub, hacking_margin, displays)
    who = model_display or ", ".join(sorted(set(runs["model"])))
    caption = (f"Conciseness ({who}): reward (normalised, ↑) and KL to the base model (↓) per configuration, "
               "ours beside the paper's Table 2")
    write_table(df, out_stem, caption, [*table2_notes(runs, df, reward_cutoff, hacking_margin, pub), *notes],
                decimals=3)
    return df


# --- run-to-run stability (v2 Sec. 4.2: GRPO's reward std 15.5x ES's, from Table 2's four seeds) -------------
def _spread(stds: Sequence[float]) -> dict[str, float]:
    vals = [float(s) for s in stds if s is not None and not math.isnan(float(s))]
    return {"n": len(vals), "min": min(vals) if vals else math.nan, "max": max(vals) if vals else math.nan,
            "mean": sum(vals) / len(vals) if vals else math.nan}


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def stability_rows(es_stds: Sequence[float], grpo_stds: Sequence[float]) -> dict[str, float]:
    """ES's and GRPO's reward std over seeds per configuration, summarised, and GRPO's against ES's: its largest
    over ES's smallest (what reproduces v2's 15.5 from its Table 2: 0.062 / 0.004) and mean over mean."""
    es, grpo = _spread(es_stds), _spread(grpo_stds)
    return {"ES configurations": es["n"], "ES std (min)": es["min"], "ES std (mean)": es["mean"],
            "GRPO configurations": grpo["n"], "GRPO std (max)": grpo["max"], "GRPO std (mean)": grpo["mean"],
            "GRPO max / ES min": _ratio(grpo["max"], es["min"]), "GRPO mean / ES mean": _ratio(grpo["mean"], es["mean"])}


def conciseness_stability(runs: pd.DataFrame, reward_cutoff: float | None,
                          published: Mapping[str, Any] | None) -> pd.DataFrame:
    """Rows: the paper's Table 2, ours above the cut-off (Table 2's rows), every configuration of ours;
    columns: :func:`stability_rows` and the ratio the paper states (v2 Sec. 4.2)."""
    trained = runs[runs["algorithm"] != "base"]
    per = []
    for (algo, _), g in trained.groupby(["algorithm", "method"], sort=False):
        r = g["reward_norm"].astype(float)
        per.append((algo, float(r.mean()), float(r.std()) if len(r) > 1 else math.nan))
    rows = paper_rows(published)
    block = ((published or {}).get("tables", {}) or {}).get(TABLE2_KEY, {}) if published else {}
    stated = (block or {}).get("std_ratio", math.nan)
    out = {
        "paper (v2 Table 2)": {**stability_rows([r["reward_std"] for r in rows if r["algorithm"] == "es"],
                                                [r["reward_std"] for r in rows if r["algorithm"] == "grpo"]),
                               "Stated (paper)": stated},
        "ours, above the cut-off": stability_rows(
            [s for a, m, s in per if a == "es" and (reward_cutoff is None or m > reward_cutoff)],
            [s for a, m, s in per if a == "grpo" and (reward_cutoff is None or m > reward_cutoff)]),
        "ours, every configuration": stability_rows([s for a, _, s in per if a == "es"],
                                                    [s for a, _, s in per if a == "grpo"]),
    }
    if not rows:
        del out["paper (v2 Table 2)"]
    df = pd.DataFrame.from_dict(out, orient="index")
    df.index.name = "source"
    df.insert(0, "Source", list(df.index))
    for col in ("ES configurations", "GRPO configurations"):
        df[col] = df[col].astype(int).astype(str)
    if "Stated (paper)" not in df:
        df["Stated (paper)"] = math.nan
    return df


def build_conciseness_stability(kl_paths: Sequence[PathLike], out_stem: PathLike, reward_cutoff: float | None,
                                published: PathLike | Mapping[str, Any] | None = None,
                                notes: Sequence[str] = ()) -> pd.DataFrame:
    """Load the kl.json files, build :func:`conciseness_stability` and write it (csv, md, tex; 3 decimals)."""
    runs = load_kl(kl_paths)
    pub = load_published(published) if isinstance(published, (str, os.PathLike)) else published
    df = conciseness_stability(runs, reward_cutoff, pub)
    write_table(df, out_stem, "Run-to-run stability (conciseness): the normalised reward's std over seeds, GRPO "
                "against ES", [
                    "Std: sample standard deviation over seeds of a configuration's mean normalised reward (Table 2's "
                    "'±'); min, max and mean over the configurations of each method. The ES paper's evidence on "
                    "run-to-run variation is its Table 2's four conciseness seeds: it states that GRPO's standard "
                    "deviation is 15.5x ES's (v2 Sec. 4.2) without saying how; GRPO's largest std over ES's smallest "
                    "among its Table 2 rows (0.062 / 0.004) gives 15.5, the mean over the mean does not. Ours: the "
                    "same two ratios over this run's configurations above the reward cut-off (Table 2's rows) and "
                    "over all of them; blank where a method has no such configuration or one seed.", *notes],
                decimals=3)
    return df


# --- figures' data -----------------------------------------------------------------------
def checkpoint_points(runs: pd.DataFrame, kl: str = PAPER_KL, reward: str = "reward_sampled",
                      worst: float | None = REWARD_WORST) -> pd.DataFrame:
    """Every kept snapshot and final weights as a (KL, reward) point, labelled by run: ``reward`` normalised
    (:func:`normalise_reward` with ``worst``), ``reward_raw`` as measured (``reward``: the sampled responses' mean,
    as the paper's points; ``"reward"``: greedy)."""
    rows = []
    for r in runs.itertuples(index=False):
        for c in r.checkpoints:
            if reward not in c:
                raise ValueError(f"{r.path}: checkpoint at iteration {c.get('iteration')} has no {reward!r}")
            rows.append({"algorithm": r.algorithm, "method": r.method, "value": r.value, "seed": r.seed,
                         "iteration": c["iteration"], "kl": c[kl], "reward": normalise_reward(c[reward], worst),
                         "reward_raw": float(c[reward])})
    return pd.DataFrame(rows, columns=["algorithm", "method", "value", "seed", "iteration", "kl", "reward",
                                       "reward_raw"])


def pareto_front(kl: Sequence[float], reward: Sequence[float]) -> list[int]:
    """Indices of the non-dominated points (lower KL and higher reward are better), by increasing KL.

    A point is dominated when another has KL <= and reward >= with one strict. Ties
    (identical points) keep the first.
    """
    order = sorted(range(len(kl)), key=lambda i: (kl[i], -reward[i], i))
    front, best = [], -math.inf
    for i in order:
        if reward[i] > best:
            front.append(i)
            best = reward[i]
    return front


def pareto_table(runs: pd.DataFrame, kl: str = PAPER_KL) -> pd.DataFrame:
    """The Pareto figure's numbers: every checkpoint point (``point = checkpoint``; ``pareto_front`` marks
    its method's non-dominated points, the base model has none) and each configuration's mean over seeds
    of its final weights (``point = configuration mean``, the labelled points); ``kl`` names the estimator.
    Rewards: the sampled responses' mean, normalised (``reward``) and raw (``reward_raw``)."""
    points = checkpoint_points(runs, kl)
    points.insert(0, "point", "checkpoint")
    points["pareto_front"] = False
    for algo, pts in points.groupby("algorithm", sort=False):
        if algo != "base":
            front = pareto_front(list(pts["kl"]), list(pts["reward"]))
            points.loc[pts.index[front], "pareto_front"] = True
    means = []
    for algo in dict.fromkeys(runs["algorithm"]):
        if algo == "base":
            continue
        sub = runs[runs["algorithm"] == algo]
        for value, row in sub.groupby("value")[[kl, "reward_norm", "reward_sampled"]].mean().iterrows():
            methods = ",".join(dict.fromkeys(sub.loc[sub["value"] == value, "method"]))
            means.append({"point": "configuration mean", "algorithm": algo, "method": methods, "value": value,
                          "seed": math.nan, "iteration": math.nan, "kl": row[kl], "reward": row["reward_norm"],
                          "reward_raw": row["reward_sampled"], "pareto_front": False})
    table = pd.concat([points, pd.DataFrame(means, columns=points.columns)], ignore_index=True) if means else points
    table = table.astype({"seed": "Int64", "iteration": "Int64"})
    table.insert(table.columns.get_loc("kl"), "kl_estimator", kl)
    return table


def reward_histograms(rewards: dict[tuple[str, Any], list[float]], worst: float | None = REWARD_WORST) -> pd.DataFrame:
    """The reward-distribution figure's numbers: per panel (each method but the base model, or the base model
    alone) and series (the base model, then each configuration), the density of every reward bin ``[lo, hi)``
    and the series' response count ``n``. ``rewards`` are raw; the bins (at most 40 equal bins from the lowest raw
    reward - 0.5 to the highest + 0.5, shared by every series) and the rewards are normalised
    (:func:`normalise_reward` with ``worst``; the bin edges linearly, unclipped) before the densities are taken."""
    import numpy as np

    if not rewards:
        raise ValueError("reward_histograms: no samples")
    algos = [a for a in ALGORITHMS if a != "base" and any(k[0] == a for k in rewards)]
    algos += sorted({k[0] for k in rewards} - set(ALGORITHMS))
    everything = [x for v in rewards.values() for x in v]
    lo, hi = min(everything), max(everything)
    raw_edges = np.linspace(lo - 0.5, hi + 0.5, min(40, int(hi - lo) + 2) + 1)
    edges = raw_edges if worst is None else (raw_edges - worst) / -worst
    base = rewards.get(("base", None), [])
    rows = []
    for panel in algos or ["base"]:
        series = [("base", None, base)] if base else []
        keys = sorted((k for k in rewards if k[0] == panel and panel != "base"), key=lambda k: k[1])
        series += [(k[0], k[1], rewards[k]) for k in keys]
        for algo, value, vals in series:
            norm = [normalise_reward(v, worst) for v in vals]
            density, _ = np.histogram(np.asarray(norm, dtype=float), bins=edges, density=True)
            for i in range(len(edges) - 1):
                rows.append({"panel": panel, "algorithm": algo, "value": math.nan if value is None else value,
                             "n": len(vals), "lo": float(edges[i]), "hi": float(edges[i + 1]),
                             "density": float(density[i])})
    return pd.DataFrame(rows, columns=["panel", "algorithm", "value", "n", "lo", "hi", "density"])


def sample_rewards(kl_paths: Iterable[PathLike]) -> dict[tuple[str, Any], list[float]]:
    """Per configuration (algorithm, swept value): the raw rewards of every sampled response, pooled over seeds."""
    out: dict[tuple[str, Any], list[float]] = {}
    runs = load_kl(kl_paths)
    for r in runs.itertuples(index=False):
        samples = Path(r.path).with_name("samples.jsonl")
        key = (r.algorithm, None if r.value is None or pd.isna(r.value) else r.value)
        out.setdefault(key, []).extend(float(s["reward"]) for s in read_jsonl(samples))
    return out
