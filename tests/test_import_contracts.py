"""The architecture contract (``.importlinter``) holds, and it would catch a break.

``lint-imports`` checks the static import graph: webapp reaches inference only through
``inference.api`` / ``inference.contracts``, models never import engines or the service, the service
core is layered (no cycles). A static graph cannot tell an eager import from one inside a function,
so what the web tier really loads is checked by importing every webapp module in a fresh interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / ".importlinter")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_are_kept():
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


def test_the_contracts_catch_a_web_tier_shortcut_and_a_service_core_cycle(tmp_path):
    """The same contracts on a copy with two forbidden imports added: both are reported."""
    for package in ("inference", "webapp"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    with open(tmp_path / "webapp" / "conversations" / "protocol.py", "a") as f:
        f.write("\nfrom inference.session.dialogue import DialogueSession  # noqa\n")
    with open(tmp_path / "inference" / "contracts.py", "a") as f:
        f.write("\nfrom inference.service import InferenceService  # noqa\n")

    result = _lint_imports(tmp_path)

    assert result.returncode != 0, result.stdout
    assert "webapp.conversations.protocol -> inference.session.dialogue" in result.stdout, result.stdout
    assert "inference.contracts -> inference.service" in result.stdout, result.stdout


def _copy_with(tmp_path: Path, additions: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on a copy of inference/ and webapp/ with ``additions`` (path -> source) appended."""
    for package in ("inference", "webapp"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    for relative, source in additions.items():
        with open(tmp_path / relative, "a") as f:
            f.write(source)
    return _lint_imports(tmp_path)


def test_the_contracts_catch_an_import_back_up_between_packages_and_an_unlisted_module(tmp_path):
    """The layers reach every package: the framing importing the registry (transport -> cluster), the
    worker importing the session (slots -> session), and a new root module in no row are each reported."""
    result = _copy_with(
        tmp_path,
        {
            "inference/transport/wire.py": "\nfrom inference.cluster import registry  # noqa\n",
            "inference/slots/pool.py": "\nfrom inference.session import outbox  # noqa\n",
            "inference/stray.py": "from inference import service  # noqa\n",
        },
    )

    assert result.returncode != 0, result.stdout
    assert "inference.transport.wire -> inference.cluster.registry" in result.stdout, result.stdout
    assert "inference.slots.pool -> inference.session.outbox" in result.stdout, result.stdout
    assert "- inference.stray" in result.stdout, result.stdout


def test_the_contracts_catch_a_cycle_inside_a_package(tmp_path):
    """Two sibling modules of a webapp app importing each other break the acyclic contract."""
    result = _copy_with(
        tmp_path, {"webapp/accounts/models.py": "\nfrom webapp.accounts import services  # noqa\n"}
    )

    assert result.returncode != 0, result.stdout
    assert "No cycles are allowed in webapp.accounts" in result.stdout, result.stdout


def test_importing_the_whole_web_tier_loads_no_torch_engine_or_model():
    """Every webapp module imported for real (Django set up): torch, engines and models stay unloaded."""
    # The web process may load them only by calling a facade function that runs inference work.
    script = """
import importlib, pkgutil, sys
import django
django.setup()
import webapp
for module in pkgutil.walk_packages(webapp.__path__, "webapp."):
    if not module.name.startswith("webapp.settings."):  # one settings module is enough (and others refuse)
        importlib.import_module(module.name)
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "inference.engines", "inference.models")))
print("LOADED", loaded)
print("FACADE", "inference.api" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": "webapp.settings.test"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "FACADE True" in result.stdout, result.stdout  # the walk did reach the modules that use inference
    assert "LOADED []" in result.stdout, result.stdout
