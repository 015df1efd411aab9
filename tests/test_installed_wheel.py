"""k25exp as a user installs it: a wheel (not editable) in a fresh venv, run from an empty
folder, so nothing can come from the checkout (its conf/, its sources)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e  # builds, installs and runs k25exp end to end


def run(argv, cwd, env=None, timeout=600):
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{argv}: {p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def test_an_installed_wheel_makes_its_model_and_runs_a_job(tmp_path):
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(ROOT)], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("k25exp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "k25exp/conf/config.yaml" in names and "k25exp/_isa_site/sitecustomize.py" in names
    assert "k25exp/conf/experiment_base/collective.yaml" in names
    # a fresh venv with the wheel alone; its dependencies from this interpreter's
    # site-packages by a .pth (not a site dir: the checkout's editable finder there is not
    # loaded, so `k25exp` can only be the wheel's)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=tmp_path).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
        cwd=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "K25EXP_ROOT", "K25EXP_PYTHON", "MLFLOW_TRACKING_URI",
                        "K25EXP_CAMPAIGN")}
    where = run([str(py), "-c", "import k25exp; print(k25exp.__file__)"], cwd=empty, env=env).stdout
    assert where.startswith(str(site)), where
    made = run([str(venv / "bin" / "k25exp"), "make-model"], cwd=empty, env=env)
    folder = Path(made.stdout.strip().splitlines()[-1])
    assert folder.parent == empty / "outputs" / "models" and (folder / "config.json").exists()
    run([str(py), "-m", "k25exp", "experiment=nccl_burst", "debug=quick"], cwd=empty, env=env)
    assert (empty / "outputs" / "mlflow.db").exists()
    assert list((empty / "outputs" / "runs").glob("*/*/results.txt"))
