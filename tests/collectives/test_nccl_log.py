"""NCCL's own choice log, parsed: checked against a real NCCL 2.28.9 log (2 H200s, NVLink)
whose lines were counted by hand, and the older numeric format."""

from pathlib import Path

from k25exp.collectives import nccl_log
from k25exp.collectives.spec import CollectiveSpec, Point

DATA = Path(__file__).parent / "data"


def test_parses_a_real_nccl_2_28_log():
    lines = (DATA / "nccl_2.28.9_rank0_tuning.log").read_text().splitlines()
    choices, channels = nccl_log.parse(lines)
    # the probe script ran, per size, 3 all-reduces then 1 all-gather: 4 sizes × 4 ops
    assert len(choices) == 16
    assert channels == 24  # "24 coll channels, 24 collnet channels, ..."
    first = choices[0]
    assert (first.op, first.nbytes, first.algo, first.proto, first.channels) == \
        ("AllReduce", 7168, "RING", "LL", 1)
    big = [c for c in choices if c.nbytes == 16777216]
    assert {(c.op, c.algo, c.proto, c.channels) for c in big} == \
        {("AllReduce", "RING", "SIMPLE", 24), ("AllGather", "RING", "SIMPLE", 24)}
    # channel{Lo..Hi}={0..6} is 7 channels, {0..13} 14
    assert [c.channels for c in choices if c.nbytes == 57344] == [7, 7, 7, 14]
    rows = nccl_log.table(choices)
    assert ("AllReduce", 7168, "RING", "LL", "1", 3) in rows
    assert len(rows) == 8  # distinct (op, bytes): 2 ops × 4 sizes


def test_summary_groups_byte_ranges_per_algorithm_and_protocol():
    choices, _ = nccl_log.parse((DATA / "nccl_2.28.9_rank0_tuning.log").read_text().splitlines())
    s = nccl_log.summary(choices)
    assert s.startswith("AllReduce: RING/LL 7168-1048576 B (ch 1-24); RING/SIMPLE 16777216 B (ch 24)")
    assert "AllGather: RING/LL 7168-1048576 B (ch 1-24); RING/SIMPLE 16777216 B (ch 24)" in s


def test_older_numeric_format_maps_to_nccl_names():
    choices, channels = nccl_log.parse([
        "host:1:1 [0] NCCL INFO 2 coll channels, 2 nvls channels, 2 p2p channels",
        "host:1:1 [0] NCCL INFO 14336 Bytes -> Algo 0 proto 2 time 20.500000",
        "host:1:1 [0] NCCL INFO 14336 Bytes -> Algo 4 proto 1 time 9.000000",
    ])
    assert channels == 2
    assert [(c.op, c.algo, c.proto, c.channels) for c in choices] == \
        [("?", "TREE", "SIMPLE", None), ("?", "NVLS", "LL128", None)]


def test_read_logs_takes_a_rank_log_with_choices(tmp_path):
    (tmp_path / "nccl.h.1.log").write_text("x NCCL INFO 24 coll channels, 0 nvls channels\n")
    (tmp_path / "nccl.h.2.log").write_text((DATA / "nccl_2.28.9_rank0_tuning.log").read_text())
    choices, channels, n = nccl_log.read_logs(tmp_path)
    assert (len(choices), channels, n) == (16, 24, 2)
    assert nccl_log.read_logs(tmp_path / "missing") == ([], None, 0)


def test_probe_spec_times_nothing_and_logs_to_its_folder(tmp_path):
    spec = CollectiveSpec(op="step", dtype="bfloat16", device="cuda", backend="nccl",
                          points=[Point(label=1, numel=7168, burst=8, reps=20, blocking_iters=40)],
                          warmup=5, check=True, blocking=True, graph=True, fault_kill_rank=1)
    probe = nccl_log.probe_spec(spec)
    assert (probe.warmup, probe.check, probe.blocking, probe.graph, probe.fault_kill_rank) == \
        (0, False, False, False, None)
    assert (probe.points[0].reps, probe.points[0].blocking_iters, probe.points[0].burst) == (1, 0, 8)
    assert spec.points[0].reps == 20  # the measured spec is untouched
    env = nccl_log.probe_env(tmp_path)
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,TUNING"
    assert env["NCCL_DEBUG_FILE"].startswith(str(tmp_path)) and "%p" in env["NCCL_DEBUG_FILE"]


def test_bookkeeping_ops_are_left_out_of_the_choices():
    # a decode step on 2 ranks (Kimi at TP 2, batch 1): 14,336 B all-reduces and one all-gather
    # of 81,920 bf16 per rank; the worker's barrier (4 B all-reduce) and gather_object (8 B
    # all-gather) are in the log too, as they were in the real run on 2 H200s
    spec = CollectiveSpec(op="step", dtype="bfloat16", device="cuda", backend="nccl", points=[
        Point(label=1, numel=7168, burst=3, reps=1, blocking_iters=0,
              sequence=[["all_reduce", 7168], ["all_reduce", 7168], ["all_gather", 81920]])])
    assert nccl_log.measured_ops(spec) == {("AllReduce", 14336), ("AllGather", 163840)}
    log = ["x NCCL INFO AllGather: 8 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}",
           "x NCCL INFO AllReduce: 4 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}",
           "x NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}",
           "x NCCL INFO AllGather: 163840 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..19}"]
    kept = nccl_log.only_measured(nccl_log.parse(log)[0], spec)
    assert [(c.op, c.nbytes, c.channels) for c in kept] == [("AllReduce", 14336, 1), ("AllGather", 163840, 20)]
    # all-to-all runs as send/recv pairs: no logged choice is the measured op's
    a2a = CollectiveSpec(op="all_to_all", dtype="bfloat16", device="cuda", backend="nccl",
                         points=[Point(label=1, numel=64, burst=1, reps=1, blocking_iters=0)])
    assert nccl_log.only_measured(nccl_log.parse(log)[0], a2a) == []
    # NCCL < 2.23 names no op on the line: the measured sizes are kept by size alone
    old = ["x NCCL INFO 4 Bytes -> Algo 1 proto 0 time 3.1",
           "x NCCL INFO 14336 Bytes -> Algo 1 proto 0 time 12.4"]
    assert [(c.op, c.nbytes) for c in nccl_log.only_measured(nccl_log.parse(old)[0], spec)] == [("?", 14336)]
