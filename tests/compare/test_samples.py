"""The samples behind figures, from hand-built artifacts (values worked out by hand)."""

from __future__ import annotations

import json

import pytest

from k25exp.compare.samples import collective_samples, serving_samples, why_no_samples


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_collective_samples_are_the_slowest_ranks_per_burst_and_per_op(tmp_path):
    env = [{"kind": "env", "rank": r, "world_size": 2} for r in (0, 1)]
    point = {"kind": "point", "point": 0, "label": 8, "numel": 4, "bytes": 8, "burst": 2}
    _write(tmp_path / "rank0.jsonl", [env[0], {**point, "rank": 0, "queued_s": [1.0, 4.0],
                                               "blocking_s": [0.1, 0.5]}])
    _write(tmp_path / "rank1.jsonl", [env[1], {**point, "rank": 1, "queued_s": [3.0, 2.0],
                                               "blocking_s": [0.3, 0.4]}])
    s = collective_samples(tmp_path, "allreduce_sweep")
    # slowest rank per burst: 3 s and 4 s for 2 ops → 1.5 s and 2 s per op; step = bytes (8)
    assert s[("time_us", 8)] == pytest.approx([1.5e6, 2e6])
    assert s[("blocking_us_p50", 8)] == pytest.approx([0.3e6, 0.5e6])
    # 8 B in 1.5 s = 5.33e-9 GB/s; bus factor of an all-reduce over 2 ranks: 2 × 1/2 = 1
    assert s[("busbw_gbps", 8)] == pytest.approx([8 / 1.5 / 1e9, 8 / 2 / 1e9])
    burst = collective_samples(tmp_path, "nccl_burst")
    assert burst[("burst_ms", None)] == pytest.approx([3000.0, 4000.0])


def test_a_steps_bus_bandwidth_counts_its_all_gather_as_one(tmp_path):
    env = [{"kind": "env", "rank": r, "world_size": 2} for r in (0, 1)]
    # a step of one all-reduce of 8 B and an all-gather of 16 B (gathered)
    point = {"kind": "point", "point": 0, "label": 1, "numel": 4, "bytes": 24, "burst": 2,
             "sequence_ops": ["all_reduce", "all_gather"], "sequence_bytes": [8, 16]}
    _write(tmp_path / "rank0.jsonl", [env[0], {**point, "rank": 0, "queued_s": [2.0]}])
    _write(tmp_path / "rank1.jsonl", [env[1], {**point, "rank": 1, "queued_s": [1.0]}])
    s = collective_samples(tmp_path, "nccl_burst")
    # 2 ranks: 8 B × 2·1/2 + 16 B × 1/2 = 16 bus bytes in the slowest rank's 2 s
    assert s[("busbw_gbps", None)] == pytest.approx([16 / 2.0 / 1e9])
    assert s[("algbw_gbps", None)] == pytest.approx([24 / 2.0 / 1e9])


def test_serving_samples_per_phase_and_level(tmp_path):
    def rec(phase, level, chunks, tokens, ok=True):
        tpot = (chunks[-1] - chunks[0]) / (tokens - 1)
        return {"phase": phase, "level": level, "ok": ok, "chunk_s": chunks, "ttft_s": chunks[0],
                "e2e_s": chunks[-1], "tpot_s": tpot, "stalls": []}
    _write(tmp_path / "requests.jsonl", [
        rec("warmup", 1, [0.5, 0.6, 0.7], 3),  # never a sample
        rec("single", 1, [0.010, 0.020, 0.040], 3), rec("single", 1, [0.012, 0.022, 0.032], 3),
        rec("sweep", 2, [0.1, 0.2], 2), rec("sweep", 2, [0.1, 0.3], 2, ok=False)])
    s = serving_samples(tmp_path / "requests.jsonl")
    assert s[("single_stream_tpot_ms", None)] == pytest.approx([15.0, 10.0])  # (40−10)/2, (32−12)/2
    # ITL: one sample per request, the median of its own gaps (10, 20 → 15; 10, 10 → 10):
    # a request's gaps share its batch and its stalls, so they are not independent samples
    assert s[("single_stream_itl_ms_p50", None)] == pytest.approx([15.0, 10.0])
    assert s[("ttft_ms_p50", 2)] == pytest.approx([100.0])  # the failed request left out
    assert ("single_stream_ttft_ms", None) in s and not any(k[0].startswith("warmup") for k in s)


