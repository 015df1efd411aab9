"""Each request's drawn lengths (k25exp.load.lengths): the bounds and first values worked out by
hand with numpy's generator, the empirical shape's values all from its file, bad files named."""

from __future__ import annotations

import math

import numpy as np
import pytest

from k25exp.config.experiments.request_shapes import LengthConfig
from k25exp.load.lengths import BLOCK, LengthFileError, Lengths, read_lengths, shape_figures


def test_a_seeded_uniform_draw_keeps_vllms_range_and_its_first_lengths_by_hand():
    # vLLM's random dataset at --random-input-len 100 --random-range-ratio 0.25: an integer in
    # [floor(75.0), ceil(125.0)] = [75, 125]; request i from block i // 256, generator
    # default_rng([seed, stream, block]) (stream 0 = input)
    lengths = Lengths(LengthConfig(dist="uniform", range_ratio=0.25), 100, seed=7, stream="input")
    first = np.random.default_rng([7, 0, 0]).integers(75, 126, size=BLOCK)
    assert [lengths(i) for i in range(8)] == first[:8].tolist()
    second = np.random.default_rng([7, 0, 1]).integers(75, 126, size=BLOCK)
    assert lengths(BLOCK + 3) == second[3]  # a later block: its own generator
    drawn = [lengths(i) for i in range(2000)]
    assert min(drawn) == 75 and max(drawn) == 125  # both ends reached, nothing beyond
    # the output stream (1) is drawn apart from the input's
    out = Lengths(LengthConfig(dist="uniform", range_ratio=0.25), 100, seed=7, stream="output")
    assert [out(i) for i in range(4)] == np.random.default_rng([7, 1, 0]).integers(
        75, 126, size=BLOCK)[:4].tolist()


def test_a_requests_length_depends_on_its_index_alone():
    shape = LengthConfig(dist="normal", stddev=10)
    a, b = Lengths(shape, 64, seed=1, stream="input"), Lengths(shape, 64, seed=1, stream="input")
    backwards = [b(i) for i in reversed(range(600))]  # drawn in another order
    assert [a(i) for i in range(600)] == backwards[::-1]
    assert [a(i) for i in range(5)] != [Lengths(shape, 64, seed=2, stream="input")(i) for i in range(5)]


def test_normal_and_lognormal_draws_by_hand_rounded_and_clipped():
    n = Lengths(LengthConfig(dist="normal", stddev=30, min=50, max=90), 64, seed=3, stream="input")
    raw = np.random.default_rng([3, 0, 0]).normal(64, 30, size=BLOCK)
    assert [n(i) for i in range(BLOCK)] == np.clip(np.rint(raw), 50, 90).astype(int).tolist()
    assert {n(i) for i in range(BLOCK)} >= {50, 90}  # 30 tokens either side: both bounds hit
    s = 0.5
    ln = Lengths(LengthConfig(dist="lognormal", sigma=s), 200, seed=3, stream="output")
    raw = np.random.default_rng([3, 1, 0]).lognormal(math.log(200) - s * s / 2, s, size=BLOCK)
    assert [ln(i) for i in range(BLOCK)] == np.clip(np.rint(raw), 1, None).astype(int).tolist()
    # mean 200 by construction: e^(μ + σ²/2) = 200; 256 draws of CV √(e^σ² − 1) = 0.53 land
    # within 4 standard errors of it (4 × 0.53 × 200 / 16 = 27 tokens)
    assert abs(np.mean([ln(i) for i in range(BLOCK)]) - 200) < 27


def test_the_builders_least_raises_short_prompts_and_a_fixed_shape_stays_exact():
    short = Lengths(LengthConfig(dist="uniform", range_ratio=0.9), 10, seed=0, stream="input", low=4)
    assert min(short(i) for i in range(BLOCK)) == 4  # [1, 19] drawn, raised to 4
    fixed = Lengths(LengthConfig(), 128, seed=0, stream="input", low=200)
    assert fixed(0) == fixed(10_000) == 128 and fixed.upper() == 128  # never moved: exact as before


def test_the_empirical_shape_draws_only_the_files_values(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("17\n\n300\n42\n300\n")  # a blank line is skipped
    values = read_lengths(str(f), "experiment.input_len.path")
    assert values.tolist() == [17, 300, 42, 300]
    e = Lengths(LengthConfig(dist="empirical", path=str(f)), 128, seed=5, stream="input", values=values)
    drawn = [e(i) for i in range(1000)]
    assert set(drawn) == {17, 42, 300}  # every value, none other
    assert drawn[:BLOCK] == np.random.default_rng([5, 0, 0]).choice(values, size=BLOCK).tolist()
    assert e.upper() == 300
    assert Lengths(LengthConfig(dist="empirical", path=str(f), max=100), 128, 5, "input",
                   values=values).upper() == 100


def test_a_bad_lengths_file_names_the_key_the_file_and_each_bad_line(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("12\nabc\n0\n7.5\n")
    with pytest.raises(LengthFileError) as e:
        read_lengths(str(f), "experiment.output_len.path")
    msg = str(e.value)
    assert msg.startswith(f"experiment.output_len.path={str(f)!r}: ")
    for n, bad in ((2, "'abc'"), (3, "'0'"), (4, "'7.5'")):
        assert f"{f}:{n}: {bad}: expected a positive integer (a length in tokens)" in msg
    with pytest.raises(LengthFileError, match=r"experiment.input_len.path='/nope.txt': no such file"):
        read_lengths("/nope.txt", "experiment.input_len.path")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(LengthFileError, match="no lengths in the file"):
        read_lengths(str(tmp_path / "empty.txt"), "experiment.input_len.path")


def test_a_levels_shape_figures_by_hand():
    recs = [{"prompt_tokens_target": 100, "max_tokens": 10}, {"prompt_tokens_target": 200, "max_tokens": 30},
            {"prompt_tokens_target": 300, "max_tokens": 20, "ok": False}]  # a failed request counts: it was sent
    f = shape_figures(recs)
    assert f["input_len_mean"] == 200 and f["input_len_min"] == 100 and f["input_len_max"] == 300
    assert f["input_len_std"] == pytest.approx(math.sqrt((100 ** 2 + 0 + 100 ** 2) / 3))  # ddof 0
    assert f["output_len_mean"] == 20 and f["output_len_std"] == pytest.approx(math.sqrt(200 / 3))
    assert shape_figures([]) == {}
