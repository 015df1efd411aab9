"""`k25exp analyze TRACE...`: the decode-step breakdown of torch.profiler traces.

`--tail RUN_FOLDER` joins the profiled requests of a profile run's folder (its requests.jsonl
and clock.json) to the traces and prints the ITL tail by cause, as the profile runner does
(k25exp.runners.profile_tail): for a trace fetched after its run, or one read again by a
newer analysis. With `--out`, its files go to out/tail/.
"""

from __future__ import annotations

import sys


def main(args: list[str]) -> int:
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="k25exp analyze",
                                description="Where each decode step's time goes, from torch.profiler "
                                            "traces (one per rank, .json or .json.gz).")
    p.add_argument("traces", nargs="+", type=Path, help="trace files, or folders to search")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--rules", type=Path, help="classification rules YAML (default: conf/trace_rules/default.yaml)")
    p.add_argument("--max-steps", type=int, help="analyse only the first N decode steps per rank")
    p.add_argument("--out", type=Path, help="also write tables, plots and JSON into this folder")
    p.add_argument("--top", type=int, default=30, help="rows of the top-kernels table")
    p.add_argument("--tail", type=Path, metavar="RUN_FOLDER",
                   help="a profile run's folder (requests.jsonl, clock.json): also the ITL tail "
                        "by cause of its profiled requests")
    p.add_argument("--tail-above-ms", type=float, metavar="MS",
                   help="with --tail: the tail is the gaps above MS (an ITL SLO), not the p99")
    a = p.parse_args(args)
    # k25exp.traces alone: the runners' package would add Hydra and HTTP clients to every
    # start (a third of it, measured by benchmarks/analyze_cli_bench.py)
    from k25exp.traces import RulesError, TraceError, analyze, summary_text, write_outputs
    from k25exp.traces.files import trace_files

    try:
        paths = trace_files(a.traces)
        if not paths:
            raise FileNotFoundError(f"no trace found in {', '.join(map(str, a.traces))}")
        analysis = analyze(paths, rules_path=a.rules, max_steps=a.max_steps)
    except (TraceError, RulesError, FileNotFoundError) as e:
        print(f"k25exp analyze: {e}", file=sys.stderr)
        return 2
    if a.out:
        write_outputs(analysis, a.out, top=a.top)
    tail: dict[str, float] = {}
    if a.tail is not None:
        from k25exp.runners.profile_tail import profiled_records, read_clock, tail_of
        from k25exp.tracking.recorder import MemoryRecorder

        try:
            records, clock = profiled_records(a.tail), read_clock(a.tail)
        except (OSError, ValueError, KeyError) as e:
            print(f"k25exp analyze: --tail {a.tail}: {e} (expected a profile run's folder with "
                  "requests.jsonl and clock.json)", file=sys.stderr)
            return 2
        rec = MemoryRecorder()
        # --out holds the breakdown written just above (its steps_<rank>.csv): what grew in
        # each tail gap's step
        tail = tail_of(paths, records, clock, a.out, rec, quiet=a.json,
                       threshold_ms=a.tail_above_ms, breakdown=a.out)
        if not tail:
            print(f"k25exp analyze: no ITL tail: {rec.tags.get('tail.skipped', '?')}", file=sys.stderr)
            return 2
    if a.json:
        print(json.dumps({**analysis.to_dict(top=a.top), **({"tail": tail} if tail else {})}, indent=1))
    else:
        print(summary_text(analysis))  # warnings included
    return 0
