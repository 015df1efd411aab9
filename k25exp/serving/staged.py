"""A generated folder put in place whole: written into a sibling temporary folder, then
renamed over the target, so a reader never sees half a model (another process, a killed job)."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """Yields an empty temporary folder beside `out`; on success it replaces `out`, on any
    error it is removed and `out` is left as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
