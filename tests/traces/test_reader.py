"""The streaming reader: formats, chunk boundaries, both parse paths, and every bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from k25exp.traces.reader import TraceError, read_trace
from tests.traces.builders import DECODE, ev, op, rank_meta, render, step, write_trace


def _events(n: int = 40) -> list[dict]:
    """Kernels on two streams, memcpys, CPU ops, annotations, and noise the reader drops;
    names with quotes, braces, '},' and unicode; nested args objects."""
    out = [step(DECODE, 0, 10_000, ext=1), step(DECODE, 0, 10_000, device=True, ext=1)]
    for i in range(n):
        t = 10.0 * i
        out.append(ev(f'gemm_{i % 3} "q"}},{{x é', t, 4.5, tid=7 + i % 2,
                      args={"External id": i, "grid": {"x": [1, 2]}, "s": "},{"}))
        out.append(ev("Memcpy HtoD (Pageable -> Device)", t + 5, 1.25, cat="gpu_memcpy"))
        out.append(op("aten::mm", t, 3.0))
        out.append(ev("torch/nn/modules/module.py(1): _call_impl", t, 9, cat="python_function",
                      pid=100, tid=100))
        out.append(ev("cudaLaunchKernel", t, 0.5, cat="cuda_runtime", pid=100, tid=100))
    out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "s7"}})
    out.append({"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 1})
    return out


def _same(a, b) -> None:
    """Same content (ids may be numbered differently: they follow first appearance)."""
    assert [a.names[i] for i in a.name_id] == [b.names[i] for i in b.name_id]
    assert [a.lanes[i] for i in a.lane_id] == [b.lanes[i] for i in b.lane_id]
    for f in ("cat_id", "start_ns", "dur_ns"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    key = lambda t: [(x.name, x.cat, x.start_ns, x.end_ns, t.lanes[x.lane], x.ext_id)  # noqa: E731
                     for x in t.annotations]
    assert key(a) == key(b)
    assert a.events_total == b.events_total


def test_reads_only_what_the_analysis_needs(tmp_path):
    p = write_trace(tmp_path / "t.json", _events(), rank_meta(3))
    t = read_trace(p)
    assert t.events_total == 2 + 40 * 5 + 2
    assert t.n_events == 40 * 3                         # kernels, memcpys, cpu ops
    assert sorted(set(t.names)) == sorted({f'gemm_{k} "q"}},{{x é' for k in range(3)}
                                          | {"Memcpy HtoD (Pageable -> Device)", "aten::mm"})
    assert t.metadata["distributedInfo"]["rank"] == 3
    assert t.metadata["traceName"] == "test"
    # integer ns relative to the first work event; durations exact
    assert t.start_ns.min() == 0
    assert sorted(set(t.dur_ns.tolist())) == [1250, 3000, 4500]
    assert [(a.cat, a.start_ns, a.end_ns, a.ext_id) for a in t.annotations] == [
        ("user_annotation", 0, 10_000_000, 1), ("gpu_user_annotation", 0, 10_000_000, 1)]
    assert len({t.lanes[i] for i in t.lane_id[t.cat_id == 0].tolist()}) == 2  # two streams


@pytest.mark.parametrize("style", ["kineto", "compact", "array"])
@pytest.mark.parametrize("chunk", [64, 333, 4096, 1 << 24])
def test_chunking_and_parse_paths_agree(tmp_path, style, chunk):
    events = _events()
    meta = rank_meta(0) if style != "array" else None
    ref = read_trace(write_trace(tmp_path / "ref.json", events, meta, "kineto"), chunk_bytes=1 << 24)
    p = write_trace(tmp_path / f"t.{style}.json.gz", events, meta, style)
    for fast in (True, False):
        _same(read_trace(p, chunk_bytes=chunk, fast=fast), ref)


def test_gzip_and_plain_and_multimember_gzip_agree(tmp_path):
    text = render(_events(), rank_meta(0)).encode()
    plain = tmp_path / "a.json"
    plain.write_bytes(text)
    gz = tmp_path / "a.json.gz"
    gz.write_bytes(gzip.compress(text))
    multi = tmp_path / "m.json.gz"  # two gzip members, split mid-event
    multi.write_bytes(gzip.compress(text[:777]) + gzip.compress(text[777:]))
    ref = read_trace(plain)
    _same(read_trace(gz), ref)
    _same(read_trace(multi, chunk_bytes=128), ref)


def test_non_kineto_value_types_fall_back_to_the_generic_parser(tmp_path):
    events = [ev("k", 0, 5), {"ph": "X", "cat": "kernel", "name": 42, "pid": [1], "tid": 7,
                              "ts": f"{1_790_857_026_010.0}", "dur": "2"}, 17, "text"]
    t = read_trace(write_trace(tmp_path / "odd.json", events, style="compact"))
    assert t.names == ["k", "42"]
    assert t.dur_ns.tolist() == [5000, 2000]
    assert t.start_ns.tolist() == [0, 10_000]


# --- bad input: a TraceError that names the file ---------------------------------------

def _bad(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _raises(p, match: str):
    with pytest.raises(TraceError, match=match) as ei:
        read_trace(p, chunk_bytes=256)
    assert str(p) in str(ei.value) and ei.value.path == p
    return ei.value


def test_missing_file(tmp_path):
    _raises(tmp_path / "nope.json.gz", "cannot open")


def test_truncated_gzip(tmp_path):
    whole = gzip.compress(render(_events(), rank_meta(0)).encode())
    _raises(_bad(tmp_path, "cut.json.gz", whole[: len(whole) // 2]), "truncated gzip")


def test_corrupt_gzip(tmp_path):
    whole = bytearray(gzip.compress(render(_events(200), rank_meta(0)).encode()))
    for i in range(200, 260):
        whole[i] ^= 0x5A
    _raises(_bad(tmp_path, "bad.json.gz", bytes(whole)), "corrupt gzip|not valid JSON")


def test_gzip_with_bad_checksum(tmp_path):
    whole = bytearray(gzip.compress(render(_events(), rank_meta(0)).encode()))
    whole[-6] ^= 0xFF  # CRC32 in the trailer
    _raises(_bad(tmp_path, "crc.json.gz", bytes(whole)), "corrupt gzip")


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.97])
def test_truncated_json(tmp_path, cut):
    text = render(_events(), rank_meta(0)).encode()
    _raises(_bad(tmp_path, "cut.json", text[: int(len(text) * cut)]), "not valid JSON")


def test_corrupt_json_in_the_middle(tmp_path):
    text = render(_events(), rank_meta(0))
    i = text.index("},\n  {", len(text) // 2) + 1  # between two events, not inside a string
    _raises(_bad(tmp_path, "mid.json", (text[:i] + " @@ not json @@ " + text[i:]).encode()),
            "not valid JSON")


@pytest.mark.parametrize("doc, match", [
    (b'{"schemaVersion": 1, "deviceProperties": []}', "no traceEvents"),
    (b'{"traceEvents": 5}', "no traceEvents"),
    (b"hello world", "not a JSON trace"),
    (b"", "empty file"),
    (b"   \n ", "empty file"),
    (b'{"traceEvents": []}', "empty trace"),
    (b"[]", "empty trace"),
    (b'{"traceEvents": [{"ph": "X", "cat": "python_function", "name": "f", "ts": 1, "dur": 2}]}',
     "nothing to analyse"),
])
def test_not_a_trace(tmp_path, doc, match):
    _raises(_bad(tmp_path, "x.json", doc), match)


def test_gzipped_non_trace(tmp_path):
    _raises(_bad(tmp_path, "x.json.gz", gzip.compress(b'{"hello": [1, 2, 3]}')), "no traceEvents")


def test_core_imports_without_torch_hydra_mlflow():
    code = ("import sys, k25exp.traces, k25exp.traces.outputs; "
            "bad = [m for m in ('torch', 'hydra', 'mlflow', 'omegaconf') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_corrupt_json_is_reported_before_the_rest_is_read(tmp_path):
    events = _events(2000)
    text = render(events, rank_meta(0))
    i = text.index("},\n  {", len(text) // 10) + 1
    p = _bad(tmp_path, "early.json", (text[:i] + " @@ " + text[i:]).encode())
    with pytest.raises(TraceError, match=r"not valid JSON \(corrupt file\?\)") as ei:
        read_trace(p, chunk_bytes=4096)
    assert str(p) in str(ei.value)


# --- what Kineto writes after the events ------------------------------------------------

# Kineto writes its log lines after traceEvents, each ending its source location with ']'
# ("...cpp:NNN]"): here 12 INFO lines and an ERROR line that holds brackets, '},', an
# escaped quote and a backslash: 16 ']' follow the events' own ']' (the reader tried 8).
KINETO_LOGS = {
    "INFO": [f"I0301 12:00:{i:02d}.123456 4242 CuptiActivityProfiler.cpp:{200 + i}] step {i}"
             for i in range(12)],
    "ERROR": ['E0301 12:00:13.000001 4242 CuptiActivityProfiler.cpp:999] odd "name" [x]}, {y '
              "\\ end"],
}


@pytest.mark.parametrize("style", ["kineto", "compact"])
@pytest.mark.parametrize("chunk", [64, 4096, 1 << 24])
def test_log_arrays_after_the_events_are_read(tmp_path, style, chunk):
    events = [ev(f"k{i}", 10 * i, 5) for i in range(3)] + [op("aten::mm", 0, 30)]
    p = write_trace(tmp_path / "logs.json.gz", events, rank_meta(0), style, after=KINETO_LOGS)
    text = gzip.decompress(p.read_bytes())
    assert text[text.index(b'"INFO"'):].count(b"]") == 16   # 12 + 2 in the lines, 2 arrays' own
    doc = json.loads(text)                                  # valid JSON, as Python reads it
    assert doc["ERROR"] == KINETO_LOGS["ERROR"]
    for fast in (True, False):
        t = read_trace(p, chunk_bytes=chunk, fast=fast)
        # by hand from the JSON: 4 events, 3 kernels and 1 CPU operator, all kept
        assert (t.events_total, t.n_events) == (4, 4)
        assert sorted(t.names) == ["aten::mm", "k0", "k1", "k2"]
        assert t.metadata["INFO"] == KINETO_LOGS["INFO"]
        assert t.metadata["ERROR"] == KINETO_LOGS["ERROR"]
        assert t.metadata["traceName"] == "test" and t.metadata["distributedInfo"]["rank"] == 0


def test_an_unclosed_trace_object_after_the_logs_says_what_was_expected(tmp_path):
    # the file stops after the log arrays, before the object's closing '}'
    text = render([ev("k", 0, 5)], rank_meta(0), after=KINETO_LOGS).rstrip()
    assert text.endswith("}")
    e = _raises(_bad(tmp_path, "open.json", text[:-1].encode()), "cannot find the end")
    assert "cannot find the end of the traceEvents array" in str(e)
    assert "not valid JSON (truncated or corrupt file?)" in str(e)


def test_a_trace_of_unrecognised_kinds_only_names_them(tmp_path):
    events = [ev("matmul", 10 * i, 5, cat="acme_kernel") for i in range(3)]
    events.append(ev("f", 0, 50, cat="python_function"))
    e = _raises(write_trace(tmp_path / "acme.json", events), "nothing to analyse")
    assert str(e).endswith("among 4 events: nothing to analyse; events of unrecognised kinds: "
                           "acme_kernel (3)")


@pytest.mark.parametrize("fast", [True, False])
def test_links_from_device_events_to_their_launches(tmp_path, fast):
    # kernels with correlation ids 1-3; their launches (and a stream query, not a launch);
    # a record_param_comms operator and kernel 3 that name their collective
    events = [ev("ncclDevKernel_SendRecv", 10, 5, args={"correlation": 1}),
              ev("nvjet_gemm", 20, 5, args={"correlation": 2}),
              ev("ncclDevKernel_AllGather", 30, 5, args={"correlation": 3, "Collective name": "allgather"}),
              ev("cudaLaunchKernel", 1, 2, cat="cuda_runtime", pid=100, tid=100, args={"correlation": 1}),
              ev("cudaLaunchKernel", 2, 2, cat="cuda_runtime", pid=100, tid=101, args={"correlation": 2}),
              ev("cuLaunchKernelEx", 3, 2, cat="cuda_driver", pid=100, tid=100, args={"correlation": 3}),
              ev("cudaStreamIsCapturing", 4, 1, cat="cuda_runtime", pid=100, tid=100, args={"correlation": 9}),
              op("record_param_comms", 0, 4, args={"Collective name": "all_to_all"})]
    p = write_trace(tmp_path / "links.json", events)
    t = read_trace(p, fast=fast, chunk_bytes=200)
    assert t.corr.tolist() == [1, 2, 3, -1]                       # the CPU operator has none
    assert t.coll == {2: "allgather", 3: "all_to_all"}
    assert t.launches.corr.tolist() == [1, 2, 3]                   # launches only, by id
    assert [t.lanes[i] for i in t.launches.lane] == [(100, 100), (100, 101), (100, 100)]
    assert t.launches.start_ns.tolist() == [1000, 2000, 3000]     # ns after the operator at 0
    assert t.launches.find(np.array([3, 9, -1, 1])).tolist() == [2, -1, -1, 0]
    # only the links the caller asks for (the analysis: its collectives)
    t = read_trace(p, fast=fast, chunk_bytes=200, linked=lambda name: name.startswith("nccl"))
    assert t.corr.tolist() == [1, -1, 3, -1] and t.coll == {2: "allgather", 3: "all_to_all"}
