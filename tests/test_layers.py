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
    assert "Contracts: 7 kept, 0 broken." in r.stdout


def planted(tmp_path: Path, module: str, imported: str) -> subprocess.CompletedProcess:
    """lint on a copy of the package whose `module` (a path under k25exp/) imports `imported`."""
    shutil.copytree(ROOT / "k25exp", tmp_path / "k25exp",
                    ignore=shutil.ignore_patterns("__pycache__", "conf"))
    path = tmp_path / "k25exp" / module
    path.write_text(path.read_text() + f"\nimport {imported}  # planted\n")
    return lint(tmp_path)


def test_an_upward_import_breaks_the_contract(have_linter, tmp_path):
    """tracking importing runners (recover.py did, to recompute figures), planted in a copy."""
    r = planted(tmp_path, "tracking/liveness.py", "k25exp.runners.macro")
    assert r.returncode != 0
    assert "tracking never imports runners" in r.stdout and "BROKEN" in r.stdout
    assert "k25exp.tracking.liveness -> k25exp.runners.macro" in r.stdout


def test_the_tpot_model_reading_runs_breaks_its_contract(have_linter, tmp_path):
    """The TPOT model is arithmetic on figures handed to it: reading runs itself, planted in a
    copy, is refused."""
    r = planted(tmp_path, "report/tpot_model.py", "k25exp.report.sources")
    assert r.returncode != 0
    assert "the TPOT model is arithmetic on measured figures" in r.stdout and "BROKEN" in r.stdout
    assert "k25exp.report.tpot_model -> k25exp.report.sources" in r.stdout


def test_compare_reading_report_and_mlflow_outside_tracking_break_their_contracts(have_linter, tmp_path):
    """compare importing report (it did, to borrow RunView and run_url), and a module outside
    tracking importing mlflow inside a function (report/sources.py and compare/resolve.py did),
    planted in one copy."""
    shutil.copytree(ROOT / "k25exp", tmp_path / "k25exp",
                    ignore=shutil.ignore_patterns("__pycache__", "conf"))
    for module, line in (("compare/envdiff.py", "\nfrom k25exp.report.sources import Campaign  # planted\n"),
                         ("report/render.py", "\n\ndef _planted():\n    from mlflow.tracking import MlflowClient\n")):
        path = tmp_path / "k25exp" / module
        path.write_text(path.read_text() + line)
    r = lint(tmp_path)
    assert r.returncode != 0
    assert "Contracts: 5 kept, 2 broken." in r.stdout
    assert "k25exp.compare is not allowed to import k25exp.report" in r.stdout
    assert "k25exp.compare.envdiff -> k25exp.report.sources" in r.stdout
    assert "Illegal imports of protected package mlflow" in r.stdout
    assert "k25exp.report.render -> mlflow" in r.stdout
