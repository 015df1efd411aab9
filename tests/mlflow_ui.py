"""`k25exp ui` started for a test: on a free port, its output kept, stopped afterwards.

A port picked free can be taken by another process (another test's server or client) before
MLflow's server binds it, seconds later; `k25exp ui` then stops saying so, and the start is
tried again on another port. Any other early exit fails with the UI's whole output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

import httpx

from k25exp.poll import wait_until
from tests.conftest import ROOT

TRIES = 3
PORT_TAKEN = ("address already in use", "is in use")


class UiExited(Exception):
    pass


class UiProcess:
    """One `k25exp ui --port 0` process; `printed` grows as it prints (a reader thread)."""

    def __init__(self, uri: str, *extra: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "k25exp", "ui", "--port", "0", "--uri", uri, *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def printed(self) -> str:
        return "".join(self.lines)

    @property
    def port(self) -> int | None:
        m = re.search(r"mlflow ui .*--port (\d+)", self.printed)
        return int(m.group(1)) if m else None

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise UiExited
        if self.port is None:
            return False
        return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self.reader.join(timeout=5)


@contextmanager
def running_ui(uri: str, *extra: str) -> Iterator[UiProcess]:
    """A `k25exp ui` answering /health on the store `uri`; stopped (its process group) after."""
    for attempt in range(1, TRIES + 1):
        ui = UiProcess(uri, *extra)
        try:
            wait_until(ui.up, 120, 0.5, "MLflow UI answering /health", retry_on=(httpx.HTTPError,))
            break
        except UiExited:
            ui.stop()
            if attempt < TRIES and any(s in ui.printed for s in PORT_TAKEN):
                continue
            raise AssertionError(f"k25exp ui exited ({ui.proc.returncode}) before its UI answered; "
                                 f"it printed:\n{ui.printed[-4000:]}") from None
        except Exception as e:
            ui.stop()
            raise AssertionError(f"k25exp ui did not answer ({e}); it printed:\n"
                                 f"{ui.printed[-4000:]}") from None
    try:
        yield ui
    finally:
        ui.stop()
