"""Request shapes and trace replay against the real vLLM CPU server (the package's session
server): what vLLM counted for each request is the length drawn for it (or its trace line's),
and a replayed trace's requests were scheduled at its times, scaled, and sent on time.

Every expectation is worked out here by hand: the drawn lengths with numpy's generator from
the seed, the schedule from the trace file's timestamps, the send-lag figures from the records.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from k25exp.load.lengths import BLOCK
from k25exp.load.trace_gen import generate, write
from k25exp.runners.macro import WARMUP_PROMPTS
from k25exp.stats import percentile
from tests.serving.test_macro_runner import run_macro

pytestmark = pytest.mark.vllm  # every test here uses the real server

COMMON = ["experiment.warmup=1", "experiment.progress=false"]


def records(out):
    return [orjson.loads(x) for x in (out / "requests.jsonl").read_bytes().splitlines()]


def drawn(seed: int, stream: int, lo: int, hi: int, index: int) -> int:
    """Request `index`'s uniform length, as k25exp.load.lengths draws it: block index // 256
    from default_rng([seed, stream, block]), integers in [lo, hi]."""
    block = np.random.default_rng([seed, stream, index // BLOCK]).integers(lo, hi + 1, size=BLOCK)
    return int(block[index % BLOCK])


def test_a_uniform_shape_sends_each_request_its_drawn_lengths(vllm, tmp_path):
    # prompts uniform in [floor(48 × 0.5), ceil(48 × 1.5)] = [24, 72], outputs in [6, 18]
    cfg, rec, _ = run_macro(tmp_path, *vllm["overrides"], *COMMON, "experiment.input_tokens=48",
                            "experiment.input_len.dist=uniform", "experiment.input_len.range_ratio=0.5",
                            "experiment.output_tokens=12", "experiment.output_len.dist=uniform",
                            "experiment.output_len.range_ratio=0.5", "experiment.concurrency=[1,4]",
                            "experiment.single_stream_requests=2", "experiment.rounds=2",
                            "experiment.min_requests=4")
    seed = cfg.experiment.seed
    recs = records(tmp_path)
    assert [r["phase"] for r in recs[:3]] == ["warmup", "single", "single"]
    warm = [r["prompt_index"] for r in recs if r["phase"] == "warmup"]
    assert min(warm) == WARMUP_PROMPTS and len(set(warm)) == len(warm)
    for r in recs:
        assert r["ok"], r["error"]
        index = r["i"] if r["phase"] == "single" else r["prompt_index"]
        want_in, want_out = drawn(seed, 0, 24, 72, index), drawn(seed, 1, 6, 18, index)
        assert (r["prompt_tokens_target"], r["max_tokens"]) == (want_in, want_out), r["phase"]
        # vLLM counted exactly those: the prompt's tokens, and max_tokens with ignore_eos
        assert r["usage"]["prompt_tokens"] == want_in
        assert r["usage"]["completion_tokens"] == want_out == sum(r["chunk_tokens"])
    sweep = [r for r in recs if r["phase"] == "sweep"]
    assert len({r["prompt_tokens_target"] for r in sweep}) > 3  # the lengths do vary
    for c in (1, 4):
        lv = [r for r in sweep if r["level"] == c]
        ins = np.array([r["prompt_tokens_target"] for r in lv], dtype=float)
        outs = np.array([r["max_tokens"] for r in lv], dtype=float)
        assert rec.latest("input_len_mean")[c] == pytest.approx(ins.mean())
        assert rec.latest("input_len_std")[c] == pytest.approx(ins.std())
        assert (rec.latest("input_len_min")[c], rec.latest("input_len_max")[c]) == (ins.min(), ins.max())
        assert rec.latest("output_len_mean")[c] == pytest.approx(outs.mean())
        assert rec.latest("output_len_std")[c] == pytest.approx(outs.std())
        assert rec.latest("prompt_tokens_mismatch")[c] == 0 == rec.latest("output_tokens_mismatch")[c]
        assert rec.latest("output_tok_s")[c] == pytest.approx(outs.sum() / rec.latest("wall_s")[c])
    assert rec.tags["macro.input_len"] == "uniform, mean 48, range_ratio 0.5, clipped to [1, none]"
    assert "in uniform, mean 48 / out uniform, mean 12 tokens" in (tmp_path / "results.txt").read_text()


def test_a_replayed_trace_sends_its_lines_at_their_times_scaled(vllm, tmp_path, record_property):
    # 8 requests, Poisson at 8 req/s, two groups sharing their first two blocks of 16 tokens
    lines = generate(requests=8, rate=8.0, seed=1, groups=2, shared_blocks=2, input_range=(40, 120),
                     output_range=(4, 12), block_tokens=16)
    trace = write(tmp_path / "trace.jsonl", lines)
    out = tmp_path / "run"
    cfg, rec, summary = run_macro(out, *vllm["overrides"], *COMMON, "experiment.load=trace",
                                  f"experiment.trace.path={trace}", "experiment.trace.speedup=[1,2]",
                                  "experiment.trace.block_tokens=16", "experiment.single_stream_requests=1",
                                  "experiment.input_tokens=32", "experiment.output_tokens=8")
    recs = records(out)
    ts = [x["timestamp"] for x in lines]
    for speedup in (1, 2):
        lv = sorted((r for r in recs if r["phase"] == "sweep" and r["level"] == speedup),
                    key=lambda r: r["i"])
        assert [r["i"] for r in lv] == list(range(8)) and {r["step"] for r in lv} == {speedup * 1000}
        for r, x in zip(lv, lines):
            assert r["ok"], r["error"]
            assert (r["prompt_tokens_target"], r["max_tokens"]) == (x["input_length"], x["output_length"])
            assert r["usage"]["prompt_tokens"] == x["input_length"]
            assert r["usage"]["completion_tokens"] == x["output_length"] == sum(r["chunk_tokens"])
        # scheduled: the trace's ms since its first request / 1000 / speedup after the level's start
        start = lv[0]["scheduled_s"]
        assert [r["scheduled_s"] - start for r in lv] == pytest.approx(
            [(t - ts[0]) / 1e3 / speedup for t in ts], abs=1e-6)
        lags = [(r["sent_s"] - r["scheduled_s"]) * 1e3 for r in lv]
        assert min(lags) > -2.0  # never sent before its time (the loop's 1 ms timer)
        step = speedup * 1000
        assert rec.latest("send_lag_ms_n")[step] == 8
        assert rec.latest("send_lag_ms_p50")[step] == pytest.approx(percentile(lags, 50))
        assert rec.latest("send_lag_ms_mean")[step] == pytest.approx(sum(lags) / 8)
        assert step not in rec.latest("send_lag_ms_p99")  # 8 sends: no p99
        # the trace's own rate is the target: 7 gaps over its span / speedup
        assert rec.latest("scheduled_rate_req_s")[step] == pytest.approx(7 / ((ts[-1] - ts[0]) / 1e3 / speedup))
        assert rec.latest("input_len_mean")[step] == pytest.approx(np.mean([x["input_length"] for x in lines]))
        record_property(f"speedup{speedup}_send_lag_ms_p50", rec.latest("send_lag_ms_p50")[step])
        record_property(f"speedup{speedup}_send_lag_ms_max", max(lags))
        record_property(f"speedup{speedup}_prefix_cache_hit_rate",
                        rec.latest("prefix_cache_hit_rate").get(step))
    single = [r for r in recs if r["phase"] == "single"]  # the single stream keeps the fixed shape
    assert [(r["prompt_tokens_target"], r["usage"]["prompt_tokens"]) for r in single] == [(32, 32)]
    assert summary["peak_speedup"] in (1, 2) and rec.tags["macro.trace"].startswith(f"{trace}: 8 requests")
    assert "speedup" in (out / "results.txt").read_text()


# A TPOT bound no decoding request can meet (1 µs a token): the good requests are exactly the
# 1-token answers, which have no decode step (vLLM's --goodput takes their TPOT as 0).
NO_DECODE_MEETS = "experiment.slo.tpot_ms=0.001"


def test_goodput_on_a_length_distribution_counts_its_one_token_answers(vllm, tmp_path):
    # outputs drawn from a file of two lengths, 1 and 6, each equally likely
    lengths = tmp_path / "outputs.txt"
    lengths.write_text("1\n6\n")
    cfg, rec, _ = run_macro(tmp_path, *vllm["overrides"], *COMMON, "experiment.input_tokens=24",
                            "experiment.output_tokens=4", "experiment.output_len.dist=empirical",
                            f"experiment.output_len.path={lengths}", "experiment.concurrency=[2]",
                            "experiment.single_stream_requests=0", "experiment.requests=8",
                            NO_DECODE_MEETS)
    # request i's output: block 0 of default_rng([seed, 1, 0]).choice([1, 6], 256), entry i
    want = np.random.default_rng([cfg.experiment.seed, 1, 0]).choice([1, 6], size=BLOCK)[:8]
    ones = int((want == 1).sum())
    assert 0 < ones < 8  # the seed draws both: the count below tells the rule apart
    sweep = sorted((r for r in records(tmp_path) if r["phase"] == "sweep"), key=lambda r: r["prompt_index"])
    assert [r["max_tokens"] for r in sweep] == list(want)
    assert all(r["ok"] for r in sweep) and [r["usage"]["completion_tokens"] for r in sweep] == list(want)
    wall = rec.latest("wall_s")[2]
    assert rec.latest("good_fraction")[2] == ones / 8  # the old rule counted them as misses: 0
    assert rec.latest("goodput_req_s")[2] == pytest.approx(ones / wall)
    assert rec.latest("goodput_tok_s")[2] == pytest.approx(ones / wall)  # one token each


def test_goodput_on_a_replayed_trace_counts_its_one_token_lines(vllm, tmp_path):
    # 6 lines 50 ms apart, answers of 1, 5, 1, 5, 1, 5 tokens: half are good at any speedup
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(f'{{"timestamp": {50 * k}, "input_length": 24, "output_length": '
                             f'{1 if k % 2 == 0 else 5}}}\n' for k in range(6)))
    out = tmp_path / "run"
    _, rec, _ = run_macro(out, *vllm["overrides"], *COMMON, "experiment.load=trace",
                          f"experiment.trace.path={trace}", "experiment.trace.speedup=[1,2]",
                          "experiment.single_stream_requests=0", "experiment.input_tokens=24",
                          "experiment.output_tokens=4", NO_DECODE_MEETS)
    sweep = [r for r in records(out) if r["phase"] == "sweep"]
    assert len(sweep) == 12 and all(r["ok"] for r in sweep)
    for step in (1000, 2000):
        wall = rec.latest("wall_s")[step]
        assert rec.latest("good_fraction")[step] == 0.5
        assert rec.latest("goodput_req_s")[step] == pytest.approx(3 / wall)
        assert rec.latest("goodput_tok_s")[step] == pytest.approx(3 / wall)
