"""The two forms of a simple-repository project page, parsed: JSON (PEP 691) and HTML (PEP 503).

Apart from ``indexes`` so that every command's start-up, which imports ``indexes`` for its
``--index-url`` option, does not import the HTML parser and URL handling it rarely needs.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from html.parser import HTMLParser

from vllm_overlay.upstream.index_entry import IndexEntry, IndexReadError


def parse_json(body: bytes, base: str, url: str) -> list[IndexEntry]:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise IndexReadError(f"the package index at {url} sent malformed JSON: {exc}") from exc
    return [
        IndexEntry(
            filename=item["filename"],
            url=urllib.parse.urljoin(base, item["url"]),
            sha256=item.get("hashes", {}).get("sha256", ""),
            size=item.get("size"),
            upload_time=item.get("upload-time"),
        )
        for item in data.get("files", [])
    ]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.hrefs.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_html(text: str, base: str) -> list[IndexEntry]:
    links = _Links()
    links.feed(text)
    entries = []
    for href, label in links.hrefs:
        absolute = urllib.parse.urljoin(base, href)
        parsed = urllib.parse.urlparse(absolute)
        match = re.search(r"(?:^|&)sha256=([0-9a-fA-F]{64})", parsed.fragment)
        filename = label or urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        entries.append(
            IndexEntry(
                filename=filename,
                url=parsed._replace(fragment="").geturl(),
                sha256=match.group(1).lower() if match else "",
                size=None,
                upload_time=None,
            )
        )
    return entries
