"""The join of client tokens to engine steps (k25exp.traces.token_gaps) on a hand-written
trace and hand-written request records, every figure counted by hand (times in ms on the
timeline: 0 = the first step's start).

    step  kind     annotation (ms)  sampler until  holds
    S0    prefill  0 – 10           11             A's prefill (8 tokens)
    S1    decode   12 – 22          23             A
    S2    decode   24 – 34          35             A
    S3    mixed    36 – 66          67             A, and B's prefill (8 tokens): 30 ms
    S4    decode   70 – 80          81             B only: A is left out
    S5    decode   83 – 93          94             A, B

A is sent at −5 and its chunks arrive 1 ms after their steps end (12, 24, 36, 68, 95); B is
sent at 30, its chunks at 68.5, 82 and 100 (its last 6 ms late).
"""

from __future__ import annotations

import math

import pytest

from k25exp.traces import read_trace
from k25exp.traces.tail_causes import tail
from k25exp.traces.token_gaps import ClientClock, engine_steps, join
from tests.traces.builders import BASE, ev, op, step, write_trace

B_NS = 1_790_000_000_000_000_000   # the trace's baseTimeNanoseconds
ZERO_NS = B_NS + int(BASE * 1000)  # the system clock at ts = 0 (S0's start)
STEPS = [("execute_context_1(8)_generation_0(0)", 0, 10, 11),
         ("execute_context_0(0)_generation_1(1)", 12, 22, 23),
         ("execute_context_0(0)_generation_1(1)", 24, 34, 35),
         ("execute_context_1(8)_generation_1(1)", 36, 66, 67),
         ("execute_context_0(0)_generation_1(1)", 70, 80, 81),
         ("execute_context_0(0)_generation_2(2)", 83, 93, 94)]
# the client's t0 is 1 s before the timeline's zero on the system clock
CLOCK = ClientClock(perf_t0=500.0, wall_t0_ns=ZERO_NS - 1_000_000_000, pair_ns=40)


def record(i: int, send_ms: float, arrive_ms: list[float], stalls=()) -> dict:
    return {"i": i, "ok": True, "sent_s": 1.0 + send_ms / 1e3,
            "chunk_s": [(a - send_ms) / 1e3 for a in arrive_ms], "chunk_tokens": [1] * len(arrive_ms),
            "prompt_tokens": 8, "stalls": [list(s) for s in stalls]}


RECORDS = [record(0, -5, [12, 24, 36, 68, 95]), record(1, 30, [68.5, 82, 100])]


@pytest.fixture
def steps(tmp_path):
    events = []
    for name, s, e, done in STEPS:
        events += [step(name, s * 1e3, (e - s) * 1e3), op("aten::mm", s * 1e3 + 1, (e - s) * 1e3 - 2),
                   step("gpu_model_runner: sample", e * 1e3, (done - e) * 1e3)]
    path = write_trace(tmp_path / "rank0.pt.trace.json", events,
                       meta={"schemaVersion": 1, "baseTimeNanoseconds": B_NS})
    return engine_steps(read_trace(path))


def test_steps_on_the_system_clock_and_ready_when_their_sampler_ends(steps):
    assert [s.kind for s in steps] == ["prefill", "decode", "decode", "mixed", "decode", "decode"]
    assert [(s.start_ns - ZERO_NS) / 1e6 for s in steps] == [0, 12, 24, 36, 70, 83]
    assert [(s.end_ns - ZERO_NS) / 1e6 for s in steps] == [10, 22, 34, 66, 80, 93]
    assert [(s.done_ns - ZERO_NS) / 1e6 for s in steps] == [11, 23, 35, 67, 81, 94]
    assert [s.tokens_out for s in steps] == [1, 1, 1, 2, 1, 2]


def test_the_clock_bracket_counted_by_hand(steps):
    """Lower bound: the j-th token received against the step where the produced count (1, 2,
    3, 5, 6, 8) reaches j: done − arrival = −1 for all but B's first (67 − 68.5) and last
    (94 − 100): max −1. Upper: S0 (8 prompt tokens) started 5 ms after A's send, S3 (16 in
    all: B's too) 6 ms after B's: min 5."""
    al = join(steps, RECORDS, CLOCK).alignment
    assert (al.lo_ms, al.hi_ms) == pytest.approx((-1.0, 5.0))
    assert (al.lower_n, al.upper_n, al.shift_ms) == (8, 2, 0.0)
    assert al.error_ms == pytest.approx(5.0) and al.pair_us == 0.04


