"""Collectives against the hardware link: how close the all-reduce gets to the link's rate.

    busbw          the allreduce_sweep run's bus bandwidth at its largest message (nccl-tests:
                   busbw = algbw × 2(n − 1)/n, algbw = bytes / time; logged as busbw_gbps)
    link           hardware.link_gbps from the run's params: GB/s per direction per device,
                   over hardware.interconnect. A config constant, not measured by the run:
                   nominal unless hardware.link_gbps_source says measured; the figure's label,
                   note and the tag report.link_gbps_source say which (k25exp.nominal)
    % of link      100 × busbw / link. Only the largest size is compared: small messages are
                   latency-bound and say nothing about the link's rate
    world size 1   a campaign whose server ran on one rank has no link to measure: the figure
                   is missing as one that needs two or more GPUs (k25exp.report.measured)
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from k25exp import nominal
from k25exp.report import metrics as M
from k25exp.report.figures import Figure, Section, missing
from k25exp.report.measured import needs_gpus, one_rank
from k25exp.report.sources import Campaign
from k25exp.tracking.read import RunView


def collectives(c: Campaign) -> Section:
    sec = Section("Collectives against the link")
    ar = c.latest("allreduce_sweep")
    sec.figures.append(allreduce_link(c, ar))
    if sec.figures[0].value is not None:
        sec.tags["report.link_gbps_source"] = nominal.source_or_default(
            "link_gbps", ar.params.get("hardware.link_gbps_source"))
    return sec


def allreduce_link(c: Campaign, ar: Optional[RunView]) -> Figure:
    if not ar:
        solo = one_rank(c)
        return missing(M.ALLREDUCE_LINK, needs_gpus("an all-reduce sweep over the link", solo)
                       if solo else c.why_missing("allreduce_sweep"))
    busbw = ar.history("busbw_gbps")
    link = ar.param("hardware.link_gbps", float)
    world = ar.param("hardware.world_size", int)
    if not busbw:
        return missing(M.ALLREDUCE_LINK, f"run {ar.short} has no busbw_gbps", [ar])
    if not link:
        return missing(M.ALLREDUCE_LINK, f"run {ar.short} has no hardware.link_gbps", [ar])
    if world is not None and world < 2:  # 2(n − 1)/n = 0: nothing crosses a link
        return missing(M.ALLREDUCE_LINK, f"missing: needs two or more GPUs: run {ar.short} ran "
                       "on one rank, where an all-reduce moves nothing over the link", [ar])
    size = max(busbw)
    interconnect = ar.param("hardware.interconnect", str, "an unnamed interconnect")
    backend = ar.param("hardware.backend")
    source = ar.params.get("hardware.link_gbps_source")
    metric = dataclasses.replace(  # the key stays; the label says what the link rate is
        M.ALLREDUCE_LINK, label=f"{M.ALLREDUCE_LINK.label} ({nominal.kind(source)} link rate)")
    return Figure(metric, 100 * busbw[size] / link, [ar],
                  f"busbw {busbw[size]:.3f} GB/s at {size} B on {world} ranks"
                  f"{f' ({backend})' if backend else ''} against "
                  f"{nominal.describe('link_gbps', link, source)} per direction "
                  f"per device over {interconnect}")
