"""Under CI a skipped test is a failed test (a pytest plugin; tests/conftest.py registers its hooks).

A skip hides an untested path: a missing chromium once made every browser test skip and the run
pass. CI installs everything the suite needs, so there a skip can only mean a broken install. With
``CI`` set (non-empty, not "false" or "0", as CI services set it) every skip -- a ``skip``/``skipif``
mark, ``pytest.skip`` in a test or fixture, a module-level skip or ``importorskip`` at collection --
is reported as a failure carrying the skip's reason. Expected failures (xfail) are left alone; tests
deselected with ``-m`` (``not gpu``) never run, so they cannot skip.
"""

from __future__ import annotations

import os

import pytest


def skips_are_failures() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "false", "0")


def _fail_instead(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"skipped, but CI={os.environ['CI']} runs every test: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and skips_are_failures():
        _fail_instead(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    report = yield
    if report.skipped and skips_are_failures():
        _fail_instead(report)
    return report
