"""Proof, every run, that an imported upstream in the store is still the verified sdist's content.

git never re-hashes an object it reads: a blob of ``upstreams.git`` rewritten in place (same
object name, other content), a pack added that holds another object of the same name (git reads
packs before loose objects), an alternates file or a replace ref would all be checked out, patched,
tested and shipped as if they were the release. So a release is imported into a fresh object
directory of its own, its objects moved into the store as one pack (read before any loose object
of the same name; an older pack naming one of them is proven at the import), and a
record written beside the download (``<sdist>.imported``): the commit, its tree id, a sha256 of
the sdist's files (path, mode, content) hashed from the unpacked archive, every object of the
tree, and a fingerprint of the object files that hold them.

Each run then compares the fingerprint with the files as they are: inode, size and mtime of every
loose object file of the tree and of the alternates file (a rewrite writes a new file, or the same
one at a new mtime), inode and size of every pack file (git writes a pack once, as a new file, and
moves its mtime whenever it would write an object the pack holds). That costs a listing of the
fan-out directories and one ``lstat`` per loose object file of the tree (1.6 ms for vLLM
0.33.0's 9,626 objects, all packed). Not the ctime: every clone of the store
hard-links its object files and every removal of a clone unlinks them, and each link count change
moves the ctime, so with it nearly every run after an apply re-hashed the whole tree (about 36 s).
What the ctime alone would catch is an in-place rewrite whose writer then set the mtime back: one
who can do that can as well rewrite the record beside it, which no check kept in the same cache
survives.

Where the fingerprint differs (a ``git gc`` in the cache, a copied cache, a tampered object)
every object of the tree is read through ``git cat-file`` and hashed again, and the sdist's sha256
recomputed from the blobs: equal, the record is renewed; different, the run is refused, naming
the object and the path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from vllm_overlay import atomicfile
from vllm_overlay import git as gitcmd

RECORD_VERSION = 2  # 2: an import is one pack of its own (1: loose objects)


class TamperedObject(RuntimeError):
    """An object of an imported upstream is not what was imported (or cannot be read)."""


@dataclass
class ImportRecord:
    sha256: str  # the sdist archive's
    commit: str
    tree: str
    content_sha256: str  # files_digest of the sdist's unpacked tree
    objects: list[str]  # every object of the commit: commit, trees, blobs
    fingerprint: str
    version: int = RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def read(cls, path: Path) -> ImportRecord | None:
        """The record at ``path``; None when absent, unreadable or of an older format (re-import)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            record = cls(**data)
        except (OSError, ValueError, TypeError):
            return None
        return record if record.version == RECORD_VERSION else None

    def write(self, path: Path) -> None:
        atomicfile.write_bytes(path, (self.to_json() + "\n").encode())


class _Digest:
    """sha256 over (path, mode, sha256 of content) in path order: a tree's content, independent of git."""

    def __init__(self) -> None:
        self._entries: list[tuple[bytes, str, bytes]] = []

    def add(self, path: bytes, mode: str, content: bytes) -> None:
        self._entries.append((path, mode, hashlib.sha256(content).digest()))

    def hexdigest(self) -> str:
        digest = hashlib.sha256()
        for path, mode, content in sorted(self._entries):
            digest.update(path + b"\0" + mode.encode() + b"\0" + content)
        return digest.hexdigest()


