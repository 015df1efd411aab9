"""The all-reduce's bus bandwidth against hardware.link_gbps, on a hand-built sweep whose every
figure is written out here."""

from __future__ import annotations

import pytest

from k25exp.report import link
from k25exp.report.metrics import ALLREDUCE_LINK
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView

PCIE8 = {"hardware.world_size": "8", "hardware.backend": "nccl", "hardware.link_gbps": "63.0",
         "hardware.interconnect": "pcie", "hardware.link_gbps_source": "nominal: PCIe Gen5 x16 spec"}


def sweep(params, time_us):
    """An allreduce_sweep run as its runner logs it: busbw = bytes / t × 2(n − 1)/n, in GB/s."""
    n = int(params["hardware.world_size"])
    busbw = {b: b / (t * 1e-6) / 1e9 * 2 * (n - 1) / n for b, t in time_us.items()}
    return RunView("ar".ljust(32, "0"), "1", "allreduce_sweep", "FINISHED", 0, params=params,
                   steps={"time_us": time_us, "busbw_gbps": busbw})


def test_busbw_at_the_largest_size_as_a_share_of_the_link():
    ar = sweep(PCIE8, {1024: 20.0, 1048576: 40.0})
    f = link.collectives(Campaign("c", "uri", [ar])).get(ALLREDUCE_LINK)
    # 1 MiB in 40 µs: algbw 26.2144 GB/s; × 2·7/8 = 45.8752 GB/s busbw; / 63 GB/s = 72.82 %
    assert f.value == pytest.approx(45.8752 / 63.0 * 100)
    assert f.key == "allreduce_busbw_pct_of_link" and f.runs == [ar]
    assert "45.875 GB/s at 1048576 B on 8 ranks" in f.note and "pcie" in f.note


def test_no_link_figure_without_a_link_a_second_rank_or_a_sweep():
    one_rank = sweep({**PCIE8, "hardware.world_size": "1"}, {1024: 5.0})
    assert "one rank" in link.collectives(Campaign("c", "uri", [one_rank])).figures[0].missing
    no_link = sweep({k: v for k, v in PCIE8.items() if k != "hardware.link_gbps"}, {1024: 5.0})
    assert "hardware.link_gbps" in link.collectives(Campaign("c", "uri", [no_link])).figures[0].missing
    none = link.collectives(Campaign("c", "uri", [])).figures[0]
    assert none.value is None and "allreduce_sweep" in none.missing


def test_the_link_rate_is_labelled_nominal_unless_it_was_measured():
    ar = sweep(PCIE8, {1048576: 40.0})
    sec = link.collectives(Campaign("c", "uri", [ar]))
    f = sec.figures[0]
    assert f.key == "allreduce_busbw_pct_of_link"  # the key never changes with the label
    assert "nominal link rate" in f.label and "nominal: PCIe Gen5 x16 spec" in f.note
    assert sec.tags == {"report.link_gbps_source": "nominal: PCIe Gen5 x16 spec"}
    measured = sweep({**PCIE8, "hardware.link_gbps_source": "measured: p2p copy, 61.8 GB/s"},
                     {1048576: 40.0})
    f = link.collectives(Campaign("c", "uri", [measured])).figures[0]
    assert "measured link rate" in f.label and "measured: p2p copy" in f.note
    # a run from before the source was recorded: nominal, saying so
    old = sweep({k: v for k, v in PCIE8.items() if k != "hardware.link_gbps_source"}, {1048576: 40.0})
    f = link.collectives(Campaign("c", "uri", [old])).figures[0]
    assert "nominal link rate" in f.label and "no hardware.link_gbps_source recorded" in f.note
