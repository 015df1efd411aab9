"""Shared fixtures: compose the real configs, run the real CLI into a temporary store."""

from __future__ import annotations

import atexit
import functools
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from k25exp.config import register_configs
from k25exp.config.store import project_root

ROOT = project_root()
register_configs()


def _torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cuda_state(devices=None, nvidia_smi=None, cuda_available=_torch_cuda_available,
               ) -> tuple[str, str]:
    """("ok" | "absent" | "broken", why). Absent only when the machine has no GPU at all: no
    /dev/nvidia* device and no nvidia-smi. A GPU that torch cannot use (no CUDA build, a
    driver too old, an import that fails) is broken: its CUDA tests fail saying so, never
    skip as if there were no GPU. `devices`, `nvidia_smi`: what the machine has (None: look)."""
    if devices is None:
        devices = sorted(glob.glob("/dev/nvidia[0-9]*"))
        nvidia_smi = shutil.which("nvidia-smi")
    if not devices and not nvidia_smi:
        return "absent", "no /dev/nvidia* device and no nvidia-smi: no GPU on this machine"
    seen = ", ".join(devices + ([nvidia_smi] if nvidia_smi else []))
    try:
        if cuda_available():
            return "ok", ""
        why = "torch.cuda.is_available() is False"
    except Exception as e:
        why = f"torch cannot use CUDA: {type(e).__name__}: {e}"
    return "broken", f"this machine has a GPU ({seen}) but {why}"


CUDA = cuda_state()


def vllm_cpu_level() -> str | None:
    """The ISA level vLLM's CPU build runs at in this suite: K25EXP_TEST_CPU_ISA's cap (set
    below for every process the tests start), else what the CPU has."""
    from k25exp import vllm_kernels

    return os.environ.get(vllm_kernels.ENV) or vllm_kernels.native_level()


def vllm_cpu_build() -> str | None:
    """The kernel library vLLM's CPU build loads at that level (AMX runs inside avx512_bf16's)."""
    from k25exp import vllm_kernels

    level = vllm_cpu_level()
    return vllm_kernels.build_of(level) if level else None


