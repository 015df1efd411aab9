"""Load a page in headless Chromium over the DevTools protocol and say what a user would see:
the images (loaded, natural width) and every console error or uncaught exception.

Chromium (Debian: `apt-get install chromium`) and the `websockets` package are needed;
`chromium_path()` is None without the browser, so tests can skip saying why.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional


def chromium_path() -> Optional[str]:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def load(page: Path, timeout_s: float = 30.0) -> dict:
    """{"title", "images": [[complete, naturalWidth, alt]], "errors": [..], "text": body text}"""
    from websockets.sync.client import connect

    exe = chromium_path()
    with tempfile.TemporaryDirectory(prefix="k25exp-chromium-") as profile:
        proc = subprocess.Popen([exe, "--headless=new", "--no-sandbox", "--disable-gpu",
                                 "--remote-debugging-port=0", f"--user-data-dir={profile}",
                                 "--no-first-run", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            ws_url = _devtools_url(proc, timeout_s)
            with connect(ws_url, max_size=None, open_timeout=timeout_s) as ws:
                return _drive(ws, page.resolve().as_uri(), timeout_s)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


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


def _drive(ws, url: str, timeout_s: float) -> dict:
    ids = iter(range(1, 10**6))
    events: list[dict] = []

    def call(method: str, params: dict | None = None, session: str | None = None) -> dict:
        i = next(ids)
        msg = {"id": i, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        ws.send(json.dumps(msg))
        while True:
            m = json.loads(ws.recv(timeout=timeout_s))
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            events.append(m)

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
          " images: Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt])})")
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
    return out