def files_digest(tree: Path) -> str:
    """The sha256 of a directory's files (``.git`` excepted) as git would import them."""
    digest = _Digest()
    for root, dirs, files in os.walk(tree):
        dirs[:] = sorted(d for d in dirs if not (Path(root) == tree and d == ".git"))
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root) / name
            rel = path.relative_to(tree).as_posix().encode("utf-8", "surrogateescape")
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                digest.add(rel, "120000", os.fsencode(os.readlink(path)))
            elif stat.S_ISREG(info.st_mode):
                digest.add(rel, "100755" if info.st_mode & 0o111 else "100644", path.read_bytes())
    return digest.hexdigest()


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """``git --git-dir repo ARGS`` through the door: its stdout; a failure is a TamperedObject."""
    done = gitcmd.process("--git-dir", str(repo), *args, input=stdin, capture_output=True)
    if done.returncode != 0:
        raise TamperedObject(f"git {' '.join(args)} failed in {repo}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def tree_entries(repo: Path, commit: str) -> list[tuple[str, str, str, bytes]]:
    """(mode, type, object, path) of every entry under ``commit``'s tree, trees included."""
    out = _git(repo, "ls-tree", "-r", "-t", "-z", "--full-tree", commit)
    entries = []
    for item in out.split(b"\0"):
        if item:
            meta, path = item.split(b"\t", 1)
            mode, kind, oid = meta.decode().split()
            entries.append((mode, kind, oid, path))
    return entries


def _loose_path(repo: Path, oid: str) -> Path:
    return repo / "objects" / oid[:2] / oid[2:]


def _loose_names(objects_dir: str) -> dict[str, set[str]]:
    """The loose object files present, by fan-out directory: {"ab": {"cdef...", ...}}.

    An imported release lies in a pack, so nearly every object it lists has no loose file: a listing
    of the few fan-out directories there are answers for all of them, where one ``lstat`` per
    object found nothing about 9,600 times for vLLM 0.33.0 (17 ms, against 1.6 ms:
    ``benchmarks/upstream_check.py``).
    """
    names: dict[str, set[str]] = {}
    try:
        fan_out = os.scandir(objects_dir)
    except FileNotFoundError:
        return names
    with fan_out:
        for entry in fan_out:
            if len(entry.name) == 2 and entry.is_dir():  # git follows a linked directory too
                try:
                    names[entry.name] = set(os.listdir(entry.path))
                except FileNotFoundError:
                    pass  # removed meanwhile (git prune-packed): no loose object there
    return names


def fingerprint(repo: Path, objects: list[str]) -> str:
    """A digest of the files that hold ``objects``: loose object files, packs, the alternates file."""
    digest = hashlib.sha256()

    def add(path: Path, *, mtime: bool = True) -> None:
        try:
            info = path.lstat()
        except FileNotFoundError:
            digest.update(b"-\0")
            return
        when = info.st_mtime_ns if mtime else 0
        digest.update(f"{info.st_ino} {info.st_size} {when} {info.st_mode}\0".encode())

    loose = str(repo / "objects")
    present = _loose_names(loose)
    for oid in objects:
        info = None
        if oid[2:] in present.get(oid[:2], ()):
            with contextlib.suppress(FileNotFoundError):  # removed since the listing: absent
                info = os.lstat(f"{loose}/{oid[:2]}/{oid[2:]}")
        digest.update(b"-\0" if info is None else b"%d %d %d\0" % (info.st_ino, info.st_size, info.st_mtime_ns))
    pack_dir = repo / "objects" / "pack"
    packs = sorted(pack_dir.iterdir()) if pack_dir.is_dir() else []
    for path in packs:
        # Not a pack's mtime: git sets it to now ("freshens" the pack) whenever it would write an
        # object the pack holds, in the cache or in any clone through the hard link, so it moves
        # without the content. git never rewrites a pack in place: another content is another file.
        digest.update(path.name.encode() + b"\0")
        add(path, mtime=False)
    for extra in ("objects/info/alternates", "objects/info/http-alternates", "info/grafts", "shallow"):
        add(repo / extra)
    return digest.hexdigest()


def verify_packs(repo: Path) -> None:
    """Raise TamperedObject unless every object of every pack of ``repo`` hashes to its name.

    Where two packs name the same object, which one a git process reads moves with the process
    (git tries the pack of its last hit first), so reading the tree once through ``rehash`` proves
    only the copies that one process read: each pack is checked whole (``git verify-pack``
    recomputes every object's name from the pack's content).
    """
    pack_dir = repo / "objects" / "pack"
    for idx in sorted(pack_dir.glob("*.idx")) if pack_dir.is_dir() else []:
        done = gitcmd.process("--git-dir", str(repo), "verify-pack", str(idx), capture_output=True)
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()
            raise TamperedObject(
                f"the pack {idx.with_suffix('.pack').name} holds objects other than their names say"
                + (f" ({why[-1]})" if why else "")
            )


def rehash(repo: Path, commit: str) -> tuple[str, list[str]]:
    """Read every object of ``commit`` through git, check each hashes to its name; return the
    content sha256 of its tree and the object list. Raises TamperedObject naming the first bad one."""
    commit = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}").decode().strip()
    entries = tree_entries(repo, commit)
    root_tree = _git(repo, "rev-parse", f"{commit}^{{tree}}").decode().strip()
    wanted: list[tuple[str, bytes, str]] = [(commit, b"(the commit)", "commit"), (root_tree, b"(the root tree)", "")]
    wanted += [(oid, path, mode) for mode, kind, oid, path in entries if kind != "commit"]
    gitlinks = [path.decode(errors="replace") for mode, kind, _oid, path in entries if kind == "commit"]
    if gitlinks:
        raise TamperedObject(f"the tree holds nested repositories (gitlinks): {', '.join(gitlinks)}")
    process = gitcmd.popen(
        "--git-dir",
        str(repo),
        "cat-file",
        "--batch",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None and process.stdout is not None
    request = "".join(f"{oid}\n" for oid, _path, _mode in wanted).encode()
    stdin = process.stdin

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError):  # git stopped early: the reader says why
            stdin.write(request)
            stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    content = _Digest()
    try:
        for oid, path, mode in wanted:
            header = process.stdout.readline().split()
            if len(header) != 3:
                raise TamperedObject(f"object {oid} ({path.decode(errors='replace')}) cannot be read")
            kind, size = header[1], int(header[2])
            data = process.stdout.read(size)
            process.stdout.read(1)
            actual = hashlib.sha1(kind + b" %d\0" % size + data).hexdigest()  # git's object name
            if actual != oid:
                raise TamperedObject(
                    f"object {oid} ({path.decode(errors='replace')}) holds other content (it hashes to {actual})"
                )
            if kind == b"blob":
                content.add(path, mode, data)
    finally:
        process.kill()
        process.wait()
        feeder.join()
    return content.hexdigest(), [oid for oid, _path, _mode in wanted]


