"""A Mooncake-form trace read and checked line by line (k25exp.load.trace), its schedule scaled
by hand, and the seeded traces k25exp.load.trace_gen writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from k25exp.load.trace import TraceError, read_trace, too_long
from k25exp.load.trace_gen import generate, write
from tests.conftest import ROOT


def _trace(tmp_path, *lines: str):
    f = tmp_path / "trace.jsonl"
    f.write_text("".join(x + "\n" for x in lines))
    return f


def test_a_trace_is_read_in_file_order_and_its_times_scaled_by_hand(tmp_path):
    f = _trace(tmp_path,
               '{"timestamp": 1000, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}',
               '{"timestamp": 1250, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}',
               '',  # a blank line is no request
               '{"timestamp": 3000, "input_length": 12, "output_length": 5, "session_id": "x"}')
    t = read_trace(str(f))
    assert [(r.line, r.input_length, r.output_length, r.hash_ids) for r in t.requests] == [
        (1, 655, 52, (46, 47)), (2, 672, 26, (46, 47)), (4, 12, 5, ())]
    # ms since the earliest request: 0, 250, 2000 → s at speedup 1, halved at speedup 2
    assert t.due_s().tolist() == pytest.approx([0.0, 0.25, 2.0])
    assert t.due_s(2.0).tolist() == pytest.approx([0.0, 0.125, 1.0])
    assert t.due_s(0.5, n=2).tolist() == pytest.approx([0.0, 0.5])  # the first n, slowed down
    # 655 + 52 = 707 does not fit 700 tokens; 672 + 26 = 698 and 12 + 5 do
    assert too_long(t, 700) == [f"{f}:1: input_length + output_length = 707: expected at most "
                                "server.max_model_len=700"]


def test_every_bad_line_is_named_with_its_number_and_what_was_expected(tmp_path):
    f = _trace(tmp_path,
               '{"timestamp": 0, "input_length": 100, "output_length": 10}',
               '{"timestamp": 5, "input_length": -3, "output_length": 10}',
               '{"timestamp": -1, "input_length": 100, "output_length": 10}',
               '{"timestamp": 9, "input_length": 100, "output_length": 2.5}',
               'not json',
               '[1, 2]',
               '{"timestamp": 9, "input_length": 100}',
               '{"timestamp": 9, "input_length": 600, "output_length": 1, "hash_ids": [0, 1, 2]}',
               '{"timestamp": 9, "input_length": 100, "output_length": 1, "hash_ids": [0, "a"]}',
               '{"timestamp": true, "input_length": 100, "output_length": 1}')
    with pytest.raises(TraceError) as e:
        read_trace(str(f))
    msg = str(e.value)
    assert msg.startswith(f"experiment.trace.path={str(f)!r}: 9 bad line(s), nothing sent:")
    for expected in (
            f"{f}:2: input_length=-3: expected a positive integer",
            f"{f}:3: timestamp=-1: expected a time in ms >= 0",
            f"{f}:4: output_length=2.5: expected a positive integer",
            f"{f}:5: not JSON (",
            f"{f}:6: [1, 2]: expected a JSON object",
            f"{f}:7: no output_length: expected timestamp (ms), input_length and output_length",
            f"{f}:8: hash_ids has 3 blocks of 512 tokens: expected at most 2, what input_length=600 holds",
            f"{f}:9: hash_ids=[0, \"a\"]: expected a list of integers >= 0",
            f"{f}:10: timestamp=true: expected a time in ms >= 0"):
        assert expected in msg, expected
    assert f"{f}:1:" not in msg
    with pytest.raises(TraceError, match="no such file"):
        read_trace(str(tmp_path / "missing.jsonl"))
    with pytest.raises(TraceError, match="no requests in the file"):
        read_trace(str(_trace(tmp_path, "")))


def test_a_long_list_of_bad_lines_is_cut_and_counted(tmp_path):
    f = _trace(tmp_path, *['{"timestamp": 0, "input_length": 0, "output_length": 1}'] * 25)
    with pytest.raises(TraceError) as e:
        read_trace(str(f))
    assert f"{f}:20: input_length=0" in str(e.value) and f"{f}:21:" not in str(e.value)
    assert "(and 5 more bad lines)" in str(e.value)


def test_a_generated_trace_is_seeded_valid_and_shares_its_groups_blocks(tmp_path):
    lines = generate(requests=40, rate=8.0, seed=3, groups=2, shared_blocks=2,
                     input_range=(40, 120), output_range=(4, 16), block_tokens=16)
    assert lines == generate(requests=40, rate=8.0, seed=3, groups=2, shared_blocks=2,
                             input_range=(40, 120), output_range=(4, 16), block_tokens=16)
    assert lines != generate(requests=40, rate=8.0, seed=4, groups=2, shared_blocks=2,
                             input_range=(40, 120), output_range=(4, 16), block_tokens=16)
    t = read_trace(str(write(tmp_path / "t.jsonl", lines)), block_tokens=16)  # every line valid
    assert len(t) == 40 and lines[0]["timestamp"] == 0
    assert all(b["timestamp"] >= a["timestamp"] for a, b in zip(lines, lines[1:]))
    for x in lines:
        assert 40 <= x["input_length"] <= 120 and 4 <= x["output_length"] <= 16
        assert len(x["hash_ids"]) == -(-x["input_length"] // 16)  # ceil: every block named
    firsts = {tuple(x["hash_ids"][:2]) for x in lines}
    assert len(firsts) == 2  # two groups, each its own first two blocks
    rest = [h for x in lines for h in x["hash_ids"][2:]]
    assert len(rest) == len(set(rest))  # the other blocks are each request's own
    ids = [h for x in lines for h in x["hash_ids"]]
    assert sorted(set(ids)) == list(range(len(set(ids))))  # numbered in order of first use


def test_the_generator_script_writes_a_trace(tmp_path):
    out = tmp_path / "trace.jsonl"
    r = subprocess.run([sys.executable, "-m", "k25exp.load.trace_gen", str(out), "--requests", "5",
                        "--rate", "2", "--input", "600:700", "--output", "8:8"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 5 and {x["output_length"] for x in lines} == {8}
    assert f"{out}: 5 requests" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "k25exp.load.trace_gen", str(out), "--input", "x"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "'x': expected LOW:HIGH tokens" in bad.stderr
