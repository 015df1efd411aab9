"""The MLflow UI lands on figures: on the store of a real ./multirun.sh campaign, each link
`k25exp ui` prints opens, in headless Chromium at 1600 × 1000 with a fresh profile (MLflow's
assistant panel opens on a first visit and takes its share of the width), a first screen that
holds every measured run's headline figures without a click or a scroll: macro's TPOT and
tok/s at each level, each profile run's shares, each burst's ms.

K25EXP_SCREENSHOTS=<folder> keeps the screenshots there (docs/images holds the committed ones).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from k25exp.tracking import ui_view
from tests.compare.browser import Chromium, chromium_path
from tests.mlflow_ui import running_ui

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(1800), pytest.mark.skipif(
    chromium_path() is None, reason="needs Chromium (Debian: apt-get install -y chromium) to load MLflow's UI")]

WIDTH, HEIGHT = 1600, 1000


@pytest.fixture(scope="module")
def ui(campaign_full, tmp_path_factory):
    """`k25exp ui` on a copy of the campaign's store (it writes its views there), its printed
    links by experiment, the store's client and the campaign's runs by experiment."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("ui")
    shutil.copy(campaign_full.uri[len("sqlite:///"):], tmp / "mlflow.db")
    uri = f"sqlite:///{tmp}/mlflow.db"
    with running_ui(uri) as ui:
        # the links are printed before the server starts
        printed = ui.printed
        assert "latest campaign" in printed and "sweeps" in printed, printed
        links = {}
        for line in printed.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("k25exp/") and "viewStateShareKey" in parts[1]:
                links.setdefault(parts[0].split("/", 1)[1], parts[1])  # the experiments' links first
        c = MlflowClient(uri)
        runs = {}
        for r in campaign_full.runs:
            runs.setdefault(r.data.tags.get("k25exp.experiment"), []).append(r)
        yield links, printed, c, runs


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        yield b


def on_screen(seen: dict, run_id: str, col: str) -> dict:
    """The cell of run `run_id`, column `col`, asserting a user sees it on the first screen:
    inside the window and inside the table's visible part, not scrolled away or cut off."""
    cells = [c for c in seen["cells"] if c["row"] == run_id and c["col"] == col]
    assert cells, f"no cell {col} of run {run_id[:8]} on the page: {[c['col'] for c in seen['cells']][:40]}"
    c, vp = cells[0], seen["viewport"]
    where = f"{col} of run {run_id[:8]} at x {c['left']:.0f}–{c['right']:.0f}, y {c['top']:.0f}–{c['bottom']:.0f}"
    assert vp["left"] - 1 <= c["left"] and c["right"] <= min(vp["right"], WIDTH) + 1, \
        f"{where}: outside the table's visible part, x {vp['left']:.0f}–{vp['right']:.0f}"
    assert c["bottom"] <= min(vp["bottom"], HEIGHT) + 1, f"{where}: below the first screen"
    return c


def shows_number(cell: dict, value: float) -> None:
    """The cell shows `value` (MLflow prints a metric's every digit, cut at the column's
    width): at least its first 4 significant digits fit."""
    text = cell["text"]
    assert abs(float(text) - value) <= 1e-9 * max(1.0, abs(value)), (text, value)
    lead = len(f"{value:.4g}")
    assert cell["text_width"] * min(1.0, lead / len(text)) <= cell["inner"] - 8, \
        f"{cell['col']}: {text!r} shows fewer than 4 digits in {cell['inner']:.0f} px"


def shows_all(cell: dict) -> None:
    assert cell["text_width"] <= cell["inner"] + 1, f"{cell['col']}: {cell['text']!r} is cut off"


def test_macro_link_shows_tpot_and_throughput_of_every_level(ui, browser, tmp_path):
    links, _, c, runs = ui
    (run,) = [r for r in runs["macro"] if r.info.status == "FINISHED"]
    shot = _shot(tmp_path, "macro")
    seen = browser.first_screen(links["macro"], needle="per c", screenshot=shot)
    for figure in ("tpot_ms_p50", "output_tok_s"):
        tag = ui_view.summary_tag(figure, "c")
        cell = on_screen(seen, run.info.run_id, ui_view.column("tags", tag))
        shows_all(cell)
        levels = {m.step: m.value for m in c.get_metric_history(run.info.run_id, figure)}
        assert len(levels) >= 2, levels
        # every level's figure, in level order, as the metric history has it
        assert cell["text"] == " ".join(f"{s}:{ui_view.fmt(v)}" for s, v in sorted(levels.items())), \
            (cell["text"], levels)
    _keep(shot)


def test_profile_link_shows_every_profiles_shares(ui, browser, tmp_path):
    links, _, _, runs = ui
    profiles = [r for r in runs["profile"] if r.info.status == "FINISHED"]
    assert len(profiles) >= 2  # the campaign's sweep over concurrency: one child run each
    shot = _shot(tmp_path, "profile")
    seen = browser.first_screen(links["profile"], needle="share_", rows=len(profiles), screenshot=shot)
    for r in profiles:
        on_screen(seen, r.info.run_id, ui_view.column("params", "experiment.concurrency"))
        for m in ("decode_step_ms", "share_communication", "share_gemm", "share_moe", "share_attention"):
            shows_number(on_screen(seen, r.info.run_id, ui_view.column("metrics", m)), r.data.metrics[m])
    assert "multirun" not in "".join(x["text"] for x in seen["cells"])  # no collapsed parent row
    _keep(shot)


def test_nccl_burst_link_shows_every_bursts_ms(ui, browser, tmp_path):
    links, _, _, runs = ui
    bursts = [r for r in runs["nccl_burst"] if r.info.status == "FINISHED"]
    assert len(bursts) >= 2
    shot = _shot(tmp_path, "nccl_burst")
    seen = browser.first_screen(links["nccl_burst"], needle="burst_ms", rows=len(bursts), screenshot=shot)
    for r in bursts:
        on_screen(seen, r.info.run_id, ui_view.column("params", "experiment.tokens"))
        shows_number(on_screen(seen, r.info.run_id, ui_view.column("metrics", "burst_ms")), r.data.metrics["burst_ms"])
    _keep(shot)


def test_campaign_links_open_the_same_view_of_the_campaign(ui):
    _, printed, c, _ = ui
    section = printed.split("latest campaign", 1)[1].split("sweeps", 1)[0]
    macro = next(x for x in section.splitlines() if x.strip().startswith("k25exp/macro "))
    assert f"viewStateShareKey={ui_view.CAMPAIGN_KEY}" in macro
    exp = c.get_experiment_by_name("k25exp/macro")
    import json

    view = json.loads(exp.tags[ui_view.TAG_PREFIX + ui_view.CAMPAIGN_KEY])
    assert view["searchFilter"] == f"tags.campaign = 'c-full' and {ui_view.FILTER}"


def _shot(tmp_path: Path, name: str) -> Path:
    return tmp_path / f"mlflow_first_screen_{name}.png"


def _keep(shot: Path) -> None:
    folder = os.environ.get("K25EXP_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)
