"""The ITL tail by cause (k25exp.traces.tail_causes) against an engine stub whose delays are
injected (tests/serving/engine_stub.py): k25exp's real client streams from it, the stub
writes its steps as a trace on the host's system clock, and every slow token the injections
made, counted by hand from the stub's own log, must carry the injected cause."""

from __future__ import annotations

import asyncio
import time
from statistics import median

import pytest

from k25exp.load.client import CompletionClient
from k25exp.traces import read_trace
from k25exp.traces.tail_causes import CAUSES, UNEXPLAINED, tail
from k25exp.traces.tail_outputs import write_tail
from k25exp.traces.token_gaps import ClientClock, engine_steps, join
from tests.serving.engine_stub import EngineThread, Injection

STEP_S, HOST_S = 0.02, 0.001
PROMPT = 32                  # prompt tokens (the stub counts words)
PREFILL_S_PER_TOKEN = 0.001  # a lone prefill adds 32 ms to its step, the burst of 4: 128 ms
LONG, BURST = 6, 4           # requests decoding throughout; requests arriving as one burst
LONG_OUT, BURST_OUT = 70, 8
THRESHOLD_MS = 70.0          # above a step of two prefills (84 ms), below one of one (52 ms)
INJECTED = {15: Injection(slow_ms=150),              # a long step: every request in it
            22: Injection(skip=(2, 4)),              # request 2 left out of steps 22-25
            30: Injection(hold=(4, 120)),            # request 4's tokens held 120 ms from step 30
            38: Injection(host_ms=120),              # a host gap after step 38
            10: Injection(admit_at=46)}              # arrivals wait for step 46: a burst of prefills


async def _drive(stub) -> tuple[list[dict], ClientClock]:
    t0 = time.perf_counter()
    clock = ClientClock.start(t0)
    async with CompletionClient(stub.base_url, "stub", timeout_s=60,
                                max_connections=LONG + BURST + 2) as client:
        client.prepare(LONG + BURST)
        await client.warm()

        async def one(i: int, due: float, out: int, after_step: int = 0) -> dict:
            await asyncio.sleep(max(0.0, t0 + due - time.perf_counter()))
            while stub._step < after_step:  # the stub's own step count: no race with its pace
                await asyncio.sleep(0.005)
            rec = {"i": i}
            await client.complete("w " * PROMPT, out, rec, t0)
            return rec

        # the long requests 60 ms apart (arrival order = i), the burst together once the
        # stub holds arrivals back (steps 10-45)
        plan = [one(i, 0.06 * i, LONG_OUT) for i in range(LONG)]
        plan += [one(LONG + b, 0.0, BURST_OUT, after_step=12) for b in range(BURST)]
        recs = await asyncio.gather(*plan)
    return list(recs), clock.finish()


def expected(stub) -> dict[tuple[int, int], str]:
    """(request, chunk) → the cause its injection gave it, from the stub's log: each request's
    token made at the injected step (its chunk index = its token index: one token a chunk)."""
    decoded = {row["step"]: row["decoded"] for row in stub.log}
    tok = stub.tokens
    out = {}
    # steps that admitted two or more requests on their own (a lone request that arrived
    # late on a loaded machine) are prefill bursts too: 20 + 2 × 32 ms
    for row in stub.log:
        if len(row["admitted"]) >= 2 and row["step"] != 46:
            for o in row["decoded"]:
                out[(o, tok[o].index(row["step"]))] = "prefill"
    for o in decoded[15]:
        out[(o, tok[o].index(15))] = "long_step"
    out[(2, tok[2].index(26))] = "skipped"      # its first token after the 4 steps it missed
    out[(4, tok[4].index(30))] = "delivery"     # the first token held back
    for o in decoded[39]:                        # the step after the host gap
        out[(o, tok[o].index(39))] = "host_gap"
    for o in decoded[46]:                        # the requests decoding in the burst's step
        out[(o, tok[o].index(46))] = "prefill"
    out.update(slowed_by_the_machine(stub))  # steps apart from every key above
    return out


