"""Load a page in headless Chromium over the DevTools protocol and say what a user would see:
the images (loaded, natural width) and every console error or uncaught exception.

Chromium (Debian: `apt-get install chromium`) and the `websockets` package are needed;
`chromium_path()` is None without the browser, so tests can skip saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional


def chromium_path() -> Optional[str]:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class Chromium:
    """One headless Chromium for several pages (each in a fresh tab): `with Chromium() as b:
    b.load(page)`."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s

    def __enter__(self) -> "Chromium":
        from websockets.sync.client import connect

        # ignore_cleanup_errors: a helper process outside the group (crashpad) may still write
        # there; the folder is the test's scratch, not its subject
        self._profile = tempfile.TemporaryDirectory(prefix="k25exp-chromium-", ignore_cleanup_errors=True)
        self._proc = subprocess.Popen([chromium_path(), "--headless=new", "--no-sandbox", "--disable-gpu",
                                       "--remote-debugging-port=0", f"--user-data-dir={self._profile.name}",
                                       "--no-first-run", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)  # its helpers stop with it
        try:
            self._conn = connect(_devtools_url(self._proc, self.timeout_s), max_size=None,
                                 open_timeout=self.timeout_s)
            self._ws = self._conn.__enter__()  # websockets 17 wants it used as a context manager
        except BaseException:
            self._stop()
            raise
        return self

    def load(self, page: Path) -> dict:
        return _drive(self._ws, page.resolve().as_uri(), self.timeout_s)

    def text_when(self, url: str, needle: str, timeout_s: float = 60.0,
                  columns: tuple[str, ...] = ()) -> tuple[str, dict[str, float]]:
        """The page's visible text once it contains `needle` (a single-page app renders after
        its load event), and for each of `columns` the left edge (px) of the leftmost element
        whose own text starts with it (-1: none): where a user sees it, whatever the DOM order.
        TimeoutError with what it showed otherwise."""
        return _poll_text(self._ws, url, needle, timeout_s, columns)

    def first_screen(self, url: str, needle: str, rows: int = 1, width: int = 1600, height: int = 1000,
                     timeout_s: float = 90.0, screenshot: Optional[Path] = None) -> dict:
        """What a browser window of width × height shows of MLflow's runs table without a
        click or a scroll, once the page shows `needle` and at least `rows` table rows:
        {"text", "viewport" (the table body's box), "cells": [{"row" (run id), "col" (MLflow's
        column id), "text", "left", "right", "top", "bottom", "inner" (content width),
        "text_width" (px the text needs)}]}; a PNG of the screen to `screenshot` when given."""
        return _first_screen(self._ws, url, needle, rows, width, height, timeout_s, screenshot)

    def __exit__(self, *exc) -> None:
        self._conn.__exit__(None, None, None)
        self._stop()

    def _stop(self) -> None:
        """The browser and its helper processes (zygote, renderers), then its profile folder:
        a helper still writing there made the folder's removal fail ("Directory not empty")."""
        from k25exp.poll import wait_until

        _signal_group(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            _signal_group(self._proc.pid, signal.SIGKILL)
            self._proc.wait(10)
        if not wait_until(lambda: not _signal_group(self._proc.pid, 0), 10, 0.1, "Chromium's helpers gone",
                          raise_timeout=False):
            _signal_group(self._proc.pid, signal.SIGKILL)
        self._profile.cleanup()


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False once no process is left in it."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def load(page: Path, timeout_s: float = 30.0) -> dict:
    """{"title", "images": [[complete, naturalWidth, alt]], "links": [href], "errors": [..],
    "text": body text}"""
    with Chromium(timeout_s) as b:
        return b.load(page)


def _devtools_url(proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:
            return m.group(1)
    raise RuntimeError("chromium did not open its DevTools port: " + "".join(seen)[-2000:])


_ids = iter(range(1, 10**9))  # DevTools message ids, unique over the connection


def _caller(ws, events: list, timeout_s: float):
    """call(method, params, session) -> result over the DevTools websocket; other messages
    that arrive meanwhile (events) are appended to `events`."""
    def call(method: str, params: dict | None = None, session: str | None = None) -> dict:
        i = next(_ids)
        msg = {"id": i, "method": method, "params": params or {}, **({"sessionId": session} if session else {})}
        ws.send(json.dumps(msg))
        while True:
            m = json.loads(ws.recv(timeout=timeout_s))
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            events.append(m)
    return call


def _drive(ws, url: str, timeout_s: float) -> dict:
    events: list[dict] = []
    call = _caller(ws, events, timeout_s)

    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        call(f"{domain}.enable", session=session)
    call("Page.navigate", {"url": url}, session=session)
    deadline = time.monotonic() + timeout_s
    while not any(e.get("method") == "Page.loadEventFired" for e in events):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not finish loading in {timeout_s:g} s")
        events.append(json.loads(ws.recv(timeout=timeout_s)))
    js = ("JSON.stringify({title: document.title, text: document.body.innerText,"
          " images: Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt]),"
          " links: Array.from(document.links).map(a => a.href)})")
    res = call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session=session)
    out = json.loads(res["result"]["value"])
    errors = []
    for e in events:
        p = e.get("params", {})
        if e.get("method") == "Runtime.exceptionThrown":
            errors.append(p["exceptionDetails"].get("text", "exception"))
        elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
            errors.append(p["entry"]["text"])
    out["errors"] = errors
    call("Target.closeTarget", {"targetId": target})
    return out


_LEFT_EDGES = """(prefixes => Object.fromEntries(prefixes.map(p => {
  const xs = Array.from(document.querySelectorAll('body *'))
    .filter(e => e.children.length === 0 && (e.textContent || '').trim().startsWith(p))
    .map(e => e.getBoundingClientRect()).filter(r => r.width > 0).map(r => r.left);
  return [p, xs.length ? Math.min(...xs) : -1];
})))"""


def _poll_text(ws, url: str, needle: str, timeout_s: float, columns=()) -> tuple[str, dict]:
    call = _caller(ws, [], timeout_s)

    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    call("Emulation.setDeviceMetricsOverride", {"width": 1600, "height": 900, "deviceScaleFactor": 1,
                                                "mobile": False}, session=session)
    call("Page.navigate", {"url": url}, session=session)
    deadline, text = time.monotonic() + timeout_s, ""
    try:
        while time.monotonic() < deadline:
            res = call("Runtime.evaluate", {"expression": "document.body ? document.body.innerText : ''",
                                            "returnByValue": True}, session=session)
            text = res.get("result", {}).get("value") or ""
            if needle in text:
                js = f"JSON.stringify(({_LEFT_EDGES})({json.dumps(list(columns))}))"
                res = call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session=session)
                return text, json.loads(res["result"]["value"])
            time.sleep(0.5)
        raise TimeoutError(f"{url} never showed {needle!r} in {timeout_s:g} s; it showed:\n{text[-2000:]}")
    finally:
        call("Target.closeTarget", {"targetId": target})


_GRID = """(() => {
  const vp = document.querySelector('.ag-body-viewport');
  const ctx = document.createElement('canvas').getContext('2d');
  const cells = Array.from(document.querySelectorAll('.ag-row .ag-cell')).map(c => {
    const r = c.getBoundingClientRect(), cs = getComputedStyle(c);
    ctx.font = cs.font;
    const text = (c.innerText || '').trim();
    return {row: c.closest('.ag-row').getAttribute('row-id'), col: c.getAttribute('col-id'), text,
            left: r.left, right: r.right, top: r.top, bottom: r.bottom,
            inner: r.width - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight),
            text_width: ctx.measureText(text).width};
  });
  const b = vp ? vp.getBoundingClientRect() : null;
  return JSON.stringify({text: document.body.innerText, cells,
                         viewport: b && {left: b.left, right: b.right, top: b.top, bottom: b.bottom}});
})()"""


def _first_screen(ws, url: str, needle: str, rows: int, width: int, height: int, timeout_s: float,
                  screenshot: Optional[Path]) -> dict:
    call = _caller(ws, [], timeout_s)
    target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                "mobile": False}, session=session)
    call("Page.navigate", {"url": url}, session=session)
    deadline, seen = time.monotonic() + timeout_s, {}
    try:
        while time.monotonic() < deadline:
            res = call("Runtime.evaluate", {"expression": _GRID, "returnByValue": True}, session=session)
            seen = json.loads(res.get("result", {}).get("value") or "{}")
            if needle in seen.get("text", "") and len({c["row"] for c in seen.get("cells", [])}) >= rows:
                time.sleep(1.5)  # columns sized and rows settled
                res = call("Runtime.evaluate", {"expression": _GRID, "returnByValue": True}, session=session)
                seen = json.loads(res["result"]["value"])
                if screenshot is not None:
                    import base64

                    png = call("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
                    screenshot.write_bytes(base64.b64decode(png))
                return seen
            time.sleep(0.5)
        raise TimeoutError(f"{url} never showed {needle!r} and {rows} rows in {timeout_s:g} s; it showed:\n"
                           + seen.get("text", "")[-2000:])
    finally:
        call("Target.closeTarget", {"targetId": target})