def test_each_gap_joined_to_its_steps_by_hand(steps):
    j = join(steps, RECORDS, CLOCK)
    assert j.unjoined == {}
    assert j.assigned[0].tolist() == [0, 1, 2, 3, 5] and j.assigned[1].tolist() == [3, 4, 5]
    got = {(g.request, g.chunk): g for g in j.gaps}
    a3, a4, b2 = got[(0, 3)], got[(0, 4)], got[(1, 2)]
    # A's chunk 3: S3 (36 → 67: 31 ms with B's prefill), host 35 → 36, on time both ends
    assert (a3.gap_ms, a3.own_ms, a3.host_ms, a3.skipped_ms, a3.delivery_ms) == pytest.approx(
        (32, 31, 1, 0, 0))
    # A's chunk 4: left out of S4 (done 67 → 81: 14 ms skipped), S5 own 11, host 81 → 83
    assert (a4.gap_ms, a4.own_ms, a4.host_ms, a4.skipped_ms, a4.skipped_steps, a4.delivery_ms) \
        == pytest.approx((27, 11, 2, 14, 1, 0))
    # B's chunk 2: S5 own 11, host 2, delivered 6 ms after S5 against 1 ms before: +5
    assert (b2.gap_ms, b2.own_ms, b2.host_ms, b2.delivery_ms, b2.deliver_ms) == pytest.approx(
        (18, 11, 2, 5, 6))
    for g in j.gaps:
        assert sum(g.parts().values()) == pytest.approx(g.gap_ms)
    assert j.batch_match == (5, 5)  # S1-S5 each ran exactly the requests the join put in it


def test_the_tail_by_cause_by_hand(steps):
    """ITL: A 12, 12, 32, 27; B 13.5, 18: p50 15.75. The median producing step is 11 ms, the
    median host gap 1.5. Above 20 ms: A's chunk 3 (excess 16.25: its step 20 ms above the
    median, and it prefilled: prefill, scaled to the excess) and A's chunk 4 (excess 11.25 of
    skipped 14 + host 0.5, scaled). B's chunk 2 ended a stall: delivery 5 + host 0.5 held to
    its excess 2.25."""
    recs = [RECORDS[0], record(1, 30, [68.5, 82, 100], stalls=[(2, 18.0, 1)])]
    t = tail(join(steps, recs, CLOCK), threshold_ms=20)
    assert (t.p50_ms, t.ref_step_ms, t.ref_host_ms, t.p99_ms) == pytest.approx((15.75, 11, 1.5, None))
    got = {(g.gap.request, g.gap.chunk): g for g in t.gaps}
    assert sorted(got) == [(0, 3), (0, 4), (1, 2)]
    assert got[(0, 3)].cause == "prefill" and got[(0, 3)].parts["prefill"] == pytest.approx(16.25)
    a4 = got[(0, 4)]
    assert a4.cause == "skipped"
    assert (a4.parts["skipped"], a4.parts["host_gap"]) == pytest.approx((14 * 11.25 / 14.5, 0.5 * 11.25 / 14.5))
    b2 = got[(1, 2)]
    assert b2.cause == "delivery" and b2.gap.stall
    assert b2.parts["delivery"] == pytest.approx(5 * 2.25 / 5.5)
    assert t.caused_pct() == pytest.approx(100.0)
    m = t.metrics()
    assert m["tail.gaps"] == 3 and m["tail.stall_gaps"] == 1 and m["tail.itl_n"] == 6
    assert "tail.itl_ms_p99" not in m  # 6 gaps: no p99
    assert m["tail.excess_ms"] == pytest.approx(16.25 + 11.25 + 2.25)


def test_a_shifted_clock_is_found_and_corrected(steps):
    """The client's pair read 20 ms off: the bracket moves to [19, 25] ms, the client's times
    are shifted by 19 ms (the nearest edge) and the join is the same as on the true clock."""
    off = ClientClock(CLOCK.perf_t0, CLOCK.wall_t0_ns - 20_000_000, CLOCK.pair_ns)
    j = join(steps, RECORDS, off)
    assert (j.alignment.lo_ms, j.alignment.hi_ms, j.alignment.shift_ms) == pytest.approx((19, 25, 19))
    assert j.alignment.error_ms == pytest.approx(6.0)
    assert j.assigned[0].tolist() == [0, 1, 2, 3, 5] and j.assigned[1].tolist() == [3, 4, 5]