def vllm_cpu_attention_backend(selected: str | None = None, use_mla: bool = True) -> str:
    """The attention backend vLLM's CPU build picks in this suite, asked of vLLM itself
    (CpuPlatform.get_attn_backend_cls, under the suite's ISA cap, which this process carries
    too): for an MLA model AMX_MLA where torch sees AMX tiles unless CPU_MLA is asked for
    (`--attention-backend`), else CPU_MLA; CPU_ATTN for any other model."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    import torch

    sel = AttentionSelectorConfig(head_size=576 if use_mla else 128, dtype=torch.bfloat16,
                                  kv_cache_dtype=None, block_size=None, use_mla=use_mla)
    path = CpuPlatform.get_attn_backend_cls(AttentionBackendEnum[selected] if selected else None, sel)
    return next(e.name for e in AttentionBackendEnum if e.value == path)


def vllm_cpu_allreduce() -> str:
    """The path vLLM's CPU build all-reduces on at that level: its shared-memory all-reduce
    needs AVX-512; on AVX2 it falls back to torch.distributed over gloo."""
    return "gloo" if vllm_cpu_level() == "avx2" else "shm"


def pytest_configure(config):
    """K25EXP_TEST_CPU_ISA=avx2: the whole suite on the path an AVX2-only CPU takes, on any
    machine with AVX2 (one with AVX-512 included); =avx512 the AVX-512 build without BF16;
    =avx512_bf16 on an AMX machine, the path of one without tiles (CPU_MLA attention). The cap goes into this process (kernels
    tests load in-process) and, as K25EXP_VLLM_CPU_ISA, into every process the tests start:
    servers, torchrun ranks and k25exp jobs (whose cpu_local hardware reads it as
    hardware.vllm_cpu_isa, so each run says it in its params and tags)."""
    from k25exp import vllm_kernels

    isa = os.environ.get("K25EXP_TEST_CPU_ISA") or None
    if isa is None:
        return
    if why := vllm_kernels.check_level(isa, vllm_kernels.native_level()):
        raise pytest.UsageError(f"K25EXP_TEST_CPU_ISA: {why}")
    os.environ.update(vllm_kernels.child_env(isa))  # the cap, and compile caches of its own
    vllm_kernels.cap(isa)


def pytest_report_header(config):
    from k25exp import vllm_kernels

    capped = os.environ.get(vllm_kernels.ENV)
    how = f"capped by {vllm_kernels.ENV} (the CPU has {vllm_kernels.native_level()})" if capped else "the CPU's own"
    try:
        attn = vllm_cpu_attention_backend()
    except ImportError:
        attn = "no vLLM installed"
    except NotImplementedError as e:  # vLLM's CUDA build: its CpuPlatform refuses MLA
        attn = f"none on this vLLM build ({e})"
    return (f"vLLM CPU kernels: {vllm_cpu_level()} ({vllm_cpu_build()} build), {how}; "
            f"all-reduce on {vllm_cpu_allreduce()}; MLA attention {attn}")


# Fixtures that start a real vLLM server: their tests run in one xdist worker, in order.
VLLM_SERVER_FIXTURES = {"vllm", "campaign_full"}
# Fixtures that start processes end to end (a k25exp job, a server): their tests are `e2e`.
E2E_FIXTURES = {"k25", *VLLM_SERVER_FIXTURES}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marker
def pytest_collection_modifyitems(config, items):
    """Tests that start a real vLLM server run in one xdist worker, one after another: the
    servers are reused by launch key within a process, their orphan checks look at every vLLM
    process on the machine, and two at once would compete for the same two cores. Each module
    of fake-server tests runs in a worker of its own choosing (its orphan checks look only at
    its own model folder), beside the vLLM worker. Tests that use a process-starting fixture
    or the fake server are `e2e`, as are those marked so by hand. `cuda` tests need a GPU: here they skip,
    saying so; on a GPU box (`pytest -m cuda`) they all run, and a missing optional kernel is
    an xfail with its reason; on a box with a GPU that torch cannot use they fail, saying why
    (cuda_state)."""
    skip = None if CUDA[0] != "absent" else pytest.mark.skip(
        reason="needs a CUDA GPU (run `pytest -m cuda` on a GPU box)")
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if E2E_FIXTURES & fixtures or "fake_server" in item.keywords:
            item.add_marker(pytest.mark.e2e)
        if VLLM_SERVER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.xdist_group("servers"))
        elif "fake_server" in item.keywords:
            item.add_marker(pytest.mark.xdist_group(f"fake:{item.module.__name__}"))
        if skip and "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    """A CUDA test on a machine whose GPU torch cannot use fails, with the reason."""
    if CUDA[0] == "broken" and "cuda" in item.keywords:
        pytest.fail(CUDA[1], pytrace=False)


# The cheapest real job, for tests whose subject is not the experiment (tracking, launchers,
# the store, settings checks): one GEMM shape of the tiny model, two calls per point, torch
# only. No torchrun and no vLLM import: ~5 s of CPU, half a collective job's.
LIGHT_JOB = ("experiment=gemm", "model=tiny_kimi", "experiment.shapes=[expert_down]",
             "experiment.m_values=[1,2]", "experiment.moe_concurrency=[]", "experiment.moe_batches=[]",
             "experiment.calls=2", "experiment.kernels=[torch_bf16]")
LIGHT_METRIC = "expert_down.tp2/torch_bf16/latency_us"  # logged at step = m (1, 2)


def compose_cfg(*overrides: str):
    """The config `python -m k25exp <overrides>` would run (Hydra's own compose)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    outputs: Path
    uri: str

    @property
    def client(self):
        from mlflow.tracking import MlflowClient  # lazily: GPU nodes run tests/gemm without MLflow

        return MlflowClient(self.uri)

    def runs(self):
        c = self.client
        ids = [e.experiment_id for e in c.search_experiments()]
        return c.search_runs(ids, order_by=["attributes.start_time ASC"], max_results=1000)


@pytest.fixture
def k25(tmp_path):
    """Runs `python -m k25exp ARGS` with outputs and the MLflow store under tmp_path."""
    return make_k25(tmp_path)


def job_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child k25exp process: without the store and campaign
    a developer's shell may set (a test says where its runs go), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "K25EXP_CAMPAIGN")}
    return {**env, **extra}


@functools.lru_cache(maxsize=1)
def pristine_store() -> Path:
    """An empty SQLite store MLflow created itself, once per test process. MLflow's schema
    migrations take ~1.5 s of CPU per new store; tests whose subject is not store creation
    start from a copy (the fresh-store paths are tested in tests/tracking and tests/faults)."""
    from k25exp.tracking.mlflow_store import MlflowStore

    folder = Path(tempfile.mkdtemp(prefix="k25exp-pristine-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    MlflowStore(f"sqlite:///{folder / 'mlflow.db'}")
    return folder / "mlflow.db"


def seed_store(folder: Path) -> None:
    """A copy of the pristine store as folder/mlflow.db, unless one is there."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "mlflow.db").exists():
        shutil.copy(pristine_store(), folder / "mlflow.db")


@functools.lru_cache(maxsize=1)
def warm_python() -> str:
    """A `python` for test jobs: runs `-m MODULE ARGS` in a fork of a warm interpreter
    (tests/warm_python.py, one server per test process; a job starts ~2 s sooner), or this
    interpreter itself with K25EXP_TEST_COLD=1. An executable file, so that multirun.sh can
    take it as $PYTHON."""
    if os.environ.get("K25EXP_TEST_COLD") == "1":
        return sys.executable
    from k25exp.poll import wait_until

    folder = Path(tempfile.mkdtemp(prefix="k25exp-warm-"))
    sock = folder / "socket"
    server = subprocess.Popen([sys.executable, "-m", "tests.warm_python", "--serve", str(sock)],
                              cwd=ROOT, env=job_env(), stdin=subprocess.DEVNULL,
                              stdout=open(folder / "server.log", "w"), stderr=subprocess.STDOUT)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    atexit.register(server.kill)
    wait_until(lambda: sock.exists() or server.poll() is not None, 300, 0.05, "warm python server")
    assert server.poll() is None, (folder / "server.log").read_text()[-3000:]
    exe = folder / "python"
    client = ROOT / "tests" / "warm_python.py"  # as a script: it imports nothing of the project
    exe.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(client))} "
                   f'{shlex.quote(str(sock))} "$@"\n')
    exe.chmod(0o755)
    return str(exe)


@pytest.fixture(scope="session", autouse=True)
def warm_ranks(request):
    """torchrun and its ranks, in every job and launch the tests start, run on the warm
    interpreter too (K25EXP_PYTHON; the fault tests keep them cold). Only where e2e tests
    run: the quick loop starts no server."""
    e2e = any(item.get_closest_marker("e2e") for item in request.session.items)
    if e2e and os.environ.get("K25EXP_TEST_COLD") != "1":
        os.environ["K25EXP_PYTHON"] = warm_python()
    yield


def make_k25(tmp_path: Path):
    """k25's runner for any folder (module-scoped fixtures use it with their own folder)."""
    outputs = tmp_path / "outputs"
    uri = f"sqlite:///{outputs}/mlflow.db"
    env = job_env()

    def run(*args: str, timeout: float = 300, seed: bool = True) -> CliResult:
        """seed=False: no store is put there first (a test that checks none is created)."""
        if seed and not any(a.startswith(("tracking=", "tracking.uri=")) for a in args):
            seed_store(outputs)  # the default tracking: the local store under outputs
        p = subprocess.run([warm_python(), "-m", "k25exp", *args, f"paths.outputs={outputs}"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        return CliResult(p.returncode, p.stdout, p.stderr, outputs, uri)

    return run


# --- one embedded-default campaign for the whole session ----------------------------------
# ./multirun.sh end to end (debug=quick) is the most expensive fixture: five vLLM server
# starts. The report, spec_decode and profile tests all read this one campaign's runs.

SPEC_K = 3  # spec_decode's num_speculative_tokens in the campaign
PROFILE_OUT = 32  # profile's output_tokens: decode steps per request = PROFILE_OUT - 1
CAMPAIGN_ARGS = [
    "debug=quick", "server.port=0",
    # eager vLLM starts in ~22 s instead of ~34 s (no torch.compile warm-up): what these tests
    # check does not depend on the compile mode
    "server.enforce_eager=true",
    # the batches the reconciliation and the prediction interpolate between (1 … 8)
    "nccl_burst:experiment.tokens=1,8", "profile:experiment.concurrency=1,8",
    # allreduce_sweep: the sizes the EP comparison needs (c × 512 × 2 B for c = 1 … 8)
    "allreduce_sweep:experiment.min_bytes=1024", "allreduce_sweep:experiment.max_bytes=16384",
    "allreduce_sweep:experiment.limit_points=null",
    # profile: every decode step analysed (debug=quick would keep 3), a known count of them
    "profile:experiment.limit_points=null", f"profile:experiment.output_tokens={PROFILE_OUT}",
    # spec_decode: batch 1 only, short requests
    "spec_decode:experiment.concurrency=[1]", "spec_decode:experiment.input_tokens=16",
    "spec_decode:experiment.output_tokens=24", f"spec_decode:experiment.num_speculative_tokens={SPEC_K}",
    # enough drafts per α that the acceptance read back from vLLM's counters means something
    "spec_decode:experiment.requests=8",
]


@dataclass
class Campaign:
    proc: subprocess.CompletedProcess
    uri: str
    tmp: Path

    @property
    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)

    def all_runs(self):
        c = self.client
        return c.search_runs([e.experiment_id for e in c.search_experiments()], max_results=1000)

    @property
    def runs(self):
        """The phase runs (no multirun parents)."""
        return [r for r in self.all_runs() if r.data.tags.get("k25exp.role") != "parent"]


def run_campaign(tmp: Path, name: str, *args: str, phases: str | None = None,
                 timeout: float = 1800) -> Campaign:
    uri = f"sqlite:///{tmp}/mlflow.db"
    seed_store(tmp)
    env = job_env(MLFLOW_TRACKING_URI=uri, K25EXP_CAMPAIGN=name, PYTHON=warm_python())
    env.pop("PHASES", None)
    if phases:
        env["PHASES"] = phases
    p = subprocess.run(["./multirun.sh", *args, f"paths.outputs={tmp}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    return Campaign(p, uri, tmp)


@pytest.fixture(scope="session")
def campaign_full(tmp_path_factory):
    from tests.serving.helpers import orphans

    c = run_campaign(tmp_path_factory.mktemp("campaign"), "c-full", *CAMPAIGN_ARGS)
    assert c.proc.returncode == 0, c.proc.stdout[-3000:] + c.proc.stderr[-3000:]
    # the campaign's servers, by the process groups its runs logged (server.pid = group id)
    groups = {int(r.data.tags["server.pid"]) for r in c.runs if "server.pid" in r.data.tags}
    assert groups and not orphans(groups=groups), "vLLM processes left after the campaign"
    return c
