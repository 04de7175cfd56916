"""Upstream sources: verified downloads, safe unpacking, every kind of --upstream."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
from pathlib import Path

import git
import pytest

from tests.tool.helpers.repos import REPO_ROOT, write_upstream
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock
from vllm_overlay.upstream import trees as upstream_trees


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    claimed_length = 0

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(self.claimed_length or len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def serve(server, body: bytes, claimed: int = 0) -> str:
    _Handler.body, _Handler.claimed_length = body, claimed
    return f"http://127.0.0.1:{server.server_port}/file.tar.gz"


def test_download_verifies_sha256(http_server, tmp_path):
    body = b"payload" * 1000
    url = serve(http_server, body)
    dest = tmp_path / "a.tar.gz"
    upstream_trees.download(url, dest, hashlib.sha256(body).hexdigest())
    assert dest.read_bytes() == body


def test_hash_mismatch_leaves_nothing(http_server, tmp_path):
    url = serve(http_server, b"tampered")
    dest = tmp_path / "a.tar.gz"
    with pytest.raises(upstream_trees.SourceError, match="sha256 mismatch"):
        upstream_trees.download(url, dest, "0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_truncated_download_is_an_error(http_server, tmp_path):
    body = b"x" * 100
    url = serve(http_server, body, claimed=1000)
    with pytest.raises(upstream_trees.SourceError):
        upstream_trees.download(url, tmp_path / "a.tar.gz", hashlib.sha256(body).hexdigest())
    assert list(tmp_path.iterdir()) == []


def _tar_with(members: dict[str, bytes], path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_member_outside_destination_is_refused(tmp_path):
    archive = _tar_with({"vllm-1/ok.py": b"", "../escape.py": b"bad"}, tmp_path / "evil.tar.gz")
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(upstream_trees.SourceError, match="refused to unpack"):
        upstream_trees.unpack_sdist(archive, dest)
    assert not (tmp_path / "escape.py").exists()


def test_absolute_member_is_refused(tmp_path):
    archive = _tar_with({"/tmp/abs-escape.py": b"bad"}, tmp_path / "evil.tar.gz")
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(upstream_trees.SourceError):
        upstream_trees.unpack_sdist(archive, dest)


def test_release_from_index_is_verified_and_cached(http_server, tmp_path, monkeypatch, store_env):
    tree = write_upstream(tmp_path / "src" / "vllm-9.9.9")
    archive = tmp_path / "vllm-9.9.9.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="vllm-9.9.9")
    body = archive.read_bytes()
    url = serve(http_server, body)
    entry = upstream_trees.IndexFile("vllm-9.9.9.tar.gz", url, hashlib.sha256(body).hexdigest(), len(body))
    calls = []
    monkeypatch.setattr(upstream_trees, "sdist_of", lambda project, version: calls.append(version) or entry)
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    upstream = upstream_trees.obtain("9.9.9", the_lock, Store())
    assert upstream.kind == "release" and upstream.sha256 == entry.sha256
    assert upstream.release_commit == "gdeadbeef"
    again = upstream_trees.obtain("9.9.9", the_lock, Store())
    assert again.commit == upstream.commit
    assert calls == ["9.9.9"]  # the second call used the cache
    assert upstream.origin == url and again.origin == url  # the cached one still says where it came from


def test_directory_and_git_upstreams(tmp_path, store_env):
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    tree = write_upstream(tmp_path / "tree")
    from_dir = upstream_trees.obtain(str(tree), the_lock, Store())
    assert from_dir.kind == "directory" and from_dir.version == "9.9.9"
    repo = git.Repo.init(tmp_path / "gitsrc")
    write_upstream(tmp_path / "gitsrc")
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"])
    rev = repo.head.commit.hexsha
    from_git = upstream_trees.obtain(f"{tmp_path / 'gitsrc'}@{rev}", the_lock, Store())
    assert from_git.kind == "git" and from_git.commit == rev
    # identical content imports to the identical tree
    store_repo = git.Repo(Store().upstreams_git)
    assert store_repo.commit(from_dir.commit).tree.hexsha == store_repo.commit(rev).tree.hexsha


def test_bad_spec_is_a_clear_error():
    with pytest.raises(upstream_trees.SourceError, match="not a version number"):
        upstream_trees.parse_spec("no such thing")


def test_a_ref_lock_a_killed_import_left_is_recovered(tmp_path, store_env):
    """refs/tags/upstream/<v>.lock left by a killed git: the next run removes it and imports, no traceback."""
    upstream = write_upstream(tmp_path / "up")
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    first = upstream_trees.obtain(str(upstream), the_lock, Store())
    refs = Store().upstreams_git / "refs" / "tags" / "upstream"
    stale = refs / f"{first.tag.split('/', 1)[1]}.lock"
    stale.write_text("0" * 40 + "\n")
    (Store().upstreams_git / "packed-refs.lock").write_text("")
    (upstream / "vllm" / "core.py").write_text("changed = 1\n")  # a re-import must update the tag
    again = upstream_trees.obtain(str(upstream), the_lock, Store())
    assert again.commit != first.commit and not stale.exists()
    assert not (Store().upstreams_git / "packed-refs.lock").exists()


def test_a_nested_repository_in_a_directory_upstream_is_refused_by_name(tmp_path, store_env):
    """git would import a vendored checkout as a gitlink: its files silently missing from the tree."""
    tree = write_upstream(tmp_path / "tree", extra={"third_party/lib/lib.py": "x = 1\n"})
    nested = git.Repo.init(tree / "third_party" / "lib")
    nested.git.add("-A")
    nested.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "vendored"])
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    with pytest.raises(upstream_trees.SourceError, match=r"nested git repositories .* at third_party/lib"):
        upstream_trees.obtain(str(tree), the_lock, Store())


def test_a_git_upstream_with_a_submodule_is_refused_by_name(tmp_path, store_env):
    repo = git.Repo.init(tmp_path / "gitsrc")
    write_upstream(tmp_path / "gitsrc")
    repo.git.add("-A")
    repo.git.update_index("--add", "--cacheinfo", f"160000,{'1' * 40},third_party/sub")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"])
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    with pytest.raises(upstream_trees.SourceError, match=r"submodules.* at third_party/sub"):
        upstream_trees.obtain(f"{tmp_path / 'gitsrc'}@{repo.head.commit.hexsha}", the_lock, Store())


def test_a_cached_sdist_that_failed_its_check_is_named_before_the_index(store_env, monkeypatch, capsys):
    """Before: the cached sdist no longer matched its sha256 and the index was unreachable:
    the error spoke only of the index."""
    import socket

    with socket.socket() as closed:  # a port nothing listens on: the index is unreachable
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("VLLM_OVERLAY_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    store = Store()
    cached = store.download(the_lock.sdist.filename)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"not the release any more")
    with pytest.raises(upstream_trees.SourceError) as raised:
        upstream_trees.obtain(None, the_lock, store)
    message = str(raised.value)
    assert message.startswith(
        f"the cached {cached} failed its sha256 check (expected {the_lock.sdist.sha256}), and fetching it again "
        f"failed: cannot read the package index at http://127.0.0.1:{port}/simple/vllm/"
    ), message
    assert capsys.readouterr().err.startswith(f"warning: the cached {cached} does not match its sha256")


class _Trickle(http.server.BaseHTTPRequestHandler):
    """A mirror that sends one byte every 0.2 s of a 1 MB file (the socket never times out)."""

    def do_GET(self):
        import time

        self.send_response(200)
        self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        try:
            for _ in range(1 << 20):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client gave up
            pass

    def log_message(self, *args):
        pass


def test_a_trickling_download_stops_at_its_deadline_saying_so(tmp_path, monkeypatch):
    """Before: a package index sending a byte every few seconds had no overall deadline."""
    import time

    from vllm_overlay import transfer

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(transfer.DEADLINE_ENV, "1")
    outcome: list[object] = []

    def fetch() -> None:
        try:
            upstream_trees.download(f"http://127.0.0.1:{server.server_port}/f.tar.gz", tmp_path / "f.tar.gz", "0" * 64)
        except Exception as exc:
            outcome.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(20)
    server.shutdown()
    assert not worker.is_alive(), "the download was still running after 20 s"
    assert time.monotonic() - started < 10
    (error,) = outcome
    assert isinstance(error, upstream_trees.SourceError)
    assert "the download of f.tar.gz did not finish within 1 s" in str(error), error
    assert f"${transfer.DEADLINE_ENV} gives a slow link more seconds" in str(error)
    assert list(tmp_path.iterdir()) == []  # no partial file left


def test_a_trickling_index_page_stops_at_its_deadline(monkeypatch):
    from vllm_overlay import transfer
    from vllm_overlay.upstream import indexes

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(transfer.DEADLINE_ENV, "1")
    monkeypatch.setenv(indexes.ENV_VAR, f"http://127.0.0.1:{server.server_port}/simple")
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(_error_of(upstream_trees.sdist_of, "vllm", "0.33.0")))
    worker.daemon = True
    worker.start()
    worker.join(20)
    server.shutdown()
    assert not worker.is_alive(), "reading the index page was still running after 20 s"
    assert "did not finish within 1 s" in str(outcome[0]), outcome


def _error_of(function, *args) -> Exception | None:
    try:
        function(*args)
    except Exception as exc:
        return exc
    return None
