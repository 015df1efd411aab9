"""The report's and the compare's HTML pages in headless Chromium: they render, every plot is
a visible image, the console stays free of errors, and every run link points at a run that
exists, in its own experiment, in the store the pages were made from."""

from __future__ import annotations

import re

import pytest

from k25exp.report import metrics as M
from k25exp.report import render as report_render
from k25exp.report.figures import Figure, Section
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView
from tests.compare.browser import Chromium, chromium_path

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    chromium_path() is None,
    reason="needs Chromium (Debian: apt-get install -y chromium) to load the pages headless")]


UI = "http://127.0.0.1:5000"
RUN_LINK = re.compile(r"^http://127\.0\.0\.1:5000/#/experiments/(\d+)/runs/([0-9a-f]{32})$")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real MLflow store with two macro runs; RunViews of them as the pages get them."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"
    c = MlflowClient(uri)
    eid = c.create_experiment("k25exp/macro")
    runs = [c.create_run(eid, run_name=f"macro-{i}") for i in range(2)]
    views = [RunView(r.info.run_id, eid, "macro", "FINISHED", i) for i, r in enumerate(runs)]
    return c, views


def links_point_at_runs(seen, client, expected):
    """Every MLflow link on the page names a run that exists in the experiment it says."""
    found = [RUN_LINK.match(h) for h in seen["links"] if h.startswith(UI)]
    assert found and all(found), seen["links"]
    for m in found:
        assert client.get_run(m.group(2)).info.experiment_id == m.group(1)
    assert {m.group(2) for m in found} == expected


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        yield b


def check(browser, page):
    seen = browser.load(page)
    assert seen["errors"] == []
    assert seen["images"], f"no image on {page.name}"
    assert all(complete and width > 0 for complete, width, _ in seen["images"]), seen["images"]
    return seen


def test_report_page_renders_with_its_plot(browser, store, tmp_path):
    client, (run, _) = store
    plot = {"kind": "sweep", "file": "tpot.png", "x": [1, 2, 4], "series": {"TPOT": [10.0, 11.0, 13.0]},
            "xlabel": "concurrency", "ylabel": "ms", "title": "TPOT"}
    sections = [Section("Decode budget", [Figure(M.TPOT, 12.5, [run])], plot=plot)]
    _, page, _ = report_render.write(tmp_path, Campaign("c-browser", "sqlite:///x.db", [run]),
                                     sections, UI, "now")
    seen = check(browser, page)
    assert "k25exp campaign report: c-browser" in seen["text"]
    links_point_at_runs(seen, client, {run.run_id})


def test_compare_page_renders_with_its_plot(browser, store, tmp_path):
    from k25exp.compare import render
    from k25exp.compare.resolve import Pair, Side
    from k25exp.compare.significance import compare_samples
    from k25exp.compare.table import Comparison, Row

    client, (a, b) = store
    t = compare_samples([10, 10.2, 9.9, 10.1, 10.05], [12, 12.1, 11.9, 12.2, 12.05])
    pair = Pair("macro", {}, a, b)
    rows = [Row(pair.label, "single_stream_tpot_ms", None, 10.05, 12.05, "lower", t, 0.01, True),
            Row(pair.label, "output_tok_s", 2, 100.0, 90.0, "higher", note="no samples: derived")]
    c = Comparison(Side(a.run_id, "run", [a]), Side(b.run_id, "run", [b]), [pair], rows, [],
                   [("env.cpu_affinity", "2", "1")], [], 0.05, None)
    _, page = render.write(tmp_path, c, "now")
    seen = check(browser, page)
    assert "env.cpu_affinity" in seen["text"] and "single_stream_tpot_ms" in seen["text"]
    links_point_at_runs(seen, client, {a.run_id, b.run_id})


def test_the_check_sees_a_broken_image_and_console_errors(browser, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<!doctype html><html><head><title>bad</title></head><body>'
                    '<img alt="broken" src="data:image/png;base64,AAAA">'
                    '<script>console.error("bad thing"); throw new Error("boom")</script></body></html>')
    seen = browser.load(page)
    assert seen["images"] == [[True, 0, "broken"]]  # loaded, but nothing to show
    assert "bad thing" in seen["errors"] and any("Uncaught" in e for e in seen["errors"])
