"""Safe defaults at the job's edge: secrets never reach what a job writes, and a hardware
config that names another device is flagged on the run (the real CLI, a real store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import LIGHT_JOB, make_k25

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)

TOKEN = "hf_k25exp_test_9d2b7c41e0"  # a value no other file contains
LITERAL = "sk-literal-3c9e5f0a"


def _grep(root: Path, value: str) -> list[str]:
    """Every file under root whose bytes contain value (the SQLite store included)."""
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and value.encode() in p.read_bytes():
            hits.append(str(p.relative_to(root)))
    return hits


def test_a_token_in_hardware_env_appears_nowhere_the_job_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("K25EXP_TEST_HF", TOKEN)  # the child CLI inherits it
    r = make_k25(tmp_path)("experiment=nccl_burst", "debug=quick", "experiment.communicator=torch",
            "+hardware.env.HF_TOKEN=${oc.env:K25EXP_TEST_HF}",
            f"+hardware.env.MY_PASSWORD={LITERAL}",   # given literally on the command line
            "+hardware.env.PLAIN=visible-value", "tracking.redact=[PLAIN]")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = r.runs()
    p = run.data.params
    assert p["hardware.env.HF_TOKEN"] == "***redacted***"
    assert p["hardware.env.MY_PASSWORD"] == "***redacted***"
    assert p["hardware.env.PLAIN"] == "***redacted***"  # listed in tracking.redact
    assert "***redacted***" in run.data.tags["hydra.overrides"]
    # the embedded default's hardware.device_name is "cpu": unchecked, not failed
    assert run.data.tags["device_name_match"] == "unchecked" and "device_warning" not in run.data.tags
    for value in (TOKEN, LITERAL, "visible-value"):
        assert not _grep(r.outputs, value), f"{value} leaked into {_grep(r.outputs, value)}"
        assert value not in r.stdout + r.stderr


def test_a_device_name_that_does_not_match_is_flagged_on_the_run(k25):
    r = k25(*LIGHT_JOB, "hardware.device_name=Imaginary Accelerator 9000")
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = r.runs()
    t = run.data.tags
    assert t["device_name_match"] == "false"
    assert "Imaginary Accelerator 9000" in t["device_warning"]
    assert t["device_found"] and t["device_found"] != "none"  # the CPU model this ran on
    assert "hardware.device_name='Imaginary Accelerator 9000'" in r.stdout + r.stderr  # Hydra logs to stdout
