"""The package's layers and its forbidden imports (pyproject's [tool.importlinter]), checked by
import-linter on the real package, and shown to catch a violation planted in a copy of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def have_linter():
    if not LINT.exists():
        pytest.skip("import-linter is not installed (the test extra brings it)")


def test_the_package_keeps_its_layers(have_linter):
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "Contracts: 5 kept, 0 broken." in r.stdout


def test_planted_imports_break_their_contracts(have_linter, tmp_path):
    """In a copy of the package (one lint run for the three): tracking importing runners
    (recover.py did, to recompute figures), compare importing report (it did, to borrow
    RunView and run_url), and a module outside tracking importing mlflow inside a function
    (report/sources.py and compare/resolve.py did)."""
    shutil.copytree(ROOT / "k25exp", tmp_path / "k25exp",
                    ignore=shutil.ignore_patterns("__pycache__", "conf"))

    def plant(module: str, line: str) -> None:
        path = tmp_path / "k25exp" / module
        path.write_text(path.read_text() + line)

    plant("tracking/liveness.py", "\nimport k25exp.runners.macro  # planted\n")
    plant("compare/envdiff.py", "\nfrom k25exp.report.sources import Campaign  # planted\n")
    plant("report/render.py", "\n\ndef _planted():\n    from mlflow.tracking import MlflowClient\n")
    r = lint(tmp_path)
    assert r.returncode != 0
    assert "Contracts: 2 kept, 3 broken." in r.stdout
    assert "k25exp.tracking.liveness -> k25exp.runners.macro" in r.stdout
    assert "k25exp.compare is not allowed to import k25exp.report" in r.stdout
    assert "k25exp.compare.envdiff -> k25exp.report.sources" in r.stdout
    assert "Illegal imports of protected package mlflow" in r.stdout
    assert "k25exp.report.render -> mlflow" in r.stdout