def test_the_clock_pair_maps_perf_counter_onto_the_system_clock():
    c = ClientClock(10.0, 1_000_000_000_000, 50, perf_t1=20.0, wall_t1_ns=1_000_000_000_000 + 10_000_001_000)
    assert c.drift_us == pytest.approx(1.0)  # the system clock ran 1 µs ahead over 10 s
    assert c.wall_ns(5.0) == pytest.approx(1_000_000_000_000 + 5_000_000_500)
    assert ClientClock.from_dict(c.to_dict()) == c
    live = ClientClock.start(0.0).finish()
    assert live.pair_ns < 1_000_000 and abs(live.drift_us) < 1000
    with pytest.raises(ValueError, match="client clock .*expected perf_t0, wall_t0_ns, pair_ns"):
        ClientClock.from_dict({"perf_t0": 1.0})


def test_bad_records_and_traces_say_what_was_expected(steps):
    with pytest.raises(ValueError, match=r"request record 3: 2 chunk times but 1 chunk token counts"):
        join(steps, [{"i": 3, "ok": True, "sent_s": 1.0, "chunk_s": [0.1, 0.2], "chunk_tokens": [1]}], CLOCK)
    with pytest.raises(ValueError, match=r"request record 4: expected sent_s, chunk_s and chunk_tokens"):
        join(steps, [{"i": 4, "ok": True, "chunk_s": [0.1]}], CLOCK)
    with pytest.raises(ValueError, match="no vLLM step annotations"):
        join([], RECORDS, CLOCK)


def test_a_request_without_its_prefill_in_the_trace_is_left_unjoined_with_why(steps):
    """A request whose first token came before any prefill step of the capture (sent before
    it began): not joined, its tail gaps counted as unexplained."""
    early = record(2, -50, [-40, 12.5])
    j = join(steps, RECORDS + [early], CLOCK)
    assert "no step with a prefill between its send" in j.unjoined[2]
    t = tail(j, threshold_ms=0.0)
    (g,) = [g for g in t.gaps if g.gap.request == 2]
    assert g.gap.step == -1 and g.cause == "unexplained"
    assert math.isclose(g.parts["unexplained"], 52.5 - t.p50_ms) and t.unjoined_tail == 1


# An async-scheduled device trace (ms): each step's host range launches it, the next one
# starts while the device still runs the step before, except S4's, blocked until 75 (a call
# that waits for the device); vLLM hands step N's tokens on only after launching N + 1.
#   step  device      host       A's chunk arrives (max(done, next launch) + 1)
#   S0    0 – 10      −3 – −1    11   (prefill)
#   S1    10 – 20     2 – 4      21
#   S2    20 – 30     12 – 14    31
#   S3    30 – 40     22 – 24    76   (S4's launch ends at 75)
#   S4    76 – 86     32 – 75    87
#   S5    86 – 96     78 – 80    97
ASYNC = [(PREFILL_8 := "execute_context_1(8)_generation_0(0)", 0, 10, -3, -1)] + [
    ("execute_context_0(0)_generation_1(1)", d0, d1, h0, h1)
    for d0, d1, h0, h1 in ((10, 20, 2, 4), (20, 30, 12, 14), (30, 40, 22, 24), (76, 86, 32, 75),
                           (86, 96, 78, 80))]


def _device_trace(tmp_path, rows):
    events = []
    for i, (name, d0, d1, h0, h1) in enumerate(rows):
        events += [step(name, d0 * 1e3, (d1 - d0) * 1e3, device=True, ext=i + 1),
                   ev("fused_moe_kernel", d0 * 1e3 + 1, (d1 - d0) * 1e3 - 2),
                   step(name, h0 * 1e3, (h1 - h0) * 1e3, ext=i + 1)]
    path = write_trace(tmp_path / "rank0.pt.trace.json", events,
                       meta={"schemaVersion": 1, "baseTimeNanoseconds": B_NS})
    return engine_steps(read_trace(path))


