"""Benchmark the embedded tiny default end to end, from a fresh clone, as `make reproduce` runs it.

Clones the repository (committed state) into a temporary folder, runs
`snakemake --profile workflow/profiles/default` there with this environment's tools, and
prints the wall time, the number of jobs, and the job-seconds per rule (from Snakemake's
log), so a change to the default can be weighed against the 12-minute goal.

    python benchmarks/embedded_default.py [--repo .] [--keep] [--goal-minutes 12]

Run it on an idle machine: the 2-core goal is for an idle machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")


def job_seconds(log: str) -> dict[str, tuple[int, float]]:
    """``{rule: (jobs, seconds)}`` from a Snakemake log: from each job's start line to its 'Finished' line."""
    started: dict[str, tuple[str, dt.datetime]] = {}
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    when = rule = None
    for line in log.splitlines():
        if m := STAMP.match(line.strip()):
            when = dt.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := re.match(r"(?:local)?rule (\w+):", line):
            rule = m.group(1)
        elif (m := re.match(r"\s+jobid: (\d+)", line)) and rule and when:
            started[m.group(1)] = (rule, when)
        elif (m := re.match(r"Finished jobid: (\d+)", line)) and m.group(1) in started and when:
            name, start = started[m.group(1)]
            out[name][0] += 1
            out[name][1] += (when - start).total_seconds()
    return {k: (v[0], v[1]) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="repository to clone")
    ap.add_argument("--keep", action="store_true", help="keep the clone (printed) for inspection")
    ap.add_argument("--goal-minutes", type=float, default=12.0, help="the goal the wall time is compared with")
    args = ap.parse_args()
    bin_dir = Path(sys.executable).parent
    work = Path(tempfile.mkdtemp(prefix="esrepro-default-"))
    clone = work / "repo"
    subprocess.run(["git", "clone", "--quiet", str(args.repo), str(clone)], check=True)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    print(f"clone: {clone} (commit {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=clone, capture_output=True, text=True).stdout.strip()})", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([str(bin_dir / "snakemake"), "--profile", "workflow/profiles/default"], cwd=clone,
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        print(f"FAILED after {wall:.0f} s")
        return 1
    rules = job_seconds(proc.stdout + proc.stderr)
    jobs = sum(n for n, _ in rules.values())
    print(f"\n{'rule':<28} {'jobs':>5} {'job-seconds':>12}")
    for rule, (n, secs) in sorted(rules.items(), key=lambda kv: -kv[1][1]):
        print(f"{rule:<28} {n:>5} {secs:>12.0f}")
    total = sum(s for _, s in rules.values())
    print(f"{'all jobs':<28} {jobs:>5} {total:>12.0f}")
    minutes, seconds = divmod(wall, 60)
    verdict = "under" if wall < args.goal_minutes * 60 else "OVER"
    print(f"\nembedded default: {int(minutes)} min {seconds:.0f} s wall, {jobs} jobs on {os.cpu_count()} cores "
          f"({verdict} the {args.goal_minutes:g}-minute goal)")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
