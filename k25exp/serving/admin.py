"""The serving runners' calls to a vLLM server besides completions: /reset_prefix_cache,
/metrics scrapes around a level, and waiting for a server to answer or exit after failures.

Every answer is read through k25exp.serving.answers (an HTML page or a bad body is an error
naming the URL); every wait through k25exp.poll.
"""

from __future__ import annotations

from typing import Optional

import httpx

from k25exp.poll import PollTimeout, await_until
from k25exp.serving import server_metrics
from k25exp.serving.answers import json_body, refuse_html, what_came_back
from k25exp.serving.endpoint import Connection
from k25exp.serving.errors import BadAnswer


class NotReset(Exception):
    pass


async def reset_prefix_cache(http: httpx.AsyncClient, state: dict) -> None:
    """POST /reset_prefix_cache, retried while vLLM answers success=false (blocks still held);
    `state` keeps whether it worked and why not (a server without dev mode: no more tries)."""
    if state.get("reset") is False:
        return

    async def reset() -> bool:
        r = await http.post("/reset_prefix_cache")
        if r.status_code != 200:
            raise NotReset(f"HTTP {r.status_code} (vLLM needs VLLM_SERVER_DEV_MODE=1)")
        refuse_html(r, "vLLM's JSON {'success': bool}")
        if not r.content.strip():
            return True  # older vLLM: an empty 200
        body = json_body(r, "vLLM's JSON {'success': bool}")
        return not isinstance(body, dict) or bool(body.get("success", True))

    try:
        state["reset"] = await await_until(reset, None, 0.2, "POST /reset_prefix_cache",
                                           attempts=10)
    except httpx.HTTPError as e:
        state.update(reset=False, why=f"{type(e).__name__}: {e}")
    except NotReset as e:
        state.update(reset=False, why=str(e))
    except PollTimeout:
        state.update(reset=False, why="the server kept answering success=false")


async def scrape(http: httpx.AsyncClient, model: str) -> Optional[dict]:
    try:
        r = await http.get("/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    refuse_html(r, "Prometheus text")
    try:
        return server_metrics.parse(r.text, model)
    except ValueError as e:
        raise BadAnswer(f"GET {r.request.url}: expected Prometheus text ({e}), got "
                        f"{what_came_back(r)}") from None


async def server_view(http, model, before, completed) -> tuple[dict, dict]:
    """Scrapes /metrics until the level's requests are all counted (they are recorded as
    they finish, just after the client saw the last chunk), 2 s at most."""
    if before is None:
        return {}, {}
    view: dict = {}

    async def counted() -> bool:
        after = await scrape(http, model)
        view["figs"] = server_metrics.level_means(before, after) if after is not None else ({}, {})
        return after is None or view["figs"][0].get("server_requests", 0) >= completed

    await await_until(counted, 2.0, 0.1, "the server's count of the level", raise_timeout=False)
    return view["figs"]


async def settle(http: httpx.AsyncClient, conn: Connection, timeout_s: float = 10.0) -> None:
    """After failed requests: waits until the launched server either answers /health or has
    exited, so a crash is reported as one even when the level ended a moment before the
    process did."""
    async def settled() -> bool:
        if not conn.alive():
            return True
        return (await http.get("/health", timeout=2.0)).status_code == 200

    await await_until(settled, timeout_s, 0.2, "the server to answer or exit",
                      retry_on=(httpx.HTTPError,), raise_timeout=False)
