"""How often each claim's rule refutes a faithful run, and how often it refutes a clear refutation.

Draws faithful runs (the papers' numbers with a real run's noise: binomial test problems, one training seed, ESSA's
wall-clock times log-normal with sd 0.15 of the logarithm and its held-out accuracies normal with sd 0.01,
checkpoint curves binomial on 500 problems a point, Table 2's seeds normal around the paper's means) and, per
claim, a stated clear refutation (tests/claims_noise.py), and prints: claim, false refutations (count and rate),
the clear refutation, power.

    python benchmarks/claims_calibration.py [--draws 200] [--seed 0] [--three]

``--three`` adds Table 1's rows with ES 3 points below (1.9 standard errors of a difference on 2,000 problems).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the claims' fixtures

from claims_noise import GROUPS, calibrate, table1_3  # noqa: E402


def markdown(df) -> str:
    lines = ["| claim | false refutations (rate) | clear refutation | power |", "|---|---:|---|---:|"]
    for r in df.itertuples(index=False):
        power = "n/a" if math.isnan(r.power) else f"{r.power:.1%}"
        lines.append(f"| {r.claim} | {r._2} of {r.draws} ({r.rate:.1%}) | {r._4} | {power} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--three", action="store_true", help="also Table 1 with ES 3 points below")
    parser.add_argument("--only", nargs="+", choices=sorted(GROUPS), help="these groups of claims only (each "
                        "group's draws are the same as in the whole run)")
    args = parser.parse_args()
    groups = {k: v for k, v in GROUPS.items() if not args.only or k in args.only}
    if args.three:
        groups["table1_3"] = table1_3
    start = time.perf_counter()
    df = calibrate(args.draws, seed=args.seed, groups=groups)
    print(markdown(df))
    print(f"\n{args.draws} draws per claim, seed {args.seed}, {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
