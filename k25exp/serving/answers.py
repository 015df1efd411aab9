"""Guarded reading of what a server answers: a proxy's HTML page, a login form or a truncated
body becomes a BadAnswer naming the URL and what came back, never a bare JSONDecodeError."""

from __future__ import annotations

import json
from typing import Any

import httpx

from k25exp.serving.errors import BadAnswer

SHOWN_CHARS = 200


def what_came_back(r: httpx.Response) -> str:
    """'HTTP 200, content-type text/html: <first 200 chars>'."""
    try:
        text = r.text
    except (httpx.ResponseNotRead, httpx.StreamError):
        text = "(body not read)"
    ct = r.headers.get("content-type", "none")
    return f"HTTP {r.status_code}, content-type {ct}: {text[:SHOWN_CHARS]!r}"


def json_body(r: httpx.Response, expected: str = "a JSON object") -> Any:
    try:
        return r.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadAnswer(f"{r.request.method} {r.request.url}: expected {expected}, got "
                        f"{what_came_back(r)}") from None


def model_ids(r: httpx.Response) -> list[str]:
    """The served names in a 200 answer of GET /v1/models ({'data': [{'id': ...}, ...]})."""
    shape = "JSON {'data': [{'id': ...}]}"
    body = json_body(r, shape)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise BadAnswer(f"GET {r.request.url}: expected {shape}, got {what_came_back(r)}")
    return [m.get("id") for m in data]


def is_html(r: httpx.Response) -> bool:
    return "html" in r.headers.get("content-type", "").lower()


def refuse_html(r: httpx.Response, expected: str) -> None:
    if is_html(r):
        raise BadAnswer(f"{r.request.method} {r.request.url}: expected {expected}, got "
                        f"{what_came_back(r)}")
