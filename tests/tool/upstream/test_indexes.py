"""Package indexes come from pip's configuration (or --index-url), and a configured index is used."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import http.server
import json
import re
import tarfile
import threading
from pathlib import Path

import pytest

from tests.tool.helpers.releases import file_index, lock_for, release_archive
from tests.tool.helpers.repos import REPO_ROOT, change_line_20, write_upstream
from vllm_overlay import cli, output
from vllm_overlay.store import Store
from vllm_overlay.upstream import indexes, lock
from vllm_overlay.upstream import trees as upstream_trees


@pytest.fixture(autouse=True)
def isolated_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing of this machine's pip configuration leaks in: only what each test sets."""
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_FIND_LINKS", indexes.ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "pip.conf"
    config.write_text("")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    indexes.set_override(None)
    yield
    indexes.set_override(None)


def test_pip_configuration_decides_the_indexes(monkeypatch, tmp_path):
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = http://127.0.0.1:9/primary\nextra-index-url = file:///srv/extra/simple\n"
    )
    assert indexes.configured() == ["http://127.0.0.1:9/primary", "file:///srv/extra/simple"]
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/from-env/")
    assert indexes.configured()[0] == "http://127.0.0.1:9/from-env"  # pip's own precedence: env over file
    indexes.set_override("http://127.0.0.1:9/override/")
    assert indexes.configured() == ["http://127.0.0.1:9/override"]  # --index-url: that index only


def test_configured_file_index_serves_the_release(monkeypatch, tmp_path, store_env):
    archive = release_archive(tmp_path, "9.9.8")
    monkeypatch.setenv("PIP_INDEX_URL", file_index(tmp_path / "index", archive))
    entry = upstream_trees.sdist_of("vllm", "9.9.8")
    assert entry.sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()
    upstream = upstream_trees.obtain("9.9.8", lock.load(REPO_ROOT / "upstream.lock"), Store())
    assert upstream.kind == "release" and upstream.sha256 == entry.sha256
    assert upstream.origin == entry.url and entry.url.startswith("file:")


class _JsonIndex(http.server.BaseHTTPRequestHandler):
    def __init__(self, *args, archive: Path, **kwargs):
        self.archive = archive
        super().__init__(*args, **kwargs)

    def do_GET(self):
        if self.path == "/simple/vllm/":
            body = json.dumps(
                {
                    "meta": {"api-version": "1.0"},
                    "name": "vllm",
                    "files": [
                        {
                            "filename": self.archive.name,
                            "url": f"/files/{self.archive.name}",
                            "hashes": {"sha256": hashlib.sha256(self.archive.read_bytes()).hexdigest()},
                            "upload-time": "2026-11-02T10:00:00Z",
                        }
                    ],
                }
            ).encode()
            content_type = indexes.JSON_TYPE
        elif self.path == f"/files/{self.archive.name}":
            body, content_type = self.archive.read_bytes(), "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_override_index_over_http_json(tmp_path, store_env):
    archive = release_archive(tmp_path, "9.9.7")
    server = http.server.HTTPServer(("127.0.0.1", 0), functools.partial(_JsonIndex, archive=archive))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        indexes.set_override(f"http://127.0.0.1:{server.server_port}/simple")
        assert upstream_trees.release_dates("vllm") == {"9.9.7": dt.date(2026, 11, 2)}
        upstream = upstream_trees.obtain("9.9.7", lock.load(REPO_ROOT / "upstream.lock"), Store())
        assert upstream.origin == f"http://127.0.0.1:{server.server_port}/files/{archive.name}"
    finally:
        server.shutdown()


