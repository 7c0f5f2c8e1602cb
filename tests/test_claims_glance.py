"""The claims table read at a glance: a short table (claim, paper, this run, verdict, seeds) first, every line at
most 200 characters, every row's verdict in it, each model named once; the reasons below."""

from __future__ import annotations

from pathlib import Path

import pytest

from claims_fixture import paper_fixture, table
from esrepro.report.claims.glance import MAX_LINE, cases, glance, shorten
from esrepro.report.claims.table import _markdown, rule_notes


@pytest.fixture(scope="module")
def paper_table(tmp_path_factory):
    root = paper_fixture(Path(tmp_path_factory.mktemp("paper")) / "results")
    return table(root)


def _first_table(md: str) -> list[str]:
    lines = md.splitlines()
    start = lines.index("| Claim | Paper | This run | Verdict | Seeds |")
    end = lines.index("", start)
    return lines[start + 2:end]


def test_no_line_over_200_characters_and_every_verdict_in_the_short_table(paper_table):
    md = _markdown(paper_table, "The papers' claims, tested by this run", rule_notes(paper_table, "paper"))
    assert max(len(line) for line in md.splitlines()) <= MAX_LINE
    claims = [line.split(" | ") for line in _first_table(md) if not line.startswith("| ↳")]
    assert len(claims) == len(paper_table)
    for cells, (_, row) in zip(claims, paper_table.iterrows(), strict=True):
        assert cells[0] == f"| {row['Claim']}" and cells[3] == row["Verdict"]
    assert "**Reasons, per claim**" in md and md.index("**Reasons, per claim**") > md.index("| ↳")


def test_each_model_is_named_once_in_the_short_table(paper_table):
    """A line names a model at most once; a row over several models gives each its own line."""
    lines = _first_table(_markdown(paper_table, "c", []))
    names = list(cases(paper_table.set_index("Id").loc["es_improves_base", "This run"]))
    assert len(names) == 7
    assert all(line.count(name) <= 1 for line in lines for name in names)
    text = "\n".join(lines)
    assert all(f"| ↳ {name} |" in text for name in names)


def test_the_short_table_of_a_tiny_run_keeps_the_rule_on_its_numbers():
    row = {"Claim": "c", "Paper": "p", "This run": "m 1.0 -> 2.0", "Verdict": "not testable",
           "Rule on this run": "holds", "Seeds": "1 seed (one seed: certifies these checkpoints, not run-to-run "
           "spread)"}
    assert glance([row])[2:] == ["| c | p | below | not testable (rule here: holds) | 1 seed (checkpoints only) |",
                                 "| ↳ m |  | 1.0 -> 2.0 |  |  |"]


def test_shorten_cuts_at_a_phrase():
    assert shorten("a b; c d; e f", 9) == "a b …"
    assert shorten("short", 10) == "short"
    assert len(shorten("x" * 50, 10)) <= 10


def test_a_row_of_many_arms_with_long_cells_still_fits():
    """The tiny default's Table 1 rows: six arms with their seed counts beside long verdict and claim cells."""
    row = {"Claim": "ES beats every RL baseline: tiny-qwen2 (1M, built locally)", "Paper": "not in the paper's "
           "Table 1", "This run": "ES 15.3, PPO-z 15.1, GRPO-z (8) 15.5", "Verdict": "not testable",
           "Rule on this run": "not resolved",
           "Seeds": "ES 3, GRPO-z (8) 2, GRPO-v 2, Dr.GRPO-v 1, GRPO-z (30) 1, PPO-z 1 (one seed: certifies these "
           "checkpoints, not run-to-run spread)"}
    lines = glance([row])
    assert all(len(line) <= 200 for line in lines), [len(line) for line in lines]
    assert "not testable (rule here: not resolved)" in lines[2]
