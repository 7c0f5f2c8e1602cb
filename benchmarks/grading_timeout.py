"""Benchmark the math grader's hard time-out pool under hostile answers.

Prints (c) the pool's start-up time (cold, for a started pool, and for a replacement
after a worker died), (a) the wall time of ten hostile answers in a row through
:func:`esrepro.tasks.math.verify_answer`, and (b) the latency of a correct answer
submitted from another thread right after three hostile ones.

    python benchmarks/grading_timeout.py [--workers 2] [--timeout 1.0]

The hostile answers are exponent towers and a factorial that sympy evaluates
exactly (minutes of big-integer arithmetic in C, under the workers' memory cap);
each is checked to come back as a time-out, not as a quick error.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from itertools import cycle, islice

from esrepro.tasks.math import grading_pool, verify_answer

#: Answers that keep math-verify/sympy busy far past any grading limit.
HOSTILE = ("9^{9^{9^{9}}}", "9^{9^{9}}", "\\frac{9^{9^{9}}}{7}", "(10^{10^{8}})!", "2^{3^{4^{5^{6}}}}")
#: A correct answer that only math-verify can decide (no string or number shortcut).
CORRECT = ("\\frac{1}{2}", ["0.5"])
GOLD = ["3"]


def _grade(pred: str, golds: list[str], timeout_s: float, pool) -> tuple[bool, dict, float]:
    start = time.perf_counter()
    ok, details = verify_answer(pred, golds, timeout_s=timeout_s, pool=pool)
    return ok, details, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="grading workers (default: grading_pool's)")
    parser.add_argument("--timeout", type=float, default=1.0, help="grading limit in seconds")
    args = parser.parse_args()

    start = time.perf_counter()
    pool = grading_pool() if args.workers is None else grading_pool(args.workers)
    pool.warm()
    print(f"(c) pool start-up, cold ({getattr(pool, 'n_workers', '?')} workers): "
          f"{time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    pool.warm()
    print(f"    warm() of a started pool:            {time.perf_counter() - start:.2f} s")
    died = pool.call(os._exit, 1)
    start = time.perf_counter()
    pool.warm()
    print(f"    warm() after a worker died:          {time.perf_counter() - start:.2f} s "
          f"(the replacement's start-up; the call reported: {died.error})")

    times, methods = [], []
    start = time.perf_counter()
    for pred in islice(cycle(HOSTILE), 10):
        ok, details, elapsed = _grade(pred, GOLD, args.timeout, pool)
        assert not ok, pred
        times.append(elapsed)
        methods.append(details["method"])
    total = time.perf_counter() - start
    print(f"(a) ten hostile answers in a row, limit {args.timeout} s: {total:.2f} s "
          f"(each: {', '.join(f'{t:.2f}' for t in times)})")
    print(f"    outcomes: {', '.join(methods)}")
    if any(m != "timeout" for m in methods):
        print("    WARNING: not every hostile answer timed out")

    pool.warm()  # let replacements finish starting: (b) measures queueing, not (a)'s leftovers
    hostile_done: list[float] = []
    t0 = time.perf_counter()

    def hostile(pred: str) -> None:
        _grade(pred, GOLD, args.timeout, pool)
        hostile_done.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=hostile, args=(p,)) for p in HOSTILE[:3]]
    for thread in threads:
        thread.start()
    time.sleep(0.05)  # the hostile calls are queued first
    box: dict = {}
    t_submit = time.perf_counter()
    checker = threading.Thread(target=lambda: box.update(r=_grade(*CORRECT, args.timeout, pool)))
    checker.start()
    checker.join()
    ok, details, latency = box["r"]
    for thread in threads:
        thread.join()
    print(f"(b) correct answer after three hostile ones: latency {latency:.2f} s "
          f"(correct={ok}, method={details['method']}); hostile ones returned at "
          f"{', '.join(f'{t:.2f}' for t in sorted(hostile_done))} s, correct submitted at "
          f"{t_submit - t0:.2f} s")


if __name__ == "__main__":
    main()