def test_unreadable_index_is_a_clear_error(tmp_path):
    indexes.set_override("http://127.0.0.1:9/simple")  # port 9 (discard): connection refused
    with pytest.raises(
        upstream_trees.SourceError, match=re.escape("cannot read the package index at http://127.0.0.1:9/simple/vllm/")
    ):
        upstream_trees.release_files("vllm", "0.33.0")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://alice:s3cret-token@index.example.invalid/simple", "https://alice:****@index.example.invalid/simple"),
        ("https://s3cret-token@index.example.invalid/simple", "https://****@index.example.invalid/simple"),
        ("https://index.example.invalid/simple", "https://index.example.invalid/simple"),
        ("file:///srv/index", "file:///srv/index"),
    ],
)
def test_credentials_of_a_url_are_masked_as_pip_masks_them(url, shown):
    assert output.redact_credentials(f"cannot read {url}: refused") == f"cannot read {shown}: refused"


def test_a_failing_index_with_a_token_never_prints_the_token(
    project, make_patch, upstream_dir, store_env, capsys, tmp_path
):
    """The index pip is configured with may carry user:token: an error must name the host, not the secret."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    index = "http://alice:s3cret-token@127.0.0.1:9/simple"  # port 9 (discard): nothing listens
    report = tmp_path / "report.json"
    code = cli.main(
        [
            "apply-patches",
            "--project",
            str(project),
            "--upstream",
            "0.32.0",
            "--index-url",
            index,
            "--json",
            str(report),
        ]
    )
    captured = capsys.readouterr()
    assert code == 2
    assert "s3cret-token" not in captured.out + captured.err
    assert "alice:****@127.0.0.1:9" in captured.err


@pytest.mark.parametrize(
    ("version", "commit", "says"),
    [
        ("9.9.9", "g0000000", "commit 'g0000000', but the sdist's vllm/_version.py says 'gdeadbeef'"),
        ("9.9.8", "gdeadbeef", "version '9.9.8', but the sdist's vllm/_version.py says '9.9.9'"),
    ],
)
def test_a_lock_that_says_otherwise_than_its_release_is_refused(
    monkeypatch, tmp_path, store_env, version, commit, says
):
    """The lock's version and commit land in labels, manifest and SBOM: they must be what the sdist records."""
    archive = release_archive(tmp_path, version)  # its vllm/_version.py: 9.9.9, gdeadbeef
    monkeypatch.setenv("PIP_INDEX_URL", file_index(tmp_path / "index", archive))
    with pytest.raises(upstream_trees.SourceError, match=re.escape(says)):
        upstream_trees.obtain(None, lock_for(archive, version, commit), Store())


def test_a_lock_that_matches_its_release_is_accepted(monkeypatch, tmp_path, store_env):
    archive = release_archive(tmp_path, "9.9.9")
    monkeypatch.setenv("PIP_INDEX_URL", file_index(tmp_path / "index", archive))
    upstream = upstream_trees.obtain(None, lock_for(archive, "9.9.9", "gdeadbeef"), Store())
    assert upstream.kind == "locked" and upstream.release_commit == "gdeadbeef"


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ('commit = "g4ba787ec9"', 'commit = "g4ba787ec9"\ncomit = "x"', "'comit' in [upstream]"),
        ("[pins]", "[pin]", "'pin' at the top level"),
        ('sha256 = "f4c3', 'sha265 = "x"\nsha256 = "f4c3', "'sha265' in [artifacts.sdist]"),
        (
            "[artifacts.sdist]",
            "[artifacts.sdist-x]\nfilename = 'a'\nsha256 = 'b'\n\n[artifacts.sdist]",
            "'sdist-x' in [artifacts]",
        ),
    ],
)
def test_unknown_or_misspelt_lock_keys_are_errors(old, new, where):
    text = (REPO_ROOT / "upstream.lock").read_text().replace(old, new, 1)
    with pytest.raises(lock.LockError, match=re.escape(f"unknown key {where}")):
        lock.parse(text)


