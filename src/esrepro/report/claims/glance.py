"""The claims table read at a glance: one short table (claim, paper, this run, verdict, seeds), each cell a short
phrase, each model or benchmark named once (a row over several gets one line per case below it), no line over
:data:`MAX_LINE` characters; then each row's reasons, interval and rule as wrapped paragraphs.

It renders from the table's columns alone (:data:`esrepro.report.claims.table.COLUMNS`, or the CSV), so the
README's block of the committed tiny results (:func:`esrepro.provenance.golden.readme_results`) draws the same.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from esrepro.report.claims.rows import ONE_SEED

#: The longest line the Markdown holds, and the width its prose is wrapped to.
MAX_LINE = 200
PROSE = 120
#: The short table's columns.
GLANCE_COLUMNS = ("Claim", "Paper", "This run", "Verdict", "Seeds")
#: A single seed, in the short table (the note below it says what it means).
ONE_SEED_SHORT = "checkpoints only"
#: The note under the short table.
GLANCE_NOTE = (f"Seeds: training seeds per trained arm; '{ONE_SEED_SHORT}': {ONE_SEED} (docs/claims.md). "
               "Reasons, intervals and rules: below, and in the CSV.")
#: A case of a row over several models or benchmarks: "name a -> b".
CASE = re.compile(r"^(?P<name>.+?) (?P<value>(?:[-+]?\d[\d.,]*|n/a) -> (?:[-+]?\d[\d.,]*|n/a))$")
ELLIPSIS = " …"


def text(x: Any) -> str:
    """A cell's text ('' for a missing value), with no column separator in it."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x).replace("|", "/")


def cases(cell: str) -> dict[str, str] | None:
    """``{name: "a -> b"}`` of a cell that lists several cases ("Qwen2.5-3B-Instruct 10 -> 60.5; ..."), else None."""
    parts = [p.strip() for p in cell.split("; ") if p.strip()]
    found = [CASE.match(p) for p in parts]
    if not parts or not all(found):
        return None
    return {m.group("name"): m.group("value") for m in found}


def shorten(cell: str, width: int) -> str:
    """``cell`` cut to ``width`` characters at a phrase's end ("; ", then ", ") where it is longer."""
    if len(cell) <= width:
        return cell
    room = max(0, width - len(ELLIPSIS))
    for sep in ("; ", ", ", " "):
        cut = cell.rfind(sep, 0, room + 1)
        if cut > room // 3:
            return cell[:cut].rstrip(",;") + ELLIPSIS
    return cell[:room].rstrip() + ELLIPSIS


def verdict_cell(row: Mapping[str, Any]) -> str:
    """The verdict, with the rule's outcome on this run's numbers where the scale gate set it aside."""
    verdict, rule = text(row.get("Verdict")), text(row.get("Rule on this run"))
    return f"{verdict} (rule here: {rule})" if rule and rule not in (verdict, "") and not rule.startswith("in '") \
        else verdict


def seeds_cell(row: Mapping[str, Any]) -> str:
    return text(row.get("Seeds")).replace(f"({ONE_SEED})", f"({ONE_SEED_SHORT})")


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _fit(cells: list[str], wide: Sequence[int]) -> list[str]:
    """The cells, the ``wide`` ones shortened alike until the line fits :data:`MAX_LINE`."""
    over = len(_line(cells)) - MAX_LINE
    if over <= 0:
        return cells
    room = sum(len(cells[i]) for i in wide) - over
    each = max(8, room // max(1, len(wide)))
    out = list(cells)
    for i in wide:
        out[i] = shorten(out[i], each)
    for i in (0, len(out) - 1):  # the narrow cells alone are too long: cut the claim, then the seeds
        if len(_line(out)) > MAX_LINE:
            out[i] = shorten(out[i], max(8, len(out[i]) - (len(_line(out)) - MAX_LINE)))
    return out


def row_lines(row: Mapping[str, Any]) -> list[str]:
    """A row's lines of the short table: the claim's, then one per case its Paper or This run lists."""
    paper, ours = text(row.get("Paper")), text(row.get("This run"))
    by_paper, by_ours = cases(paper) or {}, cases(ours) or {}
    names = sorted(by_ours) if by_ours else list(by_paper)
    if not any(n in by_paper for n in names):  # the paper's cases are other models: its cell stays whole
        by_paper = {}
    head = [text(row.get("Claim")), "below" if by_paper else paper, "below" if by_ours else ours,
            verdict_cell(row), seeds_cell(row)]
    lines = [_line(_fit(head, (1, 2)))]
    for name in names if by_paper or by_ours else []:
        sub = [f"↳ {name}", by_paper.get(name, ""), by_ours.get(name, ""), "", ""]
        lines.append(_line(_fit(sub, (1, 2))))
    return lines


def glance(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The short table's lines."""
    lines = [_line(list(GLANCE_COLUMNS)), "|" + "---|" * len(GLANCE_COLUMNS)]
    for row in rows:
        lines += row_lines(row)
    return lines


def wrapped(item: str, indent: str = "  ") -> list[str]:
    """A Markdown list item wrapped to :data:`PROSE` characters."""
    return textwrap.wrap(item, width=PROSE, subsequent_indent=indent, break_long_words=True,
                         break_on_hyphens=False)


def detail(row: Mapping[str, Any]) -> list[str]:
    """A row's reasons: verdict and why, reproduced, interval, seeds, the rule and the jobs, one wrapped item."""
    parts = [f"**{text(row.get('Claim'))}** ({text(row.get('Where'))}): {text(row.get('Verdict'))}"]
    for label, column in (("Why", "Why"), ("Reproduced", "Reproduced"), ("Interval", "Interval"),
                          ("Seeds", "Seeds"), ("Rule", "Rule"), ("Decided by", "Decided by")):
        value = text(row.get(column)).rstrip(".")
        if value:
            parts.append(f"{label}: {value}")
    return wrapped("- " + ". ".join(parts) + ".")


def markdown(rows: Sequence[Mapping[str, Any]], caption: str, notes: Sequence[str]) -> str:
    """The claims table's Markdown: the short table, its note, each row's reasons, then the notes."""
    lines = [f"**{caption}**", "", *glance(rows), "", *wrapped(GLANCE_NOTE, ""), "", "**Reasons, per claim**", ""]
    for row in rows:
        lines += detail(row)
    lines += [""] + [line for n in notes for line in wrapped(f"- {n}")]
    return "\n".join(lines) + "\n"
