"""The tail's writers (k25exp.traces.tail_outputs): what grew in a slow token's step, from the
breakdown's per-step categories, counted by hand."""

from __future__ import annotations

from types import SimpleNamespace

from k25exp.traces.tail_outputs import grew, step_categories


def test_what_grew_in_a_step_is_its_categories_over_each_ones_median(tmp_path):
    """Steps 0-3 analysed (moe 2, 2, 2, 9 ms; attention 1, 1, 1.5, 1.8): step 3's moe is 7 ms
    over its median (2), attention 0.55 (median 1.25)."""
    csv = tmp_path / "steps_rank0.csv"
    csv.write_text("step,name,start_us,dur_us,attention_us,moe_us,idle_us,work_us,comm_wait_us\n"
                   + "".join(f"{i},x,{1000.0 * (10 * i)},5000,{a * 1e3},{m * 1e3},0,0,7\n"
                             for i, (a, m) in enumerate([(1, 2), (1, 2), (1.5, 2), (1.8, 9)])))
    off = 5_000_000_000
    # the engine steps on the system clock; step 4 was not analysed (a prefill)
    steps = [SimpleNamespace(index=i, start_ns=off + i * 10_000_000) for i in range(5)]
    cats = step_categories(csv, off, steps)
    assert sorted(cats) == [0, 1, 2, 3]
    assert cats[3] == {"attention": 1.8, "moe": 9.0, "idle": 0.0}
    assert grew(cats, 3) == "moe +7.0 ms, attention +0.6 ms"
    assert grew(cats, 0) == ""    # at or below every median (nothing grew by ≥ 0.05 ms)
    assert grew(cats, 4) == ""    # not analysed
