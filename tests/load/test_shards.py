"""Several client processes sending one load (k25exp.load.shards): one schedule across the
processes, merged figures equal to the figures counted by hand from the merged records, a
process that dies reported with what it had not finished. Against the stub server (a real
HTTP server in this process's thread; the client processes are real spawned processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from k25exp.load.arrivals import schedule
from k25exp.load.level_figures import level_figures, rate_figures
from k25exp.load.shards import ShardPool, Prompts, auto_processes, split
from tests.serving.stub_server import StubThread

pytestmark = pytest.mark.e2e  # spawns client processes


@pytest.fixture(scope="module")
def stub():
    with StubThread(step_s=0.01) as s:  # one chunk to every stream every 10 ms
        yield s


@pytest.fixture(scope="module")
def pool(stub):
    with ShardPool(dict(base_url=stub.base_url, model="stub", timeout_s=20.0)) as p:
        yield p


def texts(n):
    return Prompts({i: "fine" for i in range(n)})


def test_split_and_auto_processes_by_hand():
    assert split(10, 4) == [3, 3, 2, 2] and split(4, 4) == [1] * 4 and sum(split(257, 3)) == 257
    # the Kimi rank on one H200: TPOT 6.82 ms at batch 1, so c = 128 streams at most
    # 128 / 0.00682 = 18,768 chunks/s: 3 processes of at most 8,000 each, on 16 CPUs
    assert auto_processes(128, 0.00682, cpus=16) == 3
    assert auto_processes(256, 0.00682, cpus=16) == 5  # 37,537 chunks/s
    assert auto_processes(256, 0.001, cpus=16) == 8  # 32 wanted, half of 16 CPUs at most
    assert auto_processes(128, 0.00682, cpus=2) == 1  # a 2-core box: never more than one
    assert auto_processes(32, 0.040, cpus=16) == 1  # 800 chunks/s
    assert auto_processes(256, None, cpus=16) == 4  # no single stream: 64 streams each
    assert auto_processes(256, 0.001, rate=200.0, output_tokens=64, cpus=16) == 2  # 12,800/s
    assert auto_processes(3, 0.00001, cpus=16) == 3  # never more than the streams


def test_the_open_loop_schedule_is_one_schedule_across_processes(stub, pool):
    """30 requests at 40 req/s over 3 processes: request i goes from process i mod 3, and
    every request's scheduled time is the one schedule's due time from one start (the same
    offset for all 30, to the float), sent within a few ms of it."""
    due = schedule(40.0, 1.0, seed=5, n=30)

    async def go():
        return await pool.run_open(texts(30), phase="sweep", level=40.0, due_s=due, max_tokens=4,
                                   t0=time.perf_counter(), max_concurrency=30, processes=3)

    res = asyncio.run(go())
    recs = sorted(res["records"], key=lambda r: r["i"])
    assert [r["i"] for r in recs] == list(range(30)) and all(r["ok"] for r in recs)
    assert all(r["shard"] == r["i"] % 3 for r in recs)
    offsets = [r["scheduled_s"] - due[r["i"]] for r in recs]
    assert max(offsets) - min(offsets) < 1e-9, offsets
    assert all(r["queue_ms"] < 5 for r in recs)  # 10 slots each: no one waited for a slot
    late = [r["sent_s"] - r["scheduled_s"] for r in recs]
    # an event loop fires a timer up to its clock resolution early (libuv's: 1 ms)
    assert min(late) > -0.002, late  # (how late: the machine's; a busy one sends later)
    sent = [r["sent_s"] for r in recs]
    assert rate_figures(recs, res["due_s"], 40.0, 0.05)["achieved_rate_req_s"] == \
        pytest.approx(29 / (max(sent) - min(sent)))
    assert res["client_failures"] == [] and len(res["loop_lag_ms_by_process"]) == 3


def test_a_closed_loop_ramp_and_counter_are_one_loops_across_processes(stub, pool):
    """6 workers over 2 processes, ramp 0.3 s: worker w's first request is scheduled at
    w × 0.05 s from the one start whichever process runs it; the 18 request indices are
    each sent once (one counter), and each worker's next request follows its last. (30
    tokens at the stub's 10 ms step outlast the ramp: every worker sends.)"""
    async def go():
        return await pool.run_closed(texts(18), phase="sweep", level=6, concurrency=6,
                                     max_tokens=30, t0=time.perf_counter(), n_requests=18,
                                     duration_s=None, ramp_s=0.3, processes=2)

    res = asyncio.run(go())
    recs = res["records"]
    assert sorted(r["i"] for r in recs) == list(range(18)) and all(r["ok"] for r in recs)
    assert {r["worker"] for r in recs if r["shard"] == 0} == {0, 2, 4}
    assert {r["worker"] for r in recs if r["shard"] == 1} == {1, 3, 5}
    first = {w: min(r["scheduled_s"] for r in recs if r["worker"] == w) for w in range(6)}
    start = first[0]
    for w in range(6):
        assert first[w] - start == pytest.approx(w * 0.05, abs=1e-9)
    for w in range(6):  # closed loop: each next request scheduled at the end of the last
        mine = sorted((r for r in recs if r["worker"] == w), key=lambda r: r["sent_s"])
        for a, b in zip(mine, mine[1:]):
            assert b["scheduled_s"] == pytest.approx(a["sent_s"] + a["end_s"], abs=1e-9)


