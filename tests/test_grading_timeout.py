"""The grading timeout: works off the main thread, really stops runaway calls, never crashes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from esrepro.tasks.math import grading_pool, verify_answer
from esrepro.tasks.timeout import GradingPool

#: Answers whose exact evaluation keeps sympy busy for minutes (big-integer C code).
HOSTILE_ANSWERS = ("9^{9^{9^{9}}}", "9^{9^{9}}", "\\frac{9^{9^{9}}}{7}", "(10^{10^{8}})!")


def spin_forever() -> None:
    """A deliberately endless pure-Python loop."""
    while True:
        pass


def worker_pid() -> int:
    return os.getpid()


def fail(message: str) -> None:
    raise ValueError(message)


def nap_and_return(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def die(code: int) -> None:
    os._exit(code)


def die_by_signal(signum: int) -> None:
    os.kill(os.getpid(), signum)


def has_module(name: str) -> bool:
    return name in sys.modules


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module", autouse=True)
def math_pool() -> GradingPool:
    """The math grading pool, started first: the process-wide forkserver then preloads math-verify."""
    p = grading_pool()
    p.warm()
    return p


@pytest.fixture(scope="module")
def pool(math_pool: GradingPool):
    with GradingPool(n_workers=1, timeout_s=2.0) as p:
        p.warm()
        yield p


def _in_thread(fn, *args, **kwargs):
    box: dict = {}

    def run() -> None:
        box["result"] = fn(*args, **kwargs)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    return box["result"]


def test_runaway_call_from_non_main_thread_is_killed(pool: GradingPool) -> None:
    pid = _in_thread(pool.call, worker_pid).value
    assert _alive(pid)
    start = time.perf_counter()
    result = _in_thread(pool.call, spin_forever, timeout_s=0.5)
    elapsed = time.perf_counter() - start
    assert result.timed_out and not result.ok and result.value is None
    assert 0.45 <= elapsed < 1.5
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:  # killed and reaped
        time.sleep(0.05)
    assert not _alive(pid)
    # the pool goes on with a fresh worker
    again = _in_thread(pool.call, worker_pid)
    assert again.ok and again.value != pid


def test_c_level_work_that_signals_cannot_interrupt_is_stopped(pool: GradingPool) -> None:
    start = time.perf_counter()
    result = pool.call(pow, 7, 10**9, timeout_s=0.5)  # minutes of big-integer arithmetic in C
    assert result.timed_out
    assert time.perf_counter() - start < 1.5
    assert pool.call(pow, 2, 10).value == 1024


def test_c_code_that_ignores_signals_is_stopped_on_time(pool: GradingPool) -> None:
    """A C loop with no signal checks: pebble's own SIGTERM handler would wait 3 s for it."""
    start = time.perf_counter()
    assert pool.call(sum, range(10**13), timeout_s=0.5).timed_out
    assert time.perf_counter() - start < 1.5


def test_back_to_back_timeouts_do_not_wait_for_worker_start(pool: GradingPool) -> None:
    pool.warm()
    for _ in range(3):
        start = time.perf_counter()
        assert pool.call(spin_forever, timeout_s=0.5).timed_out
        assert time.perf_counter() - start < 1.5


def test_errors_come_back_as_results(pool: GradingPool) -> None:
    result = pool.call(fail, "boom")
    assert not result.ok and not result.timed_out and "ValueError: boom" in result.error
    unpicklable = pool.call(lambda: 1)
    assert not unpicklable.ok and unpicklable.error
    assert pool.call(nap_and_return, 0.05, 7).value == 7


def test_memory_cap_turns_huge_allocations_into_errors() -> None:
    with GradingPool(n_workers=1, memory_limit_mb=1024) as small:
        result = small.call(bytearray, 8 * 1024**3, timeout_s=10)
        assert not result.ok and "MemoryError" in result.error
        assert small.call(bytearray, 10).ok


def test_concurrent_callers_share_workers() -> None:
    with GradingPool(n_workers=2) as p:
        p.warm()
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as ex:
            results = list(ex.map(lambda v: p.call(nap_and_return, 0.3, v, timeout_s=5), range(4)))
        assert [r.value for r in results] == [0, 1, 2, 3]
        assert time.perf_counter() - start < 1.5  # two at a time, not four in a row