def test_a_sessions_level_has_samples_per_turn_and_from_the_scheduled_send(tmp_path):
    # 2 sessions of 2 turns at c = 2, and a trace level at speedup 4 (step 4000); TTFT 10, 30
    # (turn 1) and 20, 40 ms (turn 2); each waited 5 ms in the client (TTFT from the schedule
    # 5 ms more). A failed turn is no sample.
    def rec(level, step, ttft, wait=0.005, ok=True, **kw):
        return {"phase": "sweep", "level": level, "step": step, "ok": ok, "chunk_s": [ttft, ttft + 0.01],
                "ttft_s": ttft, "e2e_s": ttft + 0.01, "tpot_s": 0.01, "ttft_sched_s": ttft + wait,
                "e2e_sched_s": ttft + 0.01 + wait, **kw}
    _write(tmp_path / "requests.jsonl", [
        rec(2, 2, 0.010, session=0, turn=1), rec(2, 2, 0.020, session=0, turn=2),
        rec(2, 2, 0.030, session=1, turn=1), rec(2, 2, 0.040, session=1, turn=2),
        rec(2, 2, 0.050, session=2, turn=1, ok=False),
        rec(4.0, 4000, 0.100, wait=0.0), rec(4.0, 4000, 0.200, wait=0.050)])
    s = serving_samples(tmp_path / "requests.jsonl")
    assert s[("turn1_ttft_ms_p50", 2)] == pytest.approx([10.0, 30.0])
    assert s[("turn2_ttft_ms_mean", 2)] == pytest.approx([20.0, 40.0])
    assert s[("ttft_sched_ms_p50", 2)] == pytest.approx([15.0, 25.0, 35.0, 45.0])
    assert s[("e2e_sched_ms_mean", 2)] == pytest.approx([25.0, 35.0, 45.0, 55.0])
    # the trace's level: its own step, no turns
    assert s[("ttft_sched_ms_p50", 4000)] == pytest.approx([100.0, 250.0])
    assert not [k for k in s if k[1] == 4000 and k[0].startswith("turn")]


def test_figures_without_samples_say_why():
    assert why_no_samples("profile", "comm_share", False).startswith(
        "no samples (shares of one capture)")
    assert why_no_samples("macro", "tpot_ms_p99", True).startswith("not tested (tail percentile")
    assert "kept no" in why_no_samples("macro", "tpot_ms_p50", False, "run abc kept no `requests.jsonl`")


def test_spec_points_pool_every_rounds_requests(tmp_path):
    """A point's samples: its requests from every round (round 1 in spec/, baseline/ …, the
    others in rounds/), one TPOT each, by level; counted by hand."""
    from k25exp.compare.samples import spec_decode_folder

    def write(folder, *tpots_by_level):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        recs = [{"ok": True, "phase": "sweep", "level": c, "tpot_s": t / 1e3, "chunk_s": [0, 1]}
                for c, ts in tpots_by_level for t in ts]
        _write(tmp_path / folder / "requests.jsonl", recs)

    (tmp_path / "config.resolved.yaml").write_text(
        "experiment:\n  acceptance: synthetic\n  alphas: [0.5, 0.9]\n")
    write("spec", (1, [5.0, 6.0]))                   # round 1, α = 0.5 (the first α)
    write("rounds/r1_spec_a0.9", (1, [3.0]))         # round 1, α = 0.9
    write("rounds/r2_spec_a0.5", (1, [7.0]), (4, [9.0]))
    write("rounds/r2_spec_a0.9", (1, [4.0]))
    write("baseline", (1, [10.0]))
    write("rounds/r2_baseline", (1, [11.0]))
    write("baseline_sync", (1, [12.0]))
    write("rounds/r2_baseline_sync", (1, [13.0]))
    s = spec_decode_folder(tmp_path)
    assert sorted(s[("a0.5/spec_tpot_ms_med", 1)]) == [5.0, 6.0, 7.0]
    assert s[("a0.5/spec_tpot_ms_med", 4)] == [9.0]
    assert sorted(s[("a0.9/spec_tpot_ms_med", 1)]) == [3.0, 4.0]
    assert sorted(s[("a0.9/base_tpot_ms_med", 1)]) == [10.0, 11.0]   # every α's baseline
    assert sorted(s[("a0.5/sync_tpot_ms_med", 1)]) == [12.0, 13.0]   # not mixed with baseline's