def import_fresh(repo: Path, tree: Path, message: str, identity: dict[str, str]) -> str:
    """Import ``tree`` as a root commit whose every object is written anew (not one reused from the store).

    git skips writing an object whose name it already holds, so an object planted in the store
    before the import would stay. The import writes into an empty object directory of its own and
    moves what it wrote into the store as one pack. git reads packs before loose objects and the
    newest pack first, so no loose object of the store is read in place of the import's; a pack
    the store held before that names one of them is the caller's to prove (``packed_objects``).
    """
    fresh = repo / f"objects-import-{os.getpid()}"
    shutil.rmtree(fresh, ignore_errors=True)
    (fresh / "info").mkdir(parents=True)
    index = fresh / "index"
    env = dict(
        identity,
        GIT_INDEX_FILE=str(index),
        GIT_WORK_TREE=str(tree),
        GIT_OBJECT_DIRECTORY=str(fresh),
        GIT_DIR=str(repo),
    )  # on the isolated environment, which holds no GIT_ALTERNATE_OBJECT_DIRECTORIES

    def run(*args: str, stdin: str | None = None) -> str:
        done = gitcmd.process(*args, capture_output=True, env=env, text=True, input=stdin)
        if done.returncode != 0:
            raise TamperedObject(f"git {' '.join(args[:3])} failed importing {tree}: {done.stderr.strip()}")
        return done.stdout.strip()

    try:
        # The loose objects live only until they are packed: written uncompressed (the pack
        # compresses each once), which takes a quarter of the time on vLLM's 9,000 files.
        run("-c", "core.looseCompression=0", "add", "--all", "--force", "--", ".", ":(exclude).git")
        tree_id = run("write-tree")
        commit = run("commit-tree", tree_id, "-m", message)
        index.unlink()
        written = [
            sub.name + item.name
            for sub in sorted(p for p in fresh.iterdir() if len(p.name) == 2 and p.is_dir())
            for item in sub.iterdir()
        ]
        # One pack without deltas (a delta search would cost the import seconds and every checkout
        # the deltas' resolution), at zlib's fastest level: a clone hard-links two files instead of
        # one per object, and a checkout reads one mapped file instead of opening 9,000.
        (fresh / "pack").mkdir()
        name = run(
            "-c",
            "pack.compression=1",
            "pack-objects",
            "--window=0",
            "--depth=0",
            "-q",
            str(fresh / "pack" / "pack"),
            stdin="".join(f"{oid}\n" for oid in written),
        )
        pack_dir = repo / "objects" / "pack"
        pack_dir.mkdir(parents=True, exist_ok=True)
        for suffix in (".pack", ".idx"):  # git sees a pack once its index is there: the index last
            os.replace(fresh / "pack" / f"pack-{name}{suffix}", pack_dir / f"pack-{name}{suffix}")
        return commit
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def packed_objects(repo: Path) -> set[str]:
    """Names of the objects the store's packs hold (git reads a packed object before a loose one)."""
    found: set[str] = set()
    pack_dir = repo / "objects" / "pack"
    for idx in sorted(pack_dir.glob("*.idx")) if pack_dir.is_dir() else []:
        with open(idx, "rb") as index_file:
            out = gitcmd.process("show-index", stdin=index_file, capture_output=True).stdout.decode()
        found.update(line.split()[1] for line in out.splitlines() if len(line.split()) >= 2)
    return found
