"""The grading timeout: works off the main thread, really stops runaway calls, never crashes."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from esrepro.tasks.timeout import GradingPool


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def pool():
    with GradingPool(n_workers=1, timeout_s=2.0, spares=1) as p:
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


def test_back_to_back_timeouts_use_the_ready_spare(pool: GradingPool) -> None:
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
    with GradingPool(memory_limit_mb=1024, spares=0) as small:
        result = small.call(bytearray, 8 * 1024**3, timeout_s=10)
        assert not result.ok and "MemoryError" in result.error
        assert small.call(bytearray, 10).ok


def test_concurrent_callers_share_workers() -> None:
    with GradingPool(n_workers=2, spares=0) as p:
        p.warm()
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as ex:
            results = list(ex.map(lambda v: p.call(nap_and_return, 0.3, v, timeout_s=5), range(4)))
        assert [r.value for r in results] == [0, 1, 2, 3]
        assert time.perf_counter() - start < 1.5  # two at a time, not four in a row


def test_closed_pool_refuses_calls() -> None:
    p = GradingPool(spares=0)
    p.close()
    with pytest.raises(RuntimeError):
        p.call(worker_pid)


def test_math_verify_runs_off_the_main_thread_without_its_signal_timeout() -> None:
    """math-verify's own timeout would raise ValueError outside the main thread."""
    from esrepro.tasks.math import math_verify_match

    assert _in_thread(math_verify_match, ["\\frac{1}{2}"], "0.5") is True
    assert _in_thread(math_verify_match, ["\\frac{1}{2}"], "0.6") is False


def test_a_worker_that_cannot_start_is_reported() -> None:
    with GradingPool(preload=("no_such_module_for_esrepro",), spares=0) as p:
        result = p.call(worker_pid)
        assert not result.ok and "ModuleNotFoundError" in result.error
        with pytest.raises(RuntimeError, match="did not start"):
            p.warm()