def test_a_job_of_several_draft_lengths_keeps_each_ks_requests_apart(tmp_path):
    """experiment.draft_lengths: round 1's spec/ is the first k's first α; every other k's
    requests come from its own server's folders (rounds/r<r>_spec_k<k>_a<α>), the baseline's
    from the one baseline of each round; counted by hand."""
    from k25exp.compare.samples import spec_decode_folder

    def write(folder, *tpots):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        _write(tmp_path / folder / "requests.jsonl",
               [{"ok": True, "phase": "sweep", "level": 1, "tpot_s": t / 1e3, "chunk_s": [0, 1]}
                for t in tpots])

    (tmp_path / "config.resolved.yaml").write_text(
        "experiment:\n  acceptance: synthetic\n  alphas: [0.7]\n  num_speculative_tokens: 3\n"
        "  draft_lengths: [1, 3]\n")
    write("spec", 5.0)                      # round 1, k = 3 (num_speculative_tokens goes first)
    write("rounds/r1_spec_k1_a0.7", 8.0)
    write("rounds/r2_spec_k3_a0.7", 6.0)
    write("rounds/r2_spec_k1_a0.7", 9.0)
    write("rounds/r1_spec_k10_a0.7", 99.0)  # another k whose name starts the same: not k = 1's
    write("baseline", 10.0)
    write("rounds/r2_baseline", 11.0)
    s = spec_decode_folder(tmp_path)
    assert sorted(s[("k3/a0.7/spec_tpot_ms_med", 1)]) == [5.0, 6.0]
    assert sorted(s[("k1/a0.7/spec_tpot_ms_med", 1)]) == [8.0, 9.0]
    assert sorted(s[("k1/a0.7/base_tpot_ms_med", 1)]) == sorted(s[("k3/a0.7/base_tpot_ms_med", 1)]) \
        == [10.0, 11.0]
    assert not [key for key in s if key[0].startswith("a0.7/")]


@pytest.mark.e2e
def test_fetched_artifacts_keep_their_folders(tmp_path):
    """spec/requests.jsonl and baseline/requests.jsonl of one run, fetched from a real MLflow
    store, stay two files (MLflow puts a file artifact at dst/<basename>: fetched into one
    folder, the second overwrote the first and the spec samples were lost)."""

    from mlflow.tracking import MlflowClient

    from k25exp.compare.resolve import fetch_samples
    from k25exp.tracking.read import RunView
    from tests.conftest import seed_store

    seed_store(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rec = lambda t: {"ok": True, "phase": "sweep", "level": 1, "tpot_s": t, "chunk_s": [0, 1]}  # noqa: E731
    for name, t in (("spec", 0.004), ("baseline", 0.010)):
        (tmp_path / "art" / name).mkdir(parents=True)
        _write(tmp_path / "art" / name / "requests.jsonl", [rec(t)])
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e", str(tmp_path / "artifacts"))).info.run_id
    for name in ("spec", "baseline"):
        client.log_artifact(run_id, str(tmp_path / "art" / name / "requests.jsonl"), name)
    view = RunView(run_id, "1", "spec_decode", "FINISHED", 0)
    samples, problem = fetch_samples(uri, view)
    assert problem == ""
    assert samples[("tpot_ms_p50", 1)] == pytest.approx([4.0])            # the spec server's
    assert samples[("baseline/tpot_ms_p50", 1)] == pytest.approx([10.0])



def test_open_loop_and_trace_levels_are_compared_at_the_step_their_figures_went_to(tmp_path):
    """A level's figures go to step = rate (or a trace's speedup) x 1000: its samples too. Records
    carry their step; older ones (without) are told apart by their worker: an open loop's
    requests have none (worker null), a closed loop's a number."""
    def rec(level, tpot_s, **kw):
        return {"phase": "sweep", "level": level, "ok": True, "chunk_s": [0.1, 0.1 + tpot_s],
                "ttft_s": 0.1, "e2e_s": 0.1 + tpot_s, "tpot_s": tpot_s, "stalls": [], **kw}
    _write(tmp_path / "requests.jsonl", [
        rec(0.5, 0.010, worker=None, step=500),          # open loop at 0.5 req/s, as written now
        rec(2.0, 0.020, worker=None, step=2000),         # a trace at speedup 2
        rec(1.5, 0.030, worker=None),                    # open loop, written before `step`
        rec(4, 0.040, worker=3)])                        # closed loop, c = 4, before `step`
    s = serving_samples(tmp_path / "requests.jsonl")
    assert s[("tpot_ms_p50", 500)] == pytest.approx([10.0])
    assert s[("tpot_ms_p50", 2000)] == pytest.approx([20.0])
    assert s[("tpot_ms_p50", 1500)] == pytest.approx([30.0])
    assert s[("tpot_ms_p50", 4)] == pytest.approx([40.0])
    assert not any(step in (0.5, 2.0, 1.5) for _, step in s)
