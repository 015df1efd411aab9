"""`k25exp compare` end to end: macro runs against the fake vLLM server (real launch code,
real client, real MLflow store in tmp), then the CLI as a subprocess.

Runs: one multirun with the fake server's inter-token gap 40, 40 and 48 ms (A, A2, B), and a
run with the base gap pinned to one core (`taskset -c 0`: its env.cpu_affinity tag says 1).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess

from dataclasses import dataclass

import pytest

from tests.conftest import ROOT, job_env, make_k25, warm_python
from tests.serving.helpers import FAKE_ENTRYPOINT, fake_marks, fake_model, orphans

# Its fake servers serve this module's own model folder and its orphan check looks only at
# those, so it runs beside the servers worker rather than in it.
# One worker runs the module: its store fixture (four macro jobs) would run again in another.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("compare")]

MACRO = ["experiment=macro", FAKE_ENTRYPOINT, "server.port=0", "server.ready_timeout_s=30",
         "server.stop_timeout_s=5", "experiment.input_tokens=16", "experiment.output_tokens=5",
         "experiment.concurrency=[2]", "experiment.single_stream_requests=12",
         "experiment.warmup=1", "experiment.min_requests=12", "experiment.progress=false",
         "experiment.reset_prefix_cache=false",
         # one late wake-up of a loaded machine's client voids the single stream ("not
         # judged"): this test is about the comparison, not the client's health. The limit
         # lifted is the absolute rule's (the relative rule holds lag against the step)
         "experiment.validity.rule=absolute", "experiment.max_client_lag_ms=1e9",
         "server.tp=1",  # the fake server has no ranks; one core is enough (the pinned run)
         # a 60 ms "prefill": without one, TTFT is ~2 ms of HTTP overhead that a loaded 2-core
         # machine moves by 30 % from run to run (a real, significant, but meaningless change)
         "+server.env.FAKE_VLLM_TTFT_MS=60"]
GAP = "server.env.FAKE_VLLM_GAP_MS"
# Long enough that the scheduling delay of a loaded 2-core machine (a few ms per sleep) is a
# small part of each gap; LONG_GAP is 20 % longer.
BASE_GAP, LONG_GAP = "40", "48"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    k25 = make_k25(tmp)
    model = fake_model(tmp / "model")
    common = [*MACRO, f"server.model_path={model}", f"server.log_dir={tmp}"]
    sweep = k25("-m", *common, f"+{GAP}={BASE_GAP},{BASE_GAP},{LONG_GAP}")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    pinned = subprocess.run(["taskset", "-c", "0", warm_python(), "-m", "k25exp", *common,
                             f"+{GAP}={BASE_GAP}", f"paths.outputs={sweep.outputs}",
                             # only its tags matter: measure little
                             "experiment.single_stream_requests=3", "experiment.concurrency=[1]",
                             "experiment.min_requests=3"], cwd=ROOT,
                            capture_output=True, text=True, timeout=200,
                            env=job_env())
    assert pinned.returncode == 0, pinned.stderr[-3000:]
    # fake servers of this module's runs only (other test sessions may share the machine)
    assert not orphans(marks=fake_marks(model))
    runs = [r for r in sweep.runs() if r.data.tags.get("k25exp.experiment") == "macro"
            and r.data.tags.get("k25exp.role") != "parent"]
    assert [r.data.params[GAP] for r in runs] == [BASE_GAP, BASE_GAP, LONG_GAP, BASE_GAP]
    ids = {name: r.info.run_id for name, r in zip(("a", "a2", "b", "pinned"), runs)}
    return sweep.uri, tmp, ids


_done: dict = {}


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def compare(uri, tmp, *args, subprocess_cli=True):
    """`k25exp compare ARGS` as a subprocess (the --fail-on exit status as a shell sees it),
    or the same entry point in this process (5 s of imports saved per call). Each distinct
    compare runs once."""
    if args in _done:
        return _done[args]
    out = tmp / "cmp" / "_".join(a[:6] for a in args if not a.startswith("-"))
    argv = ["compare", *args, "--uri", uri, "--out", str(out)]
    if subprocess_cli:
        p = subprocess.run([warm_python(), "-m", "k25exp", *argv], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    else:
        p = _in_process(argv)
    rows = json.loads((out / "compare.json").read_text()) if (out / "compare.json").exists() else None
    _done[args] = p, rows, out
    return _done[args]


def _in_process(argv):
    import importlib

    from k25exp.cli import SUBCOMMANDS

    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    return Done(rc, o.getvalue(), e.getvalue())


def row(rows, metric, step=None):
    return next(r for r in rows["rows"] if r["metric"] == metric and r["step"] == step)


def test_same_gap_is_not_significant_and_does_not_fail(store):
    uri, tmp, ids = store
    p, rows, out = compare(uri, tmp, ids["a"], ids["a2"], "--fail-on", "10")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    tpot = row(rows, "single_stream_tpot_ms")
    assert tpot["significant"] is False and tpot["n"] == [12, 12]
    assert abs(tpot["change_pct"]) < 10
    assert row(rows, "tpot_ms_p50", 2)["significant"] is False
    assert "ok: no significant change worse by more than 10 %" in p.stdout
    # the figure table, the markdown and the HTML page are written; the page is self-contained
    assert "single_stream_tpot_ms" in p.stdout and (out / "compare.md").exists()
    page = (out / "compare.html").read_text()
    assert 'src="data:image/png;base64,' in page and 'src="http' not in page


def test_longer_gap_is_significant_and_fails(store):
    uri, tmp, ids = store
    p, rows, _ = compare(uri, tmp, ids["a"], ids["b"], "--fail-on", "10")
    assert p.returncode == 1, p.stdout[-4000:] + p.stderr[-2000:]
    tpot = row(rows, "single_stream_tpot_ms")
    assert tpot["significant"] is True and tpot["worse_beyond_fail_on"] is True
    # the gap went up 20 %; TPOT = gap + a little, and a loaded machine drifts a few percent
    assert 10 < tpot["change_pct"] < 30
    lo, hi = tpot["ci_pct"]
    assert 0 < lo <= tpot["median_change_pct"] <= hi
    assert "FAIL:" in p.stdout and "single_stream_tpot_ms" in p.stdout
    # the config that changed is named
    assert [GAP, BASE_GAP, LONG_GAP] in rows["param_diff"]


def test_a_figure_without_samples_says_so(store):
    uri, tmp, ids = store
    _, rows, _ = compare(uri, tmp, ids["a"], ids["a2"], "--fail-on", "10")
    tput = row(rows, "output_tok_s", 2)
    assert tput["significant"] is None and tput["p"] is None
    assert tput["note"] == "no samples (summary figure)"
    # a p99 of a few requests is no figure at all (stats.min_samples), so nothing to compare
    assert not [r for r in rows["rows"] if r["metric"] == "tpot_ms_p99"]


def test_environment_diff_names_the_changed_tag(store):
    uri, tmp, ids = store
    p, rows, _ = compare(uri, tmp, ids["a"], ids["pinned"], "--no-track", subprocess_cli=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert ["env.cpu_affinity", str(len(os.sched_getaffinity(0))), "1"] in rows["tag_diff"]
    assert "env.cpu_affinity" in p.stdout
    # run-specific tags are not environment
    assert not [t for t in rows["tag_diff"] if t[0] in ("k25exp.output_dir", "mlflow.runName")]


def test_compare_run_links_both_sides_and_other_experiments_are_refused(store):
    from mlflow.tracking import MlflowClient

    uri, tmp, ids = store
    p, _, out = compare(uri, tmp, ids["a"], ids["a2"], "--fail-on", "10")
    run_id = p.stdout.split("compare run: ")[1].split()[0]
    c = MlflowClient(uri)
    r = c.get_run(run_id)
    assert r.data.tags["compare.a_runs"] == ids["a"] and r.data.tags["compare.b_runs"] == ids["a2"]
    assert c.get_experiment(r.info.experiment_id).name == "k25exp/compare"
    assert {"compare.md", "compare.html", "compare.json"} <= {f.path for f in c.list_artifacts(run_id)}
    # the compare run is a run of another experiment: comparing it with a macro run is refused
    p, rows, _ = compare(uri, tmp, ids["a"], run_id, "--no-track", subprocess_cli=False)
    assert p.returncode == 2 and rows is None
    assert "holds runs of experiment macro; B" in p.stderr and "holds compare" in p.stderr


def test_an_unknown_id_is_an_error_naming_it(store):
    uri, tmp, _ = store
    p, _, _ = compare(uri, tmp, "no-such-run", "nor-this", "--no-track", subprocess_cli=False)
    assert p.returncode == 2 and "'no-such-run' is neither a run id" in p.stderr


@pytest.fixture(autouse=True, scope="module")
def _no_taskset():
    if not shutil.which("taskset"):
        pytest.skip("taskset (util-linux) is needed to pin a run to one core")


def test_ui_links_open_the_model_training_view_and_experiments_are_described(store):
    from urllib.parse import unquote

    from mlflow.tracking import MlflowClient

    from k25exp.config.experiments import MacroConfig

    uri, tmp, ids = store
    p = _in_process(["ui", "--links-only", "--uri", uri])
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    macro = next(x for x in lines if x.strip().startswith("k25exp/macro "))
    assert "/#/experiments/" in macro and "workflowType=machine_learning" in macro
    # the saved view it opens: the headline figures first, in the schema's order
    assert "viewStateShareKey=k25exp-headline" in macro
    sweep = unquote(next(x for x in lines if "compare-runs" in x and "(3 runs)" in x))
    assert all(ids[k] in sweep for k in ("a", "a2", "b")) and ids["pinned"] not in sweep
    exp = MlflowClient(uri).get_experiment_by_name("k25exp/macro")
    assert exp.tags["mlflow.note.content"] == " ".join(MacroConfig.__doc__.split())
    view = json.loads(exp.tags["mlflow.sharedViewState.k25exp-headline"])
    cols = view["selectedColumns"]
    assert cols[:2] == ["attributes.`Run Name`", "tags.`tpot_ms_p50 per c`"]  # each level's TPOT
    assert [c for c in cols if c.startswith("metrics.")][:2] == ["metrics.`single_stream_tpot_ms`",
                                                                 "metrics.`peak_output_tok_s`"]
    assert view["searchFilter"] == "tags.`k25exp.experiment` != ''"  # flat: no collapsed parents
    assert view["columnOrder"] == view["selectedColumns"]
    assert "params.`server.tp`" in view["selectedColumns"]


def test_a_sweep_parent_stands_for_its_children_paired_by_swept_value(store):
    from mlflow.tracking import MlflowClient

    uri, tmp, ids = store
    parent = MlflowClient(uri).get_run(ids["a"]).data.tags["mlflow.parentRunId"]
    p, rows, _ = compare(uri, tmp, parent, parent, "--no-track", subprocess_cli=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert rows["a"]["kind"] == "sweep" and sorted(rows["a"]["runs"]) == sorted([ids["a"], ids["a2"], ids["b"]])
    # gap 40 was run twice: the newer run (A2) stands for it; gap 48 is B
    pairs = {r["pair"] for r in rows["rows"]}
    assert pairs == {f"macro [FAKE_VLLM_GAP_MS={BASE_GAP}]", f"macro [FAKE_VLLM_GAP_MS={LONG_GAP}]"}
    # each run against itself: every tested figure's samples are the same on both sides, so
    # U = n_a·n_b / 2 and p = 1 exactly, and A = B. A pairing that crossed runs (gap 40 against
    # 48) would show p < 1 and a change; a compare that tested nothing would show no rows here.
    tested = [r for r in rows["rows"] if r["p"] is not None]
    assert {r["pair"] for r in tested} == pairs
    assert any(r["metric"] == "single_stream_tpot_ms" and r["n"] == [12, 12] for r in tested)
    for r in tested:
        assert r["p"] == 1.0 and r["p_adjusted"] == 1.0, r
        assert r["n"][0] == r["n"][1] and r["a"] == r["b"] and r["median_change_pct"] == 0.0, r
        assert r["significant"] is False