def test_merged_figures_are_the_hand_counts_of_the_merged_records(stub, pool):
    """A level of 8 streams over 3 processes: its figures, from the merged records and the
    per-process health, against counts made here from the same records."""
    async def go():
        return await pool.run_closed(texts(24), phase="sweep", level=8, concurrency=8,
                                     max_tokens=6, t0=time.perf_counter(), n_requests=24,
                                     duration_s=None, processes=3)

    res = asyncio.run(go())
    recs = res["records"]
    assert sorted(r["i"] for r in recs) == list(range(24)) and {r["shard"] for r in recs} == {0, 1, 2}
    f = level_figures(recs, res["wall_s"], res["cpu_s"], res["loop_lag_ms"], 1e9,
                      loop_lag_by_process=res["loop_lag_ms_by_process"],
                      client_processes=res["client_processes"])
    tokens = sum(r["usage"]["completion_tokens"] for r in recs)
    assert tokens == 24 * 6 and f["output_tokens"] == tokens
    assert f["output_tok_s"] == pytest.approx(tokens / res["wall_s"])
    # the wall time: from the one start to the last response, which no record outlasts
    last = max(r["sent_s"] + r["end_s"] for r in recs)
    first_sched = min(r["scheduled_s"] for r in recs)
    assert res["wall_s"] >= last - first_sched  # (how much later the pool saw it end: the scheduler's)

    def median(xs):
        xs = sorted(xs)
        return (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2

    tpot = [(r["chunk_s"][-1] - r["chunk_s"][0]) / (r["usage"]["completion_tokens"] - 1)
            for r in recs]
    assert f["tpot_ms_p50"] == pytest.approx(median(tpot) * 1e3, abs=1e-9)
    assert f["tpot_ms_mean"] == pytest.approx(sum(tpot) / len(tpot) * 1e3, abs=1e-9)
    assert f["ttft_ms_p50"] == pytest.approx(median([r["chunk_s"][0] for r in recs]) * 1e3, abs=1e-9)
    itl = [b - a for r in recs for a, b in zip(r["chunk_s"], r["chunk_s"][1:])]
    assert f["itl_ms_p50"] == pytest.approx(median(itl) * 1e3, abs=1e-9)
    # (the definitions against the stub's own write clock: tests/load/test_client.py)
    lags = sorted(r["sent_s"] - r["scheduled_s"] for r in recs)
    assert f["client_lag_ms_max"] == pytest.approx(lags[-1] * 1e3, abs=1e-6)
    # health per process: the busiest CPU, the laggiest loop
    by = res["loop_lag_ms_by_process"]
    assert len(by) == 3 and all(by)
    assert f["client_loop_lag_ms_mean"] == pytest.approx(max(sum(x) / len(x) for x in by))
    assert f["client_processes"] == 3.0 and f["client_failures"] == 0.0
    assert res["cpu_s_total"] >= res["cpu_s"] > 0


def test_one_laggy_process_flags_the_level_though_the_average_would_not():
    recs = [{"ok": True, "status": 200, "chunk_s": [0.1, 0.2], "chunk_tokens": [1, 1],
             "output_tokens": 2, "ttft_s": 0.1, "e2e_s": 0.2, "tpot_s": 0.1, "lag_ms": 0.0}]
    healthy, laggy = [1.0] * 9, [30.0] * 3  # pooled mean (9 + 90) / 12 = 8.25 ms
    f = level_figures(recs, 1.0, 0.1, healthy + laggy, max_client_lag_ms=20.0,
                      loop_lag_by_process=[healthy, laggy])
    assert f["client_loop_lag_ms_mean"] == 30.0 and f["client_lagged"] == 1.0
    assert level_figures(recs, 1.0, 0.1, healthy + laggy, 20.0)["client_lagged"] == 0.0


def test_a_process_that_dies_is_reported_and_its_requests_are_not_lost(stub):
    """Process 1 of 2 is killed (SIGKILL) once 6 requests have come back: the phase still
    ends, every one of the 20 request indices has a record (the survivor takes the rest from
    the shared counter; what process 1 had in flight is a failed record naming it), the
    failure is reported and flags the level; the next phase starts a fresh process."""
    with ShardPool(dict(base_url=stub.base_url, model="stub", timeout_s=20.0)) as pool:
        seen = []

        def on_record(r):
            seen.append(r)
            if len(seen) == 6:
                os.kill(pool.shards[1].proc.pid, signal.SIGKILL)

        async def go(on_record=None):
            return await pool.run_closed(texts(20), phase="sweep", level=4, concurrency=4,
                                         max_tokens=20, t0=time.perf_counter(), n_requests=20,
                                         duration_s=None, on_record=on_record, processes=2)

        res = asyncio.run(go(on_record))
        recs = res["records"]
        assert sorted(r["i"] for r in recs) == list(range(20))
        lost = [r for r in recs if not r["ok"]]
        assert 1 <= len(lost) <= 2, lost  # process 1 runs 2 of the 4 streams
        assert all(r["shard"] == 1 and r["error"].startswith("client process 1 failed")
                   for r in lost)
        (why,) = res["client_failures"]
        assert why.startswith("client process 1") and "exit code -9" in why
        f = level_figures(recs, res["wall_s"], res["cpu_s"], res["loop_lag_ms"], 1e9,
                          loop_lag_by_process=res["loop_lag_ms_by_process"],
                          client_failures=res["client_failures"])
        assert f["errors"] == len(lost) and f["client_failures"] == 1.0 and f["valid"] == 0.0
        starts = pool.starts
        again = asyncio.run(go())
        assert pool.starts == starts + 1 and again["client_failures"] == []
        assert sorted(r["i"] for r in again["records"]) == list(range(20))
        assert all(r["ok"] for r in again["records"])


def test_an_open_loop_process_that_dies_leaves_its_share_of_the_schedule_as_failures(stub):
    due = [0.02 * i for i in range(24)]
    with ShardPool(dict(base_url=stub.base_url, model="stub", timeout_s=20.0)) as pool:
        def on_record(r):
            if r["i"] == 4:
                os.kill(pool.shards[1].proc.pid, signal.SIGKILL)

        async def go():
            return await pool.run_open(texts(24), phase="sweep", level=50.0, due_s=due,
                                       max_tokens=3, t0=time.perf_counter(), processes=2,
                                       on_record=on_record)

        res = asyncio.run(go())
    recs = res["records"]
    assert sorted(r["i"] for r in recs) == list(range(24))
    assert all(r["ok"] for r in recs if r["i"] % 2 == 0)  # process 0's share: untouched
    failed = [r["i"] for r in recs if not r["ok"]]
    assert failed and all(i % 2 == 1 for i in failed) and max(failed) == 23
    assert len(res["client_failures"]) == 1


def test_a_phase_is_sent_whole_on_a_pipe_the_event_loop_left_non_blocking():
    """The event loop's add_reader leaves each process's pipe non-blocking (asyncio's and
    uvloop's alike); a phase's prompts (~1 MB here) outgrow the socket buffer, so a plain send
    fails half-way with BlockingIOError whenever the reader is not reading at that moment (an
    H200 run died so at c = 128, after 1, 8 and 32). Here the reader starts 0.3 s late."""
    import multiprocessing as mp
    import threading

    from k25exp.load import shards

    big = ("phase", {"prompts": [f"word{i} " * 400 for i in range(500)]})  # distinct: ~3 MB pickled
    for send, ok in ((lambda c, m: c.send(m), False), (shards._send, True)):
        a, b = mp.Pipe()
        os.set_blocking(a.fileno(), False)
        got = []

        def read(b=b, got=got):
            time.sleep(0.3)
            try:
                got.append(b.recv())
            except (EOFError, OSError):  # the half-sent message: the sender gave up
                pass
        reader = threading.Thread(target=read)
        reader.start()
        try:
            send(a, big)
            sent = True
        except BlockingIOError:
            sent = False
            a.close()  # the reader then sees the pipe end
        reader.join(5)
        assert sent is ok and (got == [big]) is ok


def test_a_record_is_read_whole_from_a_pipe_the_event_loop_left_non_blocking():
    """The receiving side of the same pipe: a record larger than the socket buffer arrives in
    pieces; after poll() says it has begun, a non-blocking recv finds the buffer empty half-way
    (BlockingIOError, which drain took for the process dying). The pipe ShardPool reads is made
    blocking again after add_reader; so here a record written in two pieces 0.3 s apart (as
    multiprocessing's own wire format: a 4-byte length, then the pickle) is read whole."""
    import multiprocessing as mp
    import pickle
    import socket
    import struct
    import threading

    from k25exp.load import shards

    rec = ("rec", {"chunk_s": [i * 1e-3 for i in range(20_000)]})
    payload = pickle.dumps(rec)
    a, b = mp.Pipe()
    os.set_blocking(b.fileno(), False)  # as add_reader leaves it
    shards._blocking(b)
    raw = socket.socket(fileno=os.dup(a.fileno()))

    def write():
        raw.sendall(struct.pack("!i", len(payload)) + payload[:1000])
        time.sleep(0.3)
        raw.sendall(payload[1000:])
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert b.poll(5)
    assert b.recv() == rec
    writer.join(5)
    raw.close()


def test_sessions_over_processes_are_one_closed_loop_of_sessions(stub, pool, tmp_path):
    """6 sessions of 3 turns, 4 in flight over 2 processes: workers dealt round-robin, each
    session claimed once from the one counter and all its turns sent by the process that
    claimed it, each turn on its history (the stub counts a prompt of ids by its length:
    by hand 8; 8 + 4 + 8 = 20; 20 + 4 + 8 = 32), each due when its session's last answer
    ended (no think time). A single event loop sends the turns that end on one step one
    after another; here two loops share them."""
    from k25exp.config.experiments.request_shapes import LengthConfig, SessionConfig
    from k25exp.load.lengths import Lengths
    from k25exp.load.prompts import PromptBuilder, load_tokenizer
    from k25exp.load.sessions import SessionPlan, session_figures
    from k25exp.serving.tiny_model import write_tokenizer

    write_tokenizer(tmp_path, 4096, seed=0)
    tok = load_tokenizer(str(tmp_path))
    builder = PromptBuilder(tok, 8, 3)
    plan = SessionPlan(tok, builder, Lengths(LengthConfig(), 8, 3, "input", low=builder.least()),
                       Lengths(LengthConfig(), 4, 3, "output"), SessionConfig(turns=3), 3)

    async def go():
        return await pool.run_sessions(plan, phase="sweep", level=4, concurrency=4, n_sessions=6,
                                       first_session=0, t0=time.perf_counter(), processes=2)

    res = asyncio.run(go())
    recs = res["records"]
    assert res["client_failures"] == [] and all(r["ok"] for r in recs)
    assert sorted((r["session"], r["turn"]) for r in recs) == [(s, t) for s in range(6) for t in (1, 2, 3)]
    assert {r["worker"] for r in recs if r["shard"] == 0} == {0, 2}
    assert {r["worker"] for r in recs if r["shard"] == 1} == {1, 3}
    for s in range(6):
        mine = sorted((r for r in recs if r["session"] == s), key=lambda r: r["turn"])
        assert len({(r["shard"], r["worker"]) for r in mine}) == 1  # one worker runs a session
        assert [r["usage"]["prompt_tokens"] for r in mine] == [8, 20, 32]
        for a, b in zip(mine, mine[1:]):
            assert b["scheduled_s"] == pytest.approx(a["sent_s"] + a["end_s"], abs=1e-9)
    figs = session_figures(recs, 3)
    assert figs["turn1_ttft_ms_n"] == figs["turn3_ttft_ms_n"] == 6
    assert len(res["loop_lag_ms_by_process"]) == 2
