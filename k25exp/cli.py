"""The `k25exp` command: Hydra jobs by default, a few helper subcommands by name.

    k25exp experiment=nccl_burst [key=value ...]     # same as python -m k25exp ...
    k25exp -m experiment=nccl_burst experiment.tokens=1,8,64
    k25exp ui [--port 5000|0] [--workers 1] [--links-only]  # MLflow UI on the default store, direct links
    k25exp sync PATH... [--uri URI]                  # upload offline runs (tracking=offline)
    k25exp recover [--uri URI] [--dry-run]           # end runs of jobs killed hard, KILLED
    k25exp analyze TRACE... [--json] [--out DIR]     # decode-step breakdown of profiler traces
    k25exp analyze TRACE --tail RUN_FOLDER [--tail-above-ms MS]  # + its run's ITL tail by cause
    k25exp make-model [model=tiny_kimi] [seed=0]     # the embedded model (macro's default)
    k25exp make-model model=kimi_k25_int4 model.tp_rank_of=8   # one TP-8 rank, config only
    k25exp compare A B [--fail-on PCT]               # two runs / sweeps / campaigns, with significance
"""

from __future__ import annotations

import sys


# Each subcommand's module owns its parser and its main(args) -> exit status (imported only
# when that subcommand runs, so `k25exp experiment=...` pays for none of them).
SUBCOMMANDS = {"ui": "k25exp.commands.ui", "sync": "k25exp.commands.sync",
               "recover": "k25exp.commands.recover", "analyze": "k25exp.commands.analyze",
               "make-model": "k25exp.commands.make_model", "compare": "k25exp.compare.command"}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        import importlib

        sys.exit(importlib.import_module(SUBCOMMANDS[sys.argv[1]]).main(sys.argv[2:]))
    if len(sys.argv) > 1 and (word := sys.argv[1]) and "=" not in word and word[0] not in "-~":
        # Hydra reads a bare word as a broken override (and with --help, as a traceback)
        print(f"k25exp: {word!r} is neither a subcommand ({', '.join(SUBCOMMANDS)}) nor a "
              "key=value override (the report is experiment=report)", file=sys.stderr)
        sys.exit(2)
    from k25exp.config.scope import missing_part_error

    if why := missing_part_error(sys.argv[1:]):  # server.port=1 on an experiment with no server
        print(f"k25exp: {why}", file=sys.stderr)
        sys.exit(2)
    from k25exp import job
    from k25exp.app import hydra_main

    from k25exp.tracking import hydra_callback

    hydra_main()
    # Jobs may have run in other processes (parallel launchers): the sweep's own tally wins.
    failed = max(job.failed_jobs, hydra_callback.last_sweep_failed or 0)
    if failed:
        print(f"k25exp: {failed} job(s) failed", file=sys.stderr)
        sys.exit(1)