def test_a_full_cache_while_the_sdist_is_unpacked_is_exit_2_naming_the_space(
    monkeypatch, tmp_path, project, make_patch, upstream_dir, capsys
):
    """The cache's file system fills up during the unpack: the documented exit 2, where and how much."""
    import subprocess

    cache = tmp_path / "small-cache"
    cache.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(cache)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(cache))
        make_patch(upstream_dir, change_line_20, "core: change line 20")
        tree = write_upstream(tmp_path / "src" / "vllm-9.9.8")
        (tree / "vllm" / "weights.bin").write_bytes(b"\0" * (16 * 2**20))  # 16 MiB unpacked, a few KiB packed
        archive = tmp_path / "vllm-9.9.8.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(tree, arcname="vllm-9.9.8")
        monkeypatch.setenv("PIP_INDEX_URL", file_index(tmp_path / "index", archive))
        code = cli.main(["apply-patches", "--project", str(project), "--upstream", "9.9.8"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err
        assert "cannot unpack vllm-9.9.8.tar.gz" in err and "No space left on device" in err
        assert "it needs about 16 MiB there" in err
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)


def test_an_unreachable_main_index_is_named_when_an_extra_index_has_nothing(monkeypatch, tmp_path, store_env):
    """The main index down, the extra one answering: the real cause is said, not just "lists no files"."""
    empty = tmp_path / "empty-index" / "simple"
    empty.mkdir(parents=True)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # port 9 (discard): refused
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", empty.as_uri())
    with pytest.raises(
        upstream_trees.SourceError, match=re.escape("cannot read the package index at http://127.0.0.1:9")
    ):
        upstream_trees.release_files("vllm", "9.9.8")
    # The extra index lists another release: the "not found" says where it could not look.
    archive = release_archive(tmp_path, "9.9.8")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", file_index(tmp_path / "other-index", archive))
    with pytest.raises(upstream_trees.SourceError) as raised:
        upstream_trees.release_files("vllm", "9.9.7")
    assert "lists no files for vllm 9.9.7 (and could not read: cannot read the package index at http://127.0.0.1:9" in (
        str(raised.value)
    )


def test_the_install_section_is_read_as_pip_install_reads_it(tmp_path):
    """Before: an [install] index-url mirror was ignored (the tool read [download], pip download's)."""
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = http://127.0.0.1:9/global\n[install]\nindex-url = http://127.0.0.1:9/mirror\n"
        "[download]\nindex-url = http://127.0.0.1:9/download-only\n"
    )
    assert indexes.configured() == ["http://127.0.0.1:9/mirror"]


def test_no_index_reads_no_index_not_even_an_extra_one(tmp_path, store_env):
    """Before: ``no-index = true`` with an extra index used the extra one."""
    (tmp_path / "pip.conf").write_text("[global]\nno-index = true\nextra-index-url = http://127.0.0.1:9/extra\n")
    assert indexes.configured() == []
    with pytest.raises(upstream_trees.SourceError, match="no package index to read: pip install's configuration"):
        upstream_trees.sdist_of("vllm", "9.9.8")


def test_find_links_is_honoured(tmp_path, store_env):
    """A wheelhouse named by find-links (with no-index, as an offline machine sets it)."""
    archive = release_archive(tmp_path, "9.9.8")
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / archive.name).write_bytes(archive.read_bytes())
    (wheelhouse / "torch-2.14.0.tar.gz").write_bytes(b"another project: not read")
    (tmp_path / "pip.conf").write_text(f"[install]\nno-index = true\nfind-links = {wheelhouse}\n")
    entry = upstream_trees.sdist_of("vllm", "9.9.8")
    assert entry.sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert entry.url == (wheelhouse / archive.name).as_uri()
    upstream = upstream_trees.obtain("9.9.8", lock.load(REPO_ROOT / "upstream.lock"), Store())
    assert upstream.kind == "release" and upstream.sha256 == entry.sha256


def test_help_says_which_pip_configuration_is_read(capsys):
    from tests.tool.helpers.cli import verb_help

    text = " ".join(verb_help("apply-patches", capsys).split())
    assert "pip install's configuration" in text and "[install] section over [global]" in text
