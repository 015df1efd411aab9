"""The code a figure was measured with (k25exp.code_hash) and the report's provenance by it,
on a throwaway git repository whose files and commits are made here."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from k25exp import code_hash
from k25exp.report import provenance
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    for path, text in {"k25exp/runners/macro.py": "A = 1\n", "k25exp/report/render.py": "R = 1\n",
                       "conf/server/vllm.yaml": "port: 8000\n", "docs/x.md": "doc\n",
                       "pyproject.toml": "[project]\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def commit(root, path, text, msg):
    (root / path).write_text(text)
    git(root, "commit", "-qam", msg)
    return git(root, "rev-parse", "HEAD")


def test_the_modules_that_read_runs_back_are_out_of_scope():
    """The MLflow read side sits in tracking/ beside the write side, which is in scope."""
    assert not code_hash.in_scope("k25exp/tracking/read.py")
    assert not code_hash.in_scope("k25exp/tracking/ui_links.py")
    assert not code_hash.in_scope("k25exp/compare/resolve.py")
    assert code_hash.in_scope("k25exp/tracking/mlflow_store.py")
    assert code_hash.in_scope("k25exp/tracking/ui_view.py")


def test_blob_ids_are_gits():
    assert code_hash.blob_id(b"A = 1\n") == hashlib.sha1(b"blob 6\0A = 1\n").hexdigest()


def test_a_working_tree_and_its_commit_hash_alike_and_only_measuring_code_counts(repo):
    first = git(repo, "rev-parse", "HEAD")
    h = code_hash.working_tree_hash(repo)
    assert h == code_hash.commit_hash(repo, first)
    # by hand: the three files in scope (docs/ and the report are not), sorted by path
    blobs = {p: code_hash.blob_id((repo / p).read_bytes())
             for p in ("conf/server/vllm.yaml", "k25exp/runners/macro.py", "pyproject.toml")}
    assert h == hashlib.sha256("".join(f"{p}\0{b}\n" for p, b in sorted(blobs.items())).encode()).hexdigest()
    docs_only = commit(repo, "docs/x.md", "other doc\n", "docs")
    report_only = commit(repo, "k25exp/report/render.py", "R = 2\n", "report")
    assert code_hash.commit_hash(repo, docs_only) == code_hash.commit_hash(repo, report_only) == h
    (repo / "k25exp/runners/macro.py").write_text("A = 2\n")   # uncommitted: counted
    assert code_hash.working_tree_hash(repo) != h
    assert code_hash.commit_hash(repo, "0" * 40) is None


def view(i, tags):
    return RunView(f"run{i}".ljust(32, "0"), "1", "macro", "FINISHED", i,
                   params={"model.name": "tiny_kimi"}, tags=tags)


def test_runs_of_two_commits_that_differ_outside_the_measuring_code_meet(repo, monkeypatch):
    monkeypatch.setattr(provenance, "REPO", repo)
    provenance._commit_code.cache_clear()
    first = git(repo, "rev-parse", "HEAD")
    report_only = commit(repo, "k25exp/report/render.py", "R = 3\n", "report")
    runner = commit(repo, "k25exp/runners/macro.py", "A = 3\n", "runner")
    clean = {"git_dirty": "False"}
    runs = [view(1, {"git_commit": first, **clean}), view(2, {"git_commit": report_only, **clean}),
            view(3, {"code_sha256": code_hash.commit_hash(repo, first)}),   # a newer run's tag
            view(4, {"git_commit": runner, **clean})]
    kept, refused = provenance.check(Campaign("c", "uri", runs))
    assert [r.run_id[:4] for r in kept.runs] == ["run1", "run2", "run3"]
    assert len(refused) == 1 and refused[0].field == "code_sha256"
    assert refused[0].value == code_hash.commit_hash(repo, runner)
    assert provenance.code_source(runs[0]) == "commit's tree"
    assert provenance.code_source(runs[2]) == "code_sha256 tag"
    # a dirty tree's commit says nothing of what ran: compared by commit and diff
    dirty = view(5, {"git_commit": first, "git_dirty": "True", "git_diff_sha256": "ab" * 32})
    assert provenance.code_of(dirty) == f"commit {first} + diff {'ab' * 6}"
    line = provenance.ran_with(kept)
    assert f"code_sha256 {code_hash.commit_hash(repo, first)[:12]}" in line
    assert "(runs' code by: commit's tree 2, code_sha256 tag 1)" in line
    provenance._commit_code.cache_clear()


def test_code_declared_the_same_is_kept_and_named_others_still_refused():
    a, b, other = "a" * 64, "b1" * 32, "c" * 64
    runs = [view(1, {"code_sha256": a}), view(2, {"code_sha256": a}),
            view(3, {"code_sha256": b}), view(4, {"code_sha256": other})]
    c = Campaign("c", "uri", runs)
    kept, refused = provenance.check(c)
    assert [r.run_id[:4] for r in kept.runs] == ["run1", "run2"]
    assert [x.run.run_id[:4] for x in refused] == ["run3", "run4"]
    assert "pooled" not in provenance.ran_with(kept)
    # b's first 8 characters declare it the same as the campaign's code; c stays refused
    kept, refused = provenance.check(c, ["b1b1b1b1"])
    assert [r.run_id[:4] for r in kept.runs] == ["run1", "run2", "run3"]
    assert [(x.run.run_id[:4], x.field, x.value) for x in refused] == [("run4", "code_sha256", other)]
    line = provenance.ran_with(kept, ["b1b1b1b1"])
    assert f"code_sha256 {a[:12]} " in line   # the campaign's own code is still the majority's
    assert line.endswith(f"pooled with it by experiment.same_code {b[:12]} (runs {runs[2].short})")
    # a prefix of another field's value does not reach past the code check
    assert provenance.declared_same("ccc", ["b1b1b1b1"]) is None


@pytest.mark.parametrize("bad", ["b1b1", "B1B1B1B1", "not-hex-at-all"])
def test_same_code_entries_must_be_hash_prefixes(bad):
    from k25exp.config.validate import ConfigError, to_typed
    from tests.conftest import compose_cfg

    with pytest.raises(ConfigError, match=r"experiment.same_code\[0\]=.*8 to 64 lowercase hex"):
        to_typed(compose_cfg("experiment=report", "experiment.campaign=c", "tracking=none",
                             "experiment.tracking_uri=sqlite:///unused.db",
                             f"experiment.same_code=[{bad}]"), gpu_count=lambda: 0)


@pytest.mark.parametrize("declared", [False, True])
def test_the_report_runner_keeps_a_declared_code_and_names_it(tmp_path, monkeypatch, declared):
    """Through the report's runner: one profile run carries another code hash; refused (and
    counted in runs_refused) unless experiment.same_code names it, then kept and named in
    the header's "Ran with" line."""
    import k25exp.runners.campaign_report as runner
    from k25exp.config.validate import to_typed
    from k25exp.tracking import MemoryRecorder
    from tests.conftest import compose_cfg
    from tests.report.test_one_rank import one_rank_campaign

    c = one_rank_campaign()
    for r in c.runs:
        r.tags["code_sha256"] = "a" * 64
    odd = c.runs[-1]
    odd.tags["code_sha256"] = "5eed" * 16
    monkeypatch.setattr(runner, "load_campaign", lambda uri, campaign_id: c)
    over = ["experiment.same_code=[5eed5eed]"] if declared else []
    cfg = to_typed(compose_cfg("experiment=report", "experiment.campaign=rank", "tracking=none",
                               "experiment.tracking_uri=sqlite:///unused.db",
                               f"paths.outputs={tmp_path}", *over), gpu_count=lambda: 0)
    summary = runner.run(cfg, tmp_path / "job", MemoryRecorder())
    md = (tmp_path / "job" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("Ran with:"))
    assert summary["runs_refused"] == (0 if declared else 1)
    assert (f"pooled with it by experiment.same_code 5eed5eed5eed (runs {odd.short})" in header) == declared
    assert (f"run {odd.short} (profile) refused: code_sha256={'5eed' * 16}" in md) != declared
