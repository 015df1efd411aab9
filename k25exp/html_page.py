"""A self-contained HTML page rendered from a Markdown document (markdown-it-py, CommonMark
plus tables): each page is written once, as Markdown, and the HTML follows from it. Images the
Markdown links by a relative path are inlined as base64 data, so the page opens anywhere."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}em{color:#555}
img{max-width:100%}code{background:#f3f3f3;padding:0 .2em}"""

_MD = MarkdownIt("commonmark", {"html": False}).enable("table")  # raw HTML in text stays text
_IMG = re.compile(r'<img src="([^":]+\.png)"')


def render(markdown: str, title: str, folder: Path) -> str:
    """The page: `markdown` as HTML, its relative .png images (under `folder`) inlined."""
    def inline(m: re.Match) -> str:
        data = base64.b64encode((folder / html.unescape(m.group(1))).read_bytes()).decode()
        return f'<img src="data:image/png;base64,{data}"'
    body = _IMG.sub(inline, _MD.render(markdown))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{body}</body></html>\n")
