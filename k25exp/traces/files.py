"""The trace files a list of paths names: files as given, folders searched for traces."""

from __future__ import annotations

from pathlib import Path

TRACE_GLOB = "*.pt.trace.json*"   # torch.profiler's tensorboard_trace_handler names


def trace_files(paths: list[str | Path], glob: str = TRACE_GLOB) -> list[Path]:
    """Files as given; folders searched recursively for `glob`, skipping vLLM's front-end
    (async_llm) traces, which hold no model work. A path that does not exist is an error."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.rglob(glob) if "async_llm" not in x.name)
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p} does not exist (expected a trace file or a folder of "
                                    f"{glob} files)")
    return out