def test_a_token_held_behind_the_next_steps_launch_is_named_by_hand(tmp_path):
    """S3's token waited 35 ms after S3 was done (75 − 40) for S4's launch: the gap of A's
    chunk 3 (31 → 76: 45 ms) is S3's own 10 + launch 35, and the tail (p50 10 ms, above 20)
    names it `launch`, not delivery. The next gap (76 → 87) gives the 35 ms back: host gap 36
    before S4 on the device, launch −35, own 10."""
    steps = _device_trace(tmp_path, ASYNC)
    # each step's next launch, on the timeline (the device's S0 start is its zero)
    assert [None if s.next_launched_ns is None else (s.next_launched_ns - ZERO_NS) / 1e6
            for s in steps] == [4, 14, 24, 75, 80, None]
    recs = [record(0, -5, [11, 21, 31, 76, 87, 97])]
    j = join(steps, recs, CLOCK)
    assert j.assigned[0].tolist() == [0, 1, 2, 3, 4, 5]
    got = {g.chunk: g for g in j.gaps}
    c3, c4 = got[3], got[4]
    assert (c3.gap_ms, c3.own_ms, c3.host_ms, c3.launch_ms, c3.delivery_ms) == pytest.approx(
        (45, 10, 0, 35, 0))
    assert (c4.gap_ms, c4.own_ms, c4.host_ms, c4.launch_ms, c4.delivery_ms) == pytest.approx(
        (11, 10, 36, -35, 0))
    for g in j.gaps:
        assert sum(g.parts().values()) == pytest.approx(g.gap_ms)
    t = tail(j, threshold_ms=20)
    (tg,) = t.gaps
    assert tg.gap.chunk == 3 and tg.cause == "launch"
    assert tg.parts["launch"] == pytest.approx(35) and tg.parts["delivery"] == pytest.approx(0, abs=1e-9)
    assert t.metrics()["tail.cause.launch_pct"] == pytest.approx(100)


def test_without_async_scheduling_no_launch_is_read(tmp_path):
    """Sync scheduling: each step's host range starts after the step before is done on the
    device (devices 0-10, 11-21, 22-32, 33-43, 79-89, 90-100; hosts 0.2 ms after the previous
    end until 0.2 ms before the step): no next launch is read, and the token that waited 36 ms
    after S3 (arriving at 79) keeps the 35 ms over the 1 ms before as delivery."""
    dev = [(0, 10), (11, 21), (22, 32), (33, 43), (79, 89), (90, 100)]
    rows = [(ASYNC[0][0], 0, 10, -3, -1)] + [(ASYNC[1][0], d0, d1, dev[i][1] + 0.2, d0 - 0.2)
                                            for i, (d0, d1) in enumerate(dev[1:])]
    steps = _device_trace(tmp_path, rows)
    assert all(s.next_launched_ns is None for s in steps)
    j = join(steps, [record(0, -5, [11, 22, 33, 79, 90, 101])], CLOCK)
    assert j.assigned[0].tolist() == [0, 1, 2, 3, 4, 5]
    c3 = {g.chunk: g for g in j.gaps}[3]
    assert (c3.gap_ms, c3.launch_ms, c3.delivery_ms) == pytest.approx((46, 0, 35))


def test_launch_and_delivery_name_only_what_the_delivery_delay_grew():
    """Named parts by hand: a hold released (the previous token held 35 ms, this one not)
    offsets a 35 ms delivery wait, so neither is named; a 10 ms launch hold with the rest of
    the delivery 4 ms quicker names 6 ms of launch; the end of the trace (no next launch)
    leaves the change to delivery."""
    from k25exp.traces.tail_causes import named_parts
    from k25exp.traces.token_gaps import Gap

    def gap(launch, delivery):
        return Gap(0, 1, 1, 50.0, 1, 0, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0, delivery, 5.0, 0, False, launch)

    released = named_parts(gap(-35.0, 35.0), 10.0, 0.0, False)
    assert (released["launch"], released["delivery"]) == (0.0, 0.0)
    held = named_parts(gap(10.0, -4.0), 10.0, 0.0, False)
    assert (held["launch"], held["delivery"]) == pytest.approx((6.0, 0.0))
    both = named_parts(gap(10.0, 5.0), 10.0, 0.0, False)
    assert (both["launch"], both["delivery"]) == pytest.approx((10.0, 5.0))


def test_a_gap_with_one_end_unknown_keeps_its_change_as_delivery(tmp_path):
    """S5, the last step, has no next launch: the gap S4 → S5 (87 → 97) gets no launch part,
    although S4's end is known (held 0: S5 was launched at 80, before S4 was done at 86)."""
    steps = _device_trace(tmp_path, ASYNC)
    j = join(steps, [record(0, -5, [11, 21, 31, 76, 87, 97])], CLOCK)
    c5 = {g.chunk: g for g in j.gaps}[5]
    assert (c5.launch_ms, c5.delivery_ms) == pytest.approx((0, 0))