def slowed_by_the_machine(stub) -> dict[tuple[int, int], str]:
    """Tokens of steps nothing was injected into that a loaded machine made slow anyway (a
    2-core box running the suite beside: one step took 70+ ms once), from the stub's own log:
    a token whose step ended more than the threshold after the step before it, the cause being
    whichever of the step's own time and the host gap before it ran further above its median
    (steps that decode only, none injected or after an injected one)."""
    rows = {row["step"]: row for row in stub.log}
    plain = [s for s, row in rows.items() if s - 1 in rows and not row["admitted"]
             and s not in INJECTED and s - 1 not in INJECTED]
    dur = {s: (rows[s]["end_ns"] - rows[s]["start_ns"]) / 1e6 for s in plain}
    host = {s: (rows[s]["start_ns"] - rows[s - 1]["end_ns"]) / 1e6 for s in plain}
    med_dur, med_host = median(dur.values()), median(host.values())
    out = {}
    for s in plain:
        if dur[s] + host[s] <= THRESHOLD_MS:
            continue
        cause = "long_step" if dur[s] - med_dur >= host[s] - med_host else "host_gap"
        for o in rows[s]["decoded"]:
            if o in rows[s - 1]["decoded"]:  # a gap between two of its tokens
                out[(o, stub.tokens[o].index(s))] = cause
    return out


def capture(folder):
    """The scenario run once: (stub, records, client clock, the stub's trace read back)."""
    with EngineThread(step_s=STEP_S, host_s=HOST_S, prefill_s_per_token=PREFILL_S_PER_TOKEN,
                      injections=INJECTED) as stub:
        recs, clock = asyncio.run(_drive(stub))
        path = stub.write_trace(folder / "stub_rank0.pt.trace.json.gz")
    assert all(r["ok"] for r in recs), [r["error"] for r in recs if not r["ok"]]
    # the long requests arrived in the order sent: the stub's ordinal is the record's i
    admitted = [row["admitted"] for row in stub.log if row["admitted"]]
    assert [o for a in admitted[:-1] for o in a] == list(range(LONG))
    assert sorted(admitted[-1]) == list(range(LONG, LONG + BURST))  # one step, all four
    assert next(r for r in stub.log if r["step"] == 46)["admitted"] == admitted[-1]
    return stub, recs, clock, read_trace(path)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return capture(tmp_path_factory.mktemp("trace"))


def test_every_injected_slow_token_carries_its_injected_cause(captured, tmp_path):
    stub, recs, clock, trace = captured
    j = join(engine_steps(trace), recs, clock)
    assert j.unjoined == {}
    # the join put in every decoding step exactly the requests the stub ran in it
    assert j.batch_match[0] == j.batch_match[1] > 50
    t = tail(j, threshold_ms=THRESHOLD_MS)
    want = expected(stub)
    # by hand: 6 in the long step, 1 skipped, 1 held, 6 after the host gap, 6 in the burst
    # (and those of any early step that happened to admit two requests at once, or that the
    # machine slowed)
    slowed = slowed_by_the_machine(stub)
    injected = [c for k, c in want.items() if k not in slowed]
    assert injected.count("long_step") == 6
    assert [injected.count(c) for c in ("skipped", "delivery", "host_gap")] == [1, 1, 6]
    got = {(g.gap.request, g.gap.chunk): g.cause for g in t.gaps}
    assert got == want
    # each slow token's excess is held by named causes (they add up to it). Each part is
    # measured against what a typical gap holds of it (its median), and a sum of medians is not
    # the median of the sums: the named parts may fall short of the excess by the steps'
    # jitter (µs here; 0.004-0.035 ms seen), never by an injected delay (>= 100 ms)
    for g in t.gaps:
        assert 0 <= g.parts[UNEXPLAINED] <= 0.01 * g.excess_ms
        assert sum(g.parts.values()) == pytest.approx(g.excess_ms)
    # the parts of each joined gap add up to it exactly
    for g in j.gaps:
        assert sum(g.parts().values()) == pytest.approx(g.gap_ms, abs=1e-6)
    rows = {r[0]: r for r in t.rows()}
    assert {c: rows[c][1] for c in CAUSES} == {c: list(want.values()).count(c) for c in CAUSES}
    assert t.caused_pct() >= 99.0
    m = write_tail(t, tmp_path)
    assert m["tail.gaps"] == len(want) and m["tail.cause.skipped_gaps"] == 1
    assert (tmp_path / "timeline.png").stat().st_size > 0
    assert "cause" in (tmp_path / "worst.txt").read_text()


