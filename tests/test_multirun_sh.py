"""multirun.sh: phases as Hydra multiruns under one campaign tag; a failed phase doesn't stop the rest."""

from __future__ import annotations

import os
import subprocess

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, warm_python

pytestmark = pytest.mark.e2e  # starts processes end to end (pyproject's markers)


def test_campaign_runs_phases_and_reports_failures(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "K25EXP_CAMPAIGN": "c-test",
           "PYTHON": warm_python(), "PHASES": "bogus all_to_all"}
    p = subprocess.run(["./multirun.sh", "debug=quick", f"paths.outputs={tmp_path}"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1  # the unknown phase failed ...
    assert "unknown phase 'bogus'" in p.stderr
    assert "1 phase(s) ok (all_to_all), 1 failed (bogus)" in p.stdout  # ... the next one ran
    c = MlflowClient(uri)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert len(runs) == 2  # parent + one child
    assert {r.data.tags.get("campaign") for r in runs} == {"c-test"}


def test_a_mistyped_phase_prefix_stops_before_anything_runs(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHON": warm_python()}
    p = subprocess.run(["./multirun.sh", "specdecode:experiment.num_speculative_tokens=5",
                        f"paths.outputs={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "no phase 'specdecode'" in p.stderr
    assert "=== phase" not in p.stdout and not (tmp_path / "mlflow.db").exists()


def test_a_phase_override_replaces_that_phase_s_own_sweep_of_the_key(tmp_path):
    # nccl_burst sweeps experiment.tokens=1,8,64 by default; the phase-only override wins (one
    # value: a job, where the phase's own sweep would have run three)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "K25EXP_CAMPAIGN": "c-sweep",
           "PYTHON": warm_python(), "PHASES": "nccl_burst"}
    # server settings for the whole campaign (the README's command passes them), and a key of
    # the serving experiments': this phase has neither, so they are left out of its command
    # line (Hydra refused experiment.input_tokens on NcclBurstConfig), and it says so
    p = subprocess.run(["./multirun.sh", "debug=quick", "experiment.communicator=torch",
                        "server.model_path=/models/X", "server.port=0",
                        "experiment.input_tokens=1536",
                        "nccl_burst:experiment.tokens=2", f"paths.outputs={tmp_path}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert ("multirun.sh: phase nccl_burst has no server in its config: not passing "
            "server.model_path=/models/X server.port=0\n") in p.stdout
    assert ("multirun.sh: phase nccl_burst has no experiment.input_tokens in its config: not "
            "passing experiment.input_tokens=1536\n") in p.stdout
    assert "1 phase(s) ok (nccl_burst), 0 failed" in p.stdout
    runs = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()])
    tokens = sorted(int(r.data.params["experiment.tokens"]) for r in runs
                    if r.data.tags.get("k25exp.role") != "parent")
    assert tokens == [2]
    assert not any(k.startswith("server.") for r in runs for k in r.data.params)


def _recording_python(tmp_path):
    """A $PYTHON that lists the campaign with the real interpreter (the phases, their sweeps and
    the keys each phase's config has) and, in place of each phase's job, prints its arguments:
    which overrides reach which phase, without serving a model for minutes."""
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    'if [[ "$1 $2" == "-m k25exp" ]]; then shift 2; echo "RUN $*"; exit 0; fi\n'
                    f'exec {warm_python()} "$@"\n')
    fake.chmod(0o755)
    return str(fake)


def _phase_lines(stdout: str) -> dict[str, str]:
    """Each phase's job command line, by experiment."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("RUN "):
            name = next(w for w in line.split() if w.startswith("experiment="))[len("experiment="):]
            out[name] = line
    return out


def test_the_readme_campaign_gives_server_settings_to_the_serving_phases_only(tmp_path):
    env = {**os.environ, "PYTHON": _recording_python(tmp_path), "K25EXP_CAMPAIGN": "c-route"}
    env.pop("PHASES", None)
    p = subprocess.run(["./multirun.sh", "hardware=rtx_pro_6000_x8_pcie", "model=kimi_k25_int4",
                        "server.model_path=/models/Kimi-K2.5"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = _phase_lines(p.stdout)
    assert set(lines) == {"nccl_burst", "allreduce_sweep", "all_to_all", "gemm", "macro", "profile",
                          "spec_decode", "report"}
    for name, line in lines.items():
        assert "hardware=rtx_pro_6000_x8_pcie model=kimi_k25_int4" in line
        served = name in ("macro", "profile", "spec_decode")
        assert ("server.model_path=/models/Kimi-K2.5" in line) == served, line
        said = (f"multirun.sh: phase {name} has no server in its config: not passing "
                "server.model_path=/models/Kimi-K2.5")
        assert (said in p.stdout) == (not served)


# The phases whose experiment has input_tokens (MacroConfig's, spec_decode's by inheritance,
# ProfileConfig's); the collective, GEMM and report phases have none
HAVE_INPUT_TOKENS = {"macro", "profile", "spec_decode"}
SERVED = {"macro", "profile", "spec_decode"}  # the phases whose config has the server group
CAMPAIGN = {"nccl_burst", "allreduce_sweep", "all_to_all", "gemm", "macro", "profile",
            "spec_decode", "report"}


def test_an_experiment_key_reaches_only_the_phases_whose_experiment_has_it(tmp_path):
    """The README's campaign command with experiment.input_tokens=1536: every phase has an
    `experiment`, but only the serving ones have its input_tokens (Hydra refused it on
    NcclBurstConfig, AllReduceSweepConfig, AllToAllConfig, GemmConfig and the report when the
    script scoped by the top-level key); each other phase says, naming the key, what it was
    not given."""
    env = {**os.environ, "PYTHON": _recording_python(tmp_path), "K25EXP_CAMPAIGN": "c-key"}
    env.pop("PHASES", None)
    p = subprocess.run(["./multirun.sh", "hardware=rtx_pro_6000_x8_pcie", "model=kimi_k25_int4",
                        "server.model_path=/models/Kimi-K2.5", "experiment.input_tokens=1536"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = _phase_lines(p.stdout)
    assert set(lines) == CAMPAIGN
    for name, line in lines.items():
        has = name in HAVE_INPUT_TOKENS
        assert has == (name in SERVED)
        assert ("experiment.input_tokens=1536" in line) == has, line
        said = (f"multirun.sh: phase {name} has no experiment.input_tokens in its config: not "
                "passing experiment.input_tokens=1536")
        assert (said in p.stdout) == (not has), name
        # the server settings as before: one line for the server group, one for the key
        assert ("server.model_path=/models/Kimi-K2.5" in line) == has, line
        assert (f"multirun.sh: phase {name} has no server in its config: not passing "
                "server.model_path=/models/Kimi-K2.5\n" in p.stdout) == (not has), name


def test_a_context_sweep_reaches_the_macro_and_profile_multiruns(tmp_path):
    """Context as a sweep axis: a comma list after PHASE: is a Hydra sweep of that phase's
    multirun (-m), beside the phase's own sweep of other keys (profile's concurrency)."""
    env = {**os.environ, "PYTHON": _recording_python(tmp_path), "PHASES": "macro profile gemm"}
    p = subprocess.run(["./multirun.sh", "server.max_model_len=2048",
                        "macro:experiment.input_tokens=128,512,1536",
                        "profile:experiment.input_tokens=128,512,1536",
                        "profile:experiment.concurrency=1,16"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = {name: line.split() for name, line in _phase_lines(p.stdout).items()}
    assert set(lines) == {"macro", "profile", "gemm"}
    for name in ("macro", "profile"):
        assert lines[name][:3] == ["RUN", "-m", f"experiment={name}"]
        assert "experiment.input_tokens=128,512,1536" in lines[name]
        assert "server.max_model_len=2048" in lines[name]
    # the phase override replaced the profile's own concurrency sweep (1,8,32)
    assert [a for a in lines["profile"] if a.startswith("experiment.concurrency=")] == [
        "experiment.concurrency=1,16"]
    assert not any("input_tokens" in a or a.startswith("server.") for a in lines["gemm"])


@pytest.mark.parametrize("arg,reaches,lacking", [
    # added keys and deletions scope by the part of their key some phase has: the server group
    ("+server.env.HF_HOME=/x", SERVED, "server"),
    ("~server.extra_args", SERVED, "server"),
    ("server=endpoint", SERVED, "server"),  # a group selection
    ("+experiment.x=1", CAMPAIGN, None),  # every phase has an experiment: Hydra decides
    ("experiment.tokens=2", {"nccl_burst"}, "experiment.tokens"),  # NcclBurstConfig's alone
    ("model.routing=uniform", CAMPAIGN, None),
    ("spec=ngram", CAMPAIGN, None),  # a group whose options set experiment.*: no key of its own
    ("experiment.input_tokenz=5", CAMPAIGN, None),  # no phase has it: Hydra names the typo
    ("hydra.verbose=true", CAMPAIGN, None),  # Hydra's own settings: every job has them
])
def test_each_argument_reaches_the_phases_that_have_its_key(tmp_path, arg, reaches, lacking):
    env = {**os.environ, "PYTHON": _recording_python(tmp_path)}
    env.pop("PHASES", None)
    p = subprocess.run(["./multirun.sh", arg], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = _phase_lines(p.stdout)
    assert set(lines) == CAMPAIGN
    assert {name for name, line in lines.items() if arg in line.split()} == reaches
    told = {line for line in p.stdout.splitlines() if line.startswith("multirun.sh: phase ")}
    assert told == {f"multirun.sh: phase {name} has no {lacking} in its config: not passing {arg}"
                    for name in CAMPAIGN - reaches}


def test_h200_campaign_stages_still_route_their_server_settings(tmp_path):
    """benchmarks/h200_campaign.sh passes server.* to every phase of PHASES="profile gemm":
    profile gets them, gemm does not, and the rest of its arguments reach both as before."""
    env = {**os.environ, "PYTHON": _recording_python(tmp_path), "K25_GPU_OUT": str(tmp_path / "out")}
    p = subprocess.run(["benchmarks/h200_campaign.sh", "kimi-rest"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = _phase_lines(p.stdout)
    assert set(lines) == {"profile", "gemm"}
    assert "server.load_format=dummy" in lines["profile"] and "server.port=0" in lines["profile"]
    assert "server." not in lines["gemm"], lines["gemm"]
    for name in lines:
        assert "model=kimi_k25_int4 model.tp_rank_of=8" in lines[name]
        assert "model.routing=uniform" in lines[name] and "tracking=offline" in lines[name]
    assert "experiment.calls=50" in lines["gemm"] and "experiment.concurrency=1,32,128,256" in lines["profile"]


def test_a_dummy_weight_campaign_keeps_one_routing_in_the_phases_without_a_server(tmp_path):
    env = {**os.environ, "PYTHON": _recording_python(tmp_path), "PHASES": "gemm macro"}
    p = subprocess.run(["./multirun.sh", "model=kimi_k25_int4", "server.load_format=dummy"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = _phase_lines(p.stdout)
    # macro routes uniformly on dummy weights by itself (k25exp.model.routing.effective)
    assert "server.load_format=dummy" in lines["macro"] and "model.routing" not in lines["macro"]
    assert "model.routing=uniform" in lines["gemm"] and "server." not in lines["gemm"]


def test_h200_spec_stage_serves_the_rank_with_one_drafter(tmp_path):
    """kimi-spec: spec_decode alone, on the served rank, n-gram only (the campaign sweep's
    self-draft would be a second 71 GiB copy of the rank on one GPU)."""
    env = {**os.environ, "PYTHON": _recording_python(tmp_path), "K25_GPU_OUT": str(tmp_path / "out")}
    p = subprocess.run(["benchmarks/h200_campaign.sh", "kimi-spec"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = _phase_lines(p.stdout)
    assert set(lines) == {"spec_decode"}
    line = lines["spec_decode"]
    assert "spec=ngram" in line and "self_draft" not in line, line
    assert "model=kimi_k25_int4 model.tp_rank_of=8" in line and "server.load_format=dummy" in line
    assert "model.routing=uniform" in line and "server.enforce_eager=false" in line


def test_h200_spec_synth_stage_takes_draft_lengths_and_a_time_limit(tmp_path):
    """kimi-spec-synth with K25_SPEC_DRAFTS passes the draft lengths to spec_decode alone; with
    K25_STAGE_S a job that outlives it is stopped and the stage still packs its runs."""
    env = {**os.environ, "PYTHON": _recording_python(tmp_path), "K25_GPU_OUT": str(tmp_path / "out"),
           "K25_SPEC": "ngram_gpu", "K25_SPEC_DRAFTS": "[1,3,5]", "K25_SPEC_K": "3"}
    p = subprocess.run(["benchmarks/h200_campaign.sh", "kimi-spec-synth"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    line = _phase_lines(p.stdout)["spec_decode"]
    assert "experiment.draft_lengths=[1,3,5]" in line and "experiment.num_speculative_tokens=3" in line
    assert "spec=ngram_gpu" in line and "experiment.baseline_sync=false" in line, line
    slow = tmp_path / "python"  # a job that never ends by itself
    slow.write_text("#!/usr/bin/env bash\n"
                    'if [[ "$1 $2" == "-m k25exp" ]]; then '
                    f'echo started > {tmp_path / "job"}; exec sleep 600; fi\n'
                    f'exec {warm_python()} "$@"\n')
    slow.chmod(0o755)
    got = tmp_path / "OUT"
    got.mkdir()
    env = {**env, "PYTHON": str(slow), "K25_STAGE_S": "2", "OUT": str(got)}
    p = subprocess.run(["benchmarks/h200_campaign.sh", "kimi-spec-prof-spec"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (tmp_path / "job").read_text().strip() == "started"
    assert (got / "runs-kimi-spec-prof-spec.tar.gz").exists()


def test_a_stage_brings_back_the_traces_it_wrote_in_parts(tmp_path):
    """A stage packs its runs without traces, and the traces written during the stage (not
    an earlier stage's) into 15 MiB parts that put back together give the files as written."""
    out, got = tmp_path / "out", tmp_path / "OUT"
    old = out / "multiruns" / "d" / "0" / "traces" / "old_rank0.pt.trace.json.gz"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an earlier stage's")
    os.utime(old, (1, 1))  # written long before this stage began
    new = out / "multiruns" / "d" / "1" / "traces" / "new_rank0.pt.trace.json.gz"
    body = os.urandom(16 * 2**20 + 5)  # over one part: two parts
    fake = tmp_path / "python"  # the profile job: writes its trace
    fake.write_text("#!/usr/bin/env bash\n"
                    'if [[ "$1 $2" == "-m k25exp" ]]; then '
                    f'mkdir -p {new.parent} && head -c {len(body)} {tmp_path / "body"} > {new}; exit 0; fi\n'
                    f'exec {warm_python()} "$@"\n')
    fake.chmod(0o755)
    (tmp_path / "body").write_bytes(body)
    got.mkdir()
    env = {**os.environ, "PYTHON": str(fake), "K25_GPU_OUT": str(out), "OUT": str(got)}
    p = subprocess.run(["benchmarks/h200_campaign.sh", "kimi-profile"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    parts = sorted(got.glob("traces-kimi-profile.tar.part.*"))
    assert [q.name[-1] for q in parts] == ["a", "b"] and parts[0].stat().st_size == 15 * 2**20
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["tar", "-x", "-C", str(back)], input=b"".join(q.read_bytes() for q in parts),
                   check=True)
    files = sorted(str(f.relative_to(back)) for f in back.rglob("*") if f.is_file())
    assert files == ["multiruns/d/1/traces/new_rank0.pt.trace.json.gz"]
    assert (back / files[0]).read_bytes() == body
    runs = subprocess.run(["tar", "-tzf", str(got / "runs-kimi-profile.tar.gz")], check=True,
                          capture_output=True, text=True).stdout
    assert ".pt.trace.json" not in runs
