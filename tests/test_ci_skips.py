"""tests/ci_skips.py, run on a small suite of its own in a child pytest: with CI set, every kind of skip fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.ci_skips import skips_are_failures

ROOT = Path(__file__).resolve().parents[1]

SKIPPING_SUITE = {
    "test_runtime.py": """
        import pytest

        @pytest.fixture
        def chromium():
            pytest.skip("chromium not found at /nowhere")

        def test_skips_in_a_fixture(chromium):
            pass

        def test_skips_in_the_body():
            pytest.skip("reference venv is missing")

        @pytest.mark.skipif(True, reason="needs a thing")
        def test_skipif_mark():
            pass

        @pytest.mark.xfail(reason="a known bug", strict=True)
        def test_expected_failure():
            assert False

        def test_passes():
            pass
    """,
    "test_module_skip.py": """
        import pytest

        pytest.importorskip("a_module_that_is_not_installed")

        def test_never_collected():
            pass
    """,
}


def run_child(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    for name, source in SKIPPING_SUITE.items():
        (tmp_path / name).write_text(textwrap.dedent(source))
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:django", "-p", "tests.ci_skips"]
    return subprocess.run(
        [*command, "-rA", "--continue-on-collection-errors", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_under_ci_every_skip_fails_with_its_reason(tmp_path):
    ci = "true"
    result = run_child(tmp_path, ci)
    out = result.stdout
    assert result.returncode == 1, out
    for reason in ("chromium not found at /nowhere", "reference venv is missing", "needs a thing"):
        assert f"skipped, but CI={ci} runs every test: {reason}" in out, out
    assert "could not import 'a_module_that_is_not_installed'" in out, out
    assert "ERROR test_module_skip.py - skipped, but CI" in out, out  # a module-level skip fails at collection
    assert "XFAIL test_runtime.py::test_expected_failure" in out, out  # an expected failure is no skip
    # Skips in fixtures and skipif marks fail at setup, so pytest counts them as errors.
    assert "1 failed, 1 passed, 1 xfailed, 3 errors" in out.strip().splitlines()[-1], out


def test_outside_ci_skips_stay_skips(tmp_path):
    result = run_child(tmp_path, ci="false")
    assert result.returncode == 0, result.stdout
    assert "1 passed, 4 skipped, 1 xfailed" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("value", "is_ci"),
    [(None, False), ("", False), ("false", False), ("False", False), ("0", False), ("true", True), ("1", True)],
)
def test_which_ci_values_count(monkeypatch, value, is_ci):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert skips_are_failures() is is_ci
