"""The package indexes the tool reads releases from: pip's own configuration, never a built-in host.

A team behind a corporate mirror has already told pip where its index is (``PIP_INDEX_URL``,
``pip.conf``, ``--extra-index-url`` lines); the tool asks pip's own option parser for the same
answer pip install would use, so the two never disagree. ``--index-url`` on the commands that
download (or ``$VLLM_OVERLAY_INDEX_URL``) overrides it and disables the extra indexes.

Indexes are read through the simple repository API: the JSON form (PEP 691) where the server
offers it, the HTML form (PEP 503) otherwise, which is what a directory of files served over
``file://`` or a plain web server gives. Every file keeps the sha256 its index states.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "VLLM_OVERLAY_INDEX_URL"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"

_override: str | None = None


class IndexReadError(RuntimeError):
    """No configured index could be read."""


@dataclass(frozen=True)
class IndexEntry:
    """One file as an index lists it."""

    filename: str
    url: str
    sha256: str
    size: int | None
    upload_time: str | None


def set_override(url: str | None) -> None:
    """Use this index only (the commands' ``--index-url``)."""
    global _override
    _override = url.rstrip("/") if url else None


def configured() -> list[str]:
    """The indexes to read, first one first: the override, else pip's index and extra indexes."""
    override = _override or os.environ.get(ENV_VAR)
    if override:
        return [override.rstrip("/")]
    return [url.rstrip("/") for url in _pip_indexes()]


def _pip_options() -> object:
    # pip's option parser merges PIP_* variables, every pip.conf and pip's default index exactly
    # as `pip download` would; its internal module is the only API pip offers for that.
    from pip._internal.commands import create_command

    options, _ = create_command("download").parse_args([])
    return options


def _pip_indexes() -> list[str]:
    options = _pip_options()
    urls = [options.index_url] if not options.no_index else []
    return [*urls, *options.extra_index_urls]


def pip_cert() -> str | None:
    """The CA bundle pip is configured to trust (``cert``: PIP_CERT, pip.conf), None if pip's own."""
    return _pip_options().cert or None


class ProjectFiles(list[IndexEntry]):
    """The files the configured indexes list, and what each index that could not be read said."""

    def __init__(self, entries: list[IndexEntry], unreachable: list[str]) -> None:
        super().__init__(entries)
        self.unreachable = unreachable


def project_files(project: str) -> ProjectFiles:
    """Every file any configured index lists for a project (the first index wins on a name).

    An index that cannot be read is not silence: with nothing listed anywhere its error is raised
    (even when another index answered with an empty page), and otherwise it travels with the
    result (``unreachable``) so a "not found" can say where it could not look.
    """
    seen: dict[str, IndexEntry] = {}
    errors: list[str] = []
    indexes = configured()
    for index in indexes:
        try:
            entries = _read_project_page(index, project)
        except IndexReadError as exc:
            errors.append(str(exc))
            continue
        for entry in entries:
            seen.setdefault(entry.filename, entry)
    if not seen and errors:
        raise IndexReadError("; ".join(errors))
    return ProjectFiles(list(seen.values()), errors)


def _read_project_page(index: str, project: str) -> list[IndexEntry]:
    # Imported here: every command's start-up imports this module (for --index-url), few read an index.
    import urllib.error
    import urllib.request

    from packaging.utils import canonicalize_name

    from vllm_overlay import index_pages

    url = f"{index}/{canonicalize_name(project)}/"
    if url.startswith("file:"):
        return _read_file_page(url)
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
            content_type = response.headers.get_content_type()
            final_url = response.geturl()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise IndexReadError(f"cannot read the package index at {url}: {exc}") from exc
    except (urllib.error.URLError, TimeoutError) as exc:
        raise IndexReadError(f"cannot read the package index at {url}: {exc}") from exc
    if content_type == JSON_TYPE:
        return index_pages.parse_json(body, final_url, url)
    return index_pages.parse_html(body.decode("utf-8", errors="replace"), final_url)


def _read_file_page(url: str) -> list[IndexEntry]:
    import urllib.parse
    import urllib.request

    from vllm_overlay import index_pages

    path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    page = path / "index.html"
    if not page.is_file():
        return []
    return index_pages.parse_html(page.read_text(encoding="utf-8", errors="replace"), page.as_uri())


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--index-url`` for the commands that download releases (cli.main applies it)."""
    parser.add_argument(
        "--index-url",
        default=None,
        metavar="URL",
        help=f"package index to read releases from, instead of pip's configured index and extra indexes "
        f"(also ${ENV_VAR}); default: what pip's configuration names",
    )


def pip_arguments() -> list[str]:
    """Arguments that make a pip install read the same index as the tool, when one was forced."""
    override = _override or os.environ.get(ENV_VAR)
    return ["--index-url", override] if override else []