def test_the_clocks_agree_within_the_measured_bracket(captured):
    """Both sides read the host's system clock: the causality bracket holds 0 (no shift), and
    it is as narrow as the stub's own log says it can be: its upper end is at most the
    smallest send-to-prefill time of any request, its lower end at most the last token's
    delivery below 0 (the last step's end to the last arrival). Both are delays of this run,
    counted from the stub's log, not a bound in ms: a loaded machine widens them alike."""
    stub, recs, clock, trace = captured
    al = join(engine_steps(trace), recs, clock).alignment
    assert al.lo_ms <= 0 <= al.hi_ms and al.shift_ms == 0
    assert al.lower_n == sum(len(r["chunk_s"]) for r in recs)
    start_ns = {row["step"]: row["start_ns"] for row in stub.log}
    # by hand: the step that admitted each request (ordinal = the record's i for the long
    # ones; the burst's four share one step) against the client's send on the same clock
    first = {o: steps[0] for o, steps in stub.tokens.items()}
    to_prefill_ms = [(start_ns[first[r["i"]]] - clock.wall_ns(r["sent_s"])) / 1e6 for r in recs]
    assert al.hi_ms <= min(to_prefill_ms) + 0.01
    # the last token to arrive needs every step done: the last step's end bounds it
    last_end_ns = max(row["end_ns"] for row in stub.log)
    last_arrival_ns = max(clock.wall_ns(r["sent_s"] + r["chunk_s"][-1]) for r in recs)
    assert -al.lo_ms <= (last_arrival_ns - last_end_ns) / 1e6 + 0.01


def test_analyze_tail_reads_a_run_folder_again(captured, tmp_path, capsys):
    """`k25exp analyze TRACE --tail RUN_FOLDER` (a trace fetched after its run): the profile
    run's files (requests.jsonl with the profiled records, clock.json) joined to the trace give
    the same causes above the same threshold, counted by hand from the stub's log, and the
    tail's files under --out."""
    import json

    from k25exp.commands.analyze import main
    from k25exp.runners.profile_tail import save_clock

    stub, recs, clock, trace = captured
    run = tmp_path / "run"
    run.mkdir()
    (run / "requests.jsonl").write_text(
        "".join(json.dumps({**r, "phase": "profiled"}) + "\n" for r in recs)
        + json.dumps({"i": 999, "phase": "warmup", "ok": True}) + "\n")  # not the profiled level's
    save_clock(run, clock)
    assert main([str(trace.path), "--tail", str(run), "--tail-above-ms", str(THRESHOLD_MS),
                 "--json", "--out", str(tmp_path / "o")]) == 0
    got = json.loads(capsys.readouterr().out)["tail"]
    want = list(expected(stub).values())
    assert {c: got[f"tail.cause.{c}_gaps"] for c in CAUSES} == {c: want.count(c) for c in CAUSES}
    assert (tmp_path / "o" / "tail" / "tail_gaps.csv").exists()
    assert main([str(trace.path), "--tail", str(tmp_path)]) == 2  # no run files: named, exit 2
    assert "requests.jsonl" in capsys.readouterr().err
