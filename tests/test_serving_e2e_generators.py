"""The serving bench's wait for its load generators: results from every generator, and a generator that died
without reporting is an error at once, not a wait to the deadline."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from bench.serving_e2e import collect_calls


def _reports(queue, calls: list) -> None:
    queue.put(calls)


def _dies(queue) -> None:
    os._exit(3)  # as an ImportError or the OOM killer would leave it: nothing put


def test_every_generators_calls_are_collected():
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_reports, args=(queue, [f"call-{i}"])) for i in range(3)]
    for p in procs:
        p.start()
    assert sorted(collect_calls(queue, procs, deadline=time.perf_counter() + 30, poll_s=0.5)) == [
        "call-0",
        "call-1",
        "call-2",
    ]
    for p in procs:
        p.join()


def test_a_generator_that_died_without_reporting_ends_the_wait_with_its_exit_code():
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_reports, args=(queue, ["call-0"])), ctx.Process(target=_dies, args=(queue,))]
    for p in procs:
        p.start()
    started = time.perf_counter()
    died = r"1 load generator\(s\) died without reporting \(exit codes of those that ended: \[0, 3\]\)"
    with pytest.raises(RuntimeError, match=died):
        collect_calls(queue, procs, deadline=time.perf_counter() + 600, poll_s=0.5)
    assert time.perf_counter() - started < 30  # not the deadline's 600 s
    for p in procs:
        p.join()
