"""Benchmark the embedded tiny default end to end, from a fresh clone, as `make reproduce` runs it.

Clones the repository (committed state) into a temporary folder, runs
`snakemake --profile workflow/profiles/default` there with this environment's tools, and
prints the wall time, the number of jobs, the job-seconds per rule (from Snakemake's
log), and how many jobs the preloaded interpreter served and declined (from the end of
results/logs/forkserver.log), so a change to the default can be weighed against the 12-minute goal.

    python benchmarks/embedded_default.py [--repo .] [--keep] [--goal-minutes 12] [--activate]
        [--reference REV [--reference-seconds S]]

Run it on an idle machine: the 2-core goal is for an idle machine. Two-core machines differ
(the earlier 77-job default has taken from 7 to 17 minutes on different ones), so ``--reference`` first
runs an earlier commit's default here and prints both runs' seconds and served/declined jobs side by side;
with ``--reference-seconds``, that commit's wall time on the machine the goal was set on, it prints this
run's time scaled by the ratio as well. Each run uses its own clone's source (``PYTHONPATH``) with this
environment's packages. Snakemake is started as `make reproduce` starts it, or with ``--activate`` from a
bash that sourced this environment's ``bin/activate``, as the README's activated venv does.
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


def forkserver_counts(log: str) -> tuple[int, int] | None:
    """(served, declined) from the end of a preloaded interpreter's log, in this or an earlier commit's wording."""
    found = None
    for line in log.splitlines():
        if m := (re.search(r"stopped; served (\d+) jobs, declined (\d+)", line)
                 or re.search(r"stopped after (\d+) jobs \((\d+) declined\)", line)):
            found = (int(m.group(1)), int(m.group(2)))
    return found


def clone_at(repo: Path, rev: str | None, dest: Path) -> str:
    """Clone ``repo`` into ``dest`` (at ``rev`` when given); returns the short commit."""
    subprocess.run(["git", "clone", "--quiet", str(repo), str(dest)], check=True)
    if rev:
        subprocess.run(["git", "checkout", "--quiet", rev], cwd=dest, check=True)
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=dest, capture_output=True, text=True,
                          check=True).stdout.strip()


def run_default(clone: Path, bin_dir: Path, activate: bool = False
                ) -> tuple[float, dict[str, tuple[int, float]] | None, tuple[int, int] | None, str]:
    """Run the embedded default in ``clone`` with this environment's tools and the clone's own source
    (``PYTHONPATH``, ahead of any editable install), as `make reproduce` does or, with ``activate``, from a bash
    that sourced ``bin_dir/activate``; returns (wall seconds, job-seconds per rule or None when it failed, the
    preloaded interpreter's (served, declined) jobs or None, the end of the output)."""
    env = {**os.environ, "PYTHONPATH": str(clone / "src")}
    command = [str(bin_dir / "snakemake"), "--profile", "workflow/profiles/default"]
    if activate:
        env.pop("VIRTUAL_ENV", None)
        command = ["bash", "-c", 'source "$0" && exec snakemake "$@"', str(bin_dir / "activate"), *command[1:]]
    else:
        env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    output = proc.stdout + proc.stderr
    log = clone / "results/logs/forkserver.log"
    counts = forkserver_counts(log.read_text(errors="replace")) if log.exists() else None
    return wall, (job_seconds(output) if proc.returncode == 0 else None), counts, output[-6000:]


def served(counts: tuple[int, int] | None) -> str:
    return "no preloaded interpreter" if counts is None else f"{counts[0]} served, {counts[1]} declined"


def minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="repository to clone")
    ap.add_argument("--keep", action="store_true", help="keep the clone (printed) for inspection")
    ap.add_argument("--goal-minutes", type=float, default=12.0, help="the goal the wall time is compared with")
    ap.add_argument("--reference", metavar="REV",
                    help="first run the default of this commit on this machine, and print both runs side by side")
    ap.add_argument("--reference-seconds", type=float, metavar="S",
                    help="the reference commit's wall time on the machine the goal was set on (scales this run)")
    ap.add_argument("--activate", action="store_true",
                    help="start Snakemake from a bash that sourced this environment's bin/activate")
    args = ap.parse_args()
    if args.reference_seconds is not None and args.reference is None:
        ap.error("--reference-seconds needs --reference")
    bin_dir = Path(sys.executable).parent
    work = Path(tempfile.mkdtemp(prefix="esrepro-default-"))
    factor = reference = None
    started = "from an activated venv" if args.activate else "as make reproduce starts it"
    if args.reference:
        ref = work / "reference"
        ref_commit = clone_at(args.repo, args.reference, ref)
        print(f"reference: {ref} (commit {ref_commit})", flush=True)
        ref_wall, ref_rules, ref_counts, tail = run_default(ref, bin_dir, args.activate)
        if ref_rules is None:
            print(tail, f"reference FAILED after {ref_wall:.0f} s", sep="\n")
            return 1
        reference = (ref_commit, ref_wall, sum(n for n, _ in ref_rules.values()), ref_counts)
        print(f"reference {ref_commit}: {minutes(ref_wall)} wall ({ref_wall:.0f} s), {reference[2]} jobs here, "
              f"{served(ref_counts)}", flush=True)
        if args.reference_seconds is not None:
            factor = ref_wall / args.reference_seconds
            print(f"{minutes(args.reference_seconds)} on the machine the goal was set on: this machine takes "
                  f"{factor:.2f}x as long", flush=True)
    clone = work / "repo"
    commit = clone_at(args.repo, None, clone)
    print(f"clone: {clone} (commit {commit})", flush=True)
    wall, rules, counts, tail = run_default(clone, bin_dir, args.activate)
    if rules is None:
        print(tail, f"FAILED after {wall:.0f} s", sep="\n")
        return 1
    jobs = sum(n for n, _ in rules.values())
    print(f"\n{'rule':<28} {'jobs':>5} {'job-seconds':>12}")
    for rule, (n, secs) in sorted(rules.items(), key=lambda kv: -kv[1][1]):
        print(f"{rule:<28} {n:>5} {secs:>12.0f}")
    total = sum(s for _, s in rules.values())
    print(f"{'all jobs':<28} {jobs:>5} {total:>12.0f}")
    goal = args.goal_minutes * 60
    print(f"\nembedded default ({started}): {minutes(wall)} wall ({wall:.0f} s), {jobs} jobs on {os.cpu_count()} "
          f"cores, {served(counts)} ({'under' if wall < goal else 'OVER'} the {args.goal_minutes:g}-minute goal "
          f"on this machine)")
    if reference is not None:
        print(f"\n{'commit':<12} {'seconds':>8} {'jobs':>5}  preloaded interpreter")
        for name, secs, n, c in (reference, (commit, wall, jobs, counts)):
            print(f"{name:<12} {secs:>8.0f} {n:>5}  {served(c)}")
    if factor is not None:
        scaled = wall / factor
        print(f"at the speed of the machine the goal was set on (/{factor:.2f}): {minutes(scaled)} "
              f"({'under' if scaled < goal else 'OVER'} the {args.goal_minutes:g}-minute goal)")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
