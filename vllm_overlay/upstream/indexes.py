"""The package indexes the tool reads releases from: pip's own configuration, never a built-in host.

A team behind a corporate mirror has already told pip where its index is (``PIP_INDEX_URL``,
``pip.conf``, ``--extra-index-url`` lines); the tool asks pip's own option parser for the same
answer ``pip install`` would use (``PIP_*`` variables, then the ``[install]`` section over
``[global]`` of pip's configuration files: ``index-url``, ``extra-index-url``, ``no-index``,
``find-links``), so the two never disagree. ``no-index`` reads no index at all, find-links only.
``--index-url`` on the commands that download (or ``$VLLM_OVERLAY_INDEX_URL``) overrides it and
disables the extra indexes and find-links.

Indexes are read through the simple repository API: the JSON form (PEP 691) where the server
offers it, the HTML form (PEP 503) otherwise, which is what a directory of files served over
``file://`` or a plain web server gives. Every file keeps the sha256 its index states.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vllm_overlay.upstream.index_entry import IndexEntry, IndexReadError

ENV_VAR = "VLLM_OVERLAY_INDEX_URL"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"

_override: str | None = None


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


# What --help says the default is (the configuration ``_pip_options`` reads).
PIP_CONFIGURATION = (
    "pip install's configuration: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_NO_INDEX, PIP_FIND_LINKS, then "
    "index-url, extra-index-url, no-index and find-links in the [install] section over [global] of pip's "
    "configuration files (pip config list shows them)"
)


def _pip_options() -> object:
    # pip's option parser merges PIP_* variables, every pip.conf and pip's default index exactly
    # as `pip install` would: the [install] section over [global], the section users set (`pip
    # download` would read [download]). Its internal module is the only API pip offers for that.
    from pip._internal.commands import create_command

    options, _ = create_command("install").parse_args([])
    return options


def _pip_indexes() -> list[str]:
    options = _pip_options()
    if options.no_index:  # as pip install: no index at all, the extra ones included; find-links only
        return []
    return [options.index_url, *options.extra_index_urls]


def find_links() -> list[str]:
    """pip's find-links locations (directories, pages or file: URLs); none when --index-url overrides."""
    if _override or os.environ.get(ENV_VAR):
        return []
    return list(_pip_options().find_links)


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
    links = find_links()
    if not indexes and not links:
        raise IndexReadError(f"no package index to read: {PIP_CONFIGURATION} set no-index and no find-links")
    reads = [(index, _read_project_page) for index in indexes] + [(link, _read_find_links) for link in links]
    for where, read in reads:
        try:
            entries = read(where, project)
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

    from packaging.utils import canonicalize_name

    from vllm_overlay.upstream import index_pages

    url = f"{index}/{canonicalize_name(project)}/"
    if url.startswith("file:"):
        return _read_file_page(url)
    try:
        body, content_type, final_url = _fetch(url, ACCEPT)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise IndexReadError(f"cannot read the package index at {url}: {exc}") from exc
    if content_type == JSON_TYPE:
        return index_pages.parse_json(body, final_url, url)
    return index_pages.parse_html(body.decode("utf-8", errors="replace"), final_url)


def _fetch(url: str, accept: str) -> tuple[bytes, str, str]:
    """(body, content type, final URL) of one page; an HTTP error other than a status is IndexReadError."""
    import urllib.error
    import urllib.request

    from vllm_overlay import transfer

    request = urllib.request.Request(url, headers={"Accept": accept})
    seconds = transfer.deadline_seconds(transfer.PAGE_DEADLINE_S)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = b"".join(transfer.blocks(response, seconds, f"reading {url}"))
            return body, response.headers.get_content_type(), response.geturl()
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, TimeoutError) as exc:
        raise IndexReadError(f"cannot read the package index at {url}: {exc}") from exc


def _read_find_links(location: str, project: str) -> list[IndexEntry]:
    """The files a find-links location offers for ``project``: a directory's files (their sha256
    computed here, as pip trusts what lies there), or the links of an HTML page (local or served)."""
    import urllib.parse
    import urllib.request

    from vllm_overlay.upstream import index_pages

    if location.startswith("file:"):
        location = urllib.request.url2pathname(urllib.parse.urlparse(location).path)
    if "://" in location:
        import urllib.error

        try:
            body, _content_type, final_url = _fetch(location, "text/html")
        except urllib.error.HTTPError as exc:
            raise IndexReadError(f"cannot read pip's find-links {location}: {exc}") from exc
        return index_pages.parse_html(body.decode("utf-8", errors="replace"), final_url)
    path = Path(location)
    if path.is_file():
        return index_pages.parse_html(path.read_text(encoding="utf-8", errors="replace"), path.resolve().as_uri())
    if not path.is_dir():
        raise IndexReadError(f"cannot read pip's find-links {location}: no such directory or page")
    return [
        IndexEntry(file.name, file.resolve().as_uri(), _sha256(file), file.stat().st_size, None)
        for file in sorted(path.iterdir())
        if file.is_file() and _distribution_of(file.name) == _canonical(project)
    ]


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def _distribution_of(filename: str) -> str | None:
    """The canonical project name of an sdist or wheel file name (None: neither)."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[0])
        if filename.endswith((".tar.gz", ".zip")):
            return str(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return None


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_file_page(url: str) -> list[IndexEntry]:
    import urllib.parse
    import urllib.request

    from vllm_overlay.upstream import index_pages

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
        help=f"package index to read releases from, instead of pip's configured index, extra indexes and "
        f"find-links (also ${ENV_VAR}); default: what {PIP_CONFIGURATION} name",
    )


def pip_arguments() -> list[str]:
    """Arguments that make a pip install read the same index as the tool, when one was forced."""
    override = _override or os.environ.get(ENV_VAR)
    return ["--index-url", override] if override else []