def test_closed_pool_refuses_calls() -> None:
    p = GradingPool()
    p.close()
    with pytest.raises(RuntimeError):
        p.call(worker_pid)


def test_a_limit_must_be_positive(pool: GradingPool) -> None:
    """pebble reads a zero limit as none at all: refused, not run unbounded."""
    with pytest.raises(ValueError, match="timeout_s"):
        pool.call(worker_pid, timeout_s=0)
    with pytest.raises(ValueError, match="timeout_s"):
        GradingPool(timeout_s=-1.0)


def test_math_verify_runs_off_the_main_thread_without_its_signal_timeout() -> None:
    """math-verify's own timeout would raise ValueError outside the main thread."""
    from esrepro.tasks.math import math_verify_match

    assert _in_thread(math_verify_match, ["\\frac{1}{2}"], "0.5") is True
    assert _in_thread(math_verify_match, ["\\frac{1}{2}"], "0.6") is False


def test_a_worker_that_cannot_start_is_reported() -> None:
    with GradingPool(n_workers=1, preload=("no_such_module_for_esrepro",)) as p:
        result = p.call(worker_pid)
        assert not result.ok and "ModuleNotFoundError" in result.error
        with pytest.raises(RuntimeError, match="did not start"):
            p.warm()


def test_a_worker_that_dies_is_an_error_and_the_pool_goes_on(pool: GradingPool) -> None:
    exited = pool.call(die, 3)
    assert not exited.ok and not exited.timed_out and "exit code 3" in exited.error
    crashed = pool.call(die_by_signal, signal.SIGSEGV)
    assert not crashed.ok and not crashed.timed_out and "died" in crashed.error
    assert pool.call(nap_and_return, 0, 5).value == 5


def test_an_idle_worker_killed_from_outside_does_not_break_the_pool() -> None:
    with GradingPool(n_workers=1) as p:
        pid = p.call(worker_pid).value
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)  # pebble notices the death (and gives up the pool: no call was running)
        results = [p.call(worker_pid) for _ in range(2)]  # the first may report the broken pool
        assert results[-1].ok and results[-1].value != pid


def test_workers_do_not_inherit_the_callers_modules(pool: GradingPool) -> None:
    """Workers fork from the forkserver, not from this (torch-importing) process."""
    import torch  # noqa: F401

    result = pool.call(has_module, "torch")
    assert result.ok and result.value is False


def test_a_correct_answer_does_not_wait_behind_hostile_ones(math_pool: GradingPool) -> None:
    limit = 1.0
    math_pool.warm()
    done: dict[str, float] = {}
    t0 = time.perf_counter()

    def grade(label: str, pred: str, golds: list[str]) -> None:
        ok, details = verify_answer(pred, golds, timeout_s=limit, pool=math_pool)
        done[label] = time.perf_counter() - t0
        done[label + " ok"] = ok

    threads = [threading.Thread(target=grade, args=(f"hostile {i}", a, ["3"]))
               for i, a in enumerate(HOSTILE_ANSWERS[:3])]
    for thread in threads:
        thread.start()
    time.sleep(0.05)  # queued behind all three
    submitted = time.perf_counter() - t0
    grade("correct", "\\frac{1}{2}", ["0.5"])
    for thread in threads:
        thread.join(timeout=30)
    assert done["correct ok"] is True
    assert done["correct"] - submitted < limit + 0.6, done  # one time-out, not three
    assert done["correct"] < done["hostile 2"], done


def test_ten_hostile_answers_take_about_ten_time_outs(math_pool: GradingPool) -> None:
    limit = 0.5
    math_pool.warm()
    start = time.perf_counter()
    for i in range(10):
        ok, details = verify_answer(HOSTILE_ANSWERS[i % len(HOSTILE_ANSWERS)], ["3"], timeout_s=limit, pool=math_pool)
        assert not ok and details["method"] == "timeout", details
    assert time.perf_counter() - start < 10 * limit + 1.5
