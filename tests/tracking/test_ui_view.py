"""The saved runs view and the per-step summaries that put a sweep on its run's row
(k25exp.tracking.ui_view); in a browser on a real campaign: test_ui_first_screen.py."""

from __future__ import annotations

import json

from k25exp.config.experiments import (
    AllReduceSweepConfig,
    EXPERIMENT_SCHEMAS,
    MacroConfig,
    ProfileConfig,
)
from k25exp.tracking import ui_view
from k25exp.tracking.recorder import MemoryRecorder


def test_every_step_of_a_headline_figure_is_one_tag_on_the_run():
    rec = MemoryRecorder()
    run = ui_view.with_step_summaries(rec, MacroConfig())
    for c, tpot, tok in ((1, 11.71, 83.09), (4, 12.68, 278.52), (2, 12.37, 147.78)):
        run.log_metrics({"tpot_ms_p50": tpot, "output_tok_s": tok, "ttft_ms_p50": 30.0}, step=c)
    run.log_metrics({"single_stream_tpot_ms": 11.4})  # no step: no summary
    assert rec.tags == {"tpot_ms_p50 per c": "1:11.7 2:12.4 4:12.7",
                        "output_tok_s per c": "1:83.1 2:148 4:279"}
    assert rec.latest("tpot_ms_p50") == {1: 11.71, 4: 12.68, 2: 12.37}  # the metrics as logged
    run.set_tags({"x": "y"})  # everything else passes through
    assert rec.tags["x"] == "y"


def test_open_loop_levels_are_rates():
    rec = MemoryRecorder()
    run = ui_view.with_step_summaries(rec, MacroConfig(load="open"))
    run.log_metrics({"tpot_ms_p50": 13.04}, step=500)  # step = rate × 1000
    run.log_metrics({"tpot_ms_p50": 14.2}, step=2000)
    assert rec.tags == {"tpot_ms_p50 per req/s": "0.5:13 2:14.2"}


def test_sizes_read_as_sizes_and_experiments_without_steps_get_the_run_itself():
    rec = MemoryRecorder()
    run = ui_view.with_step_summaries(rec, AllReduceSweepConfig())
    for b, t in ((8, 22.9), (1024, 16.4), (256 << 20, 115627.0)):
        run.log_metrics({"time_us": t}, step=b)
    assert rec.tags["time_us per size"] == "8B:22.9 1KiB:16.4 256MiB:115627"
    assert ui_view.with_step_summaries(rec, ProfileConfig()) is rec


def test_fmt_keeps_three_significant_digits():
    assert [ui_view.fmt(v) for v in (0, 0.04213, 9.8512, 11.71, 147.78, 1536.2, 2.5e-5)] == \
        ["0", "0.0421", "9.85", "11.7", "148", "1536", "2.50e-05"]


def test_view_lists_summaries_then_params_then_figures_flat_and_newest_first():
    state = ui_view.state_for("k25exp/macro")
    cols = state["selectedColumns"]
    assert cols[0] == "attributes.`Run Name`"
    # a column per axis a level can be on: concurrency, rate, a trace's speedup
    assert cols[1:7] == ["tags.`tpot_ms_p50 per c`", "tags.`tpot_ms_p50 per req/s`",
                         "tags.`tpot_ms_p50 per speedup`", "tags.`output_tok_s per c`",
                         "tags.`output_tok_s per req/s`", "tags.`output_tok_s per speedup`"]
    assert cols[7:10] == [f"params.`{p}`" for p in MacroConfig.headline_params]
    metrics = [c for c in cols if c.startswith("metrics.")]
    assert metrics[-2:] == ["metrics.`tpot_ms_p50`", "metrics.`output_tok_s`"]  # the last level's
    # MLflow nests children under collapsed parents when sorted by start time or unfiltered,
    # and a shared view may not expand them: filtered to job runs, sorted by the store
    assert state["searchFilter"] == "tags.`k25exp.experiment` != ''" and state["orderByKey"] == ""
    assert state["columnWidths"]["tags.`tpot_ms_p50 per c`"] == ui_view.WIDTHS["tags"]
    assert state["columnOrder"] == cols


def test_every_experiment_with_a_headline_has_a_view():
    for name, cls in EXPERIMENT_SCHEMAS.items():
        assert (ui_view.state_for(f"k25exp/{name}") is None) == (not cls.headline), name
        assert not cls.step_headline or cls.step_axes, name


def test_the_campaign_view_is_the_same_view_filtered_to_the_campaign():
    written = {}

    class Client:
        def set_experiment_tag(self, eid, key, value):
            written[key] = json.loads(value)

    assert ui_view.install_campaign(Client(), "5", "k25exp/macro", "c-1")
    view = written[ui_view.TAG_PREFIX + ui_view.CAMPAIGN_KEY]
    assert view["searchFilter"] == f"tags.campaign = 'c-1' and {ui_view.FILTER}"
    assert view["selectedColumns"] == ui_view.state_for("k25exp/macro")["selectedColumns"]
    assert not ui_view.install_campaign(Client(), "0", "Default", "c-1")


def test_summaries_are_results_not_environment():
    """k25exp compare's environment diff leaves them out (they differ run by run)."""
    from k25exp.compare.envdiff import tag_diff
    from k25exp.compare.resolve import Side
    from k25exp.tracking.read import RunView

    def side(tpot: str, host: str) -> Side:
        r = RunView("r" + tpot, "1", "macro", "FINISHED", 0, tags={"tpot_ms_p50 per c": tpot, "host": host})
        return Side(r.run_id, "run", [r])

    assert ui_view.is_summary_tag(ui_view.summary_tag("a2a_us", "tokens/GPU"))
    assert tag_diff(side("1:11.7", "a"), side("1:12.9", "b")) == [("host", "a", "b")]
