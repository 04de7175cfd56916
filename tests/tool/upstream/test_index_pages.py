"""A project page of a simple repository, parsed in both forms (the reading of indexes over
file:// and HTTP is test_indexes.py's)."""

from __future__ import annotations

import json
import re

import pytest

from vllm_overlay.upstream import index_pages
from vllm_overlay.upstream.indexes import IndexEntry, IndexReadError

SHA = "ab" * 32


def test_an_html_page_gives_each_link_its_file_name_absolute_url_and_stated_sha256():
    page = (
        "<html><body>"
        f'<a href="../../files/vllm-0.33.0.tar.gz#sha256={SHA.upper()}">vllm-0.33.0.tar.gz</a>'
        '<a href="https://other.invalid/x/vllm-0.32.0.tar.gz#md5=00"></a>'
        "</body></html>"
    )
    entries = index_pages.parse_html(page, "https://index.invalid/simple/vllm/")
    assert entries == [
        IndexEntry("vllm-0.33.0.tar.gz", "https://index.invalid/files/vllm-0.33.0.tar.gz", SHA, None, None),
        # No text: the name is the URL's last segment; a fragment without sha256 states none.
        IndexEntry("vllm-0.32.0.tar.gz", "https://other.invalid/x/vllm-0.32.0.tar.gz", "", None, None),
    ]


def test_a_json_page_keeps_size_and_upload_time():
    body = {
        "files": [
            {
                "filename": "vllm-0.33.0.tar.gz",
                "url": "../../files/vllm-0.33.0.tar.gz",
                "hashes": {"sha256": SHA},
                "size": 123,
                "upload-time": "2026-11-20T10:00:00Z",
            },
            {"filename": "vllm-0.32.0.tar.gz", "url": "https://other.invalid/vllm-0.32.0.tar.gz", "hashes": {}},
        ]
    }
    entries = index_pages.parse_json(json.dumps(body).encode(), "https://index.invalid/simple/vllm/", "u")
    assert entries == [
        IndexEntry(
            "vllm-0.33.0.tar.gz",
            "https://index.invalid/files/vllm-0.33.0.tar.gz",
            SHA,
            123,
            "2026-11-20T10:00:00Z",
        ),
        IndexEntry("vllm-0.32.0.tar.gz", "https://other.invalid/vllm-0.32.0.tar.gz", "", None, None),
    ]


def test_malformed_json_names_the_index():
    url = "https://index.invalid/simple/vllm/"
    with pytest.raises(IndexReadError, match=re.escape(f"the package index at {url} sent malformed JSON")):
        index_pages.parse_json(b"{not json", url, url)
