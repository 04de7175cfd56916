"""Upstream sources behind one interface: the locked sdist, another release, a directory, a git rev.

Whatever the source, the result is the same: a root commit in the store's bare repository
(``upstreams.git``) tagged ``upstream/<label>``, holding the upstream tree exactly. Downloads are
verified against a sha256 *before* anything is unpacked, unpacking refuses members that would land
outside the extraction directory, and nothing is published to the cache until it is complete.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import atomicfile, output, transfer
from vllm_overlay import git as gitcmd
from vllm_overlay.errors import InputError
from vllm_overlay.store import UNPACK_PREFIX, Store
from vllm_overlay.upstream import indexes, objects

# GitPython, packaging, urllib and tarfile are imported by the functions that use them: a run that
# answers from a tree's record (apply_record) reads only this module's descriptions of an upstream.
if TYPE_CHECKING:
    from collections.abc import Callable

    import git
    from packaging.version import Version

    from vllm_overlay.upstream.lock import Lock

VERSION_RE = re.compile(r"^\d+(\.\d+)*([._-]?(a|b|rc|post|dev)\d*)*$")
IMPORT_IDENTITY = {
    "GIT_AUTHOR_NAME": "upstream import",
    "GIT_AUTHOR_EMAIL": "upstream@vllm-overlay.invalid",
    "GIT_COMMITTER_NAME": "upstream import",
    "GIT_COMMITTER_EMAIL": "upstream@vllm-overlay.invalid",
    # Fixed dates: importing the same tree always yields the same commit id.
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


class SourceError(InputError, RuntimeError):
    """An upstream could not be obtained or failed verification; nothing from it was used."""


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str
    size: int | None


@dataclass(frozen=True)
class Upstream:
    """An upstream tree imported into the store, ready to be checked out."""

    kind: str  # locked | release | directory | git
    label: str  # e.g. "0.33.0", "dir-<tree>", "git-<sha>"
    tag: str  # tag in the store repository
    commit: str  # commit id of the import in the store repository
    version: str | None  # vLLM version, where known
    release_commit: str | None  # commit id the release records (vllm/_version.py)
    sha256: str | None  # sdist sha256 for releases
    origin: str  # where it came from (URL, directory, repo@rev)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def index_url() -> str:
    """The first index the tool reads (for messages); see vllm_overlay.upstream.indexes."""
    configured = indexes.configured()
    return configured[0] if configured else "(no index configured)"


def release_files(project: str, version: str) -> list[IndexFile]:
    """Files the package indexes publish for one release, with the sha256 each index states."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    try:
        wanted = (canonicalize_name(project), Version(version))
    except InvalidVersion as exc:
        raise SourceError(f"not a version number: {version!r}") from exc
    listed = _project_files(project)
    files = [
        IndexFile(entry.filename, entry.url, entry.sha256, entry.size)
        for entry in listed
        if _release_of(entry.filename) == wanted
    ]
    if not files:
        also = f" (and could not read: {'; '.join(listed.unreachable)})" if listed.unreachable else ""
        raise SourceError(f"the package index lists no files for {project} {version}{also}")
    return files


def _release_of(filename: str) -> tuple[str, Version] | None:
    """(canonical project name, version) of an sdist or wheel file name; None for anything else."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        parse_sdist_filename,
        parse_wheel_filename,
    )

    try:
        if filename.endswith(".whl"):
            name, parsed, _build, _tags = parse_wheel_filename(filename)
        elif filename.endswith(".tar.gz"):
            name, parsed = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return str(name), parsed


def _project_files(project: str) -> indexes.ProjectFiles:
    try:
        return indexes.project_files(project)
    except indexes.IndexReadError as exc:
        raise SourceError(str(exc)) from exc


def release_dates(project: str) -> dict[str, dt.date]:
    """First upload date of every release the index lists (for "N releases old" warnings).

    Only indexes that speak the JSON API state upload times; an index of plain HTML gives none.
    """
    dates: dict[str, dt.date] = {}
    for entry in _project_files(project):
        release = _release_of(entry.filename)
        if not entry.upload_time or release is None:
            continue
        day = dt.date.fromisoformat(entry.upload_time[:10])
        version = str(release[1])
        dates[version] = min(day, dates.get(version, day))
    return dates


def sdist_of(project: str, version: str) -> IndexFile:
    for entry in release_files(project, version):
        if entry.filename.endswith(".tar.gz"):
            if not re.fullmatch(r"[0-9a-f]{64}", entry.sha256):
                raise SourceError(f"the index gives no sha256 for {entry.filename}")
            return entry
    raise SourceError(f"the package index lists no sdist for {project} {version}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(url: str, dest: Path, sha256: str, size: int | None = None) -> Path:
    """Download ``url`` to ``dest`` unless a verified copy is there. Shows progress.

    The file is written under a temporary name and only renamed into place after its length and
    sha256 match; a truncated or corrupted download never becomes visible in the cache.
    """
    import urllib.error
    import urllib.request

    if dest.exists():
        if sha256_file(dest) == sha256:
            return dest
        output.warn(f"cached {dest.name} does not match its sha256; downloading again")
        dest.unlink()
    from tqdm import tqdm  # imported here: only a download shows progress (it costs every start-up otherwise)

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = atomicfile.create_temp(dest.parent, f".{dest.name}.", ".part")
    digest = hashlib.sha256()
    received = 0
    try:
        seconds = transfer.deadline_seconds(transfer.FILE_DEADLINE_S)
        with os.fdopen(fd, "wb") as handle, urllib.request.urlopen(url, timeout=120) as response:
            total = int(response.headers.get("Content-Length") or 0) or size
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {dest.name}", leave=False) as bar:
                for block in transfer.blocks(response, seconds, f"the download of {dest.name}"):
                    handle.write(block)
                    digest.update(block)
                    received += len(block)
                    bar.update(len(block))
        if total and received != total:
            raise SourceError(f"{dest.name}: truncated download ({received} of {total} bytes)")
        actual = digest.hexdigest()
        if actual != sha256:
            raise SourceError(f"{dest.name}: sha256 mismatch: expected {sha256}, got {actual}")
        os.replace(tmp, dest)
        return dest
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise SourceError(f"download of {url} failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def unpack_sdist(archive: Path, dest: Path) -> Path:
    """Unpack a verified sdist into ``dest`` and return its single top-level directory.

    Members are extracted by ``safetar``: no absolute names, no ``..``, no links leaving the
    directory, no device files, and no ownership taken from the archive (git refuses trees owned by
    other users), with or without tarfile's ``data`` filter (Python 3.11.2 lacks it).
    """
    import tarfile

    from vllm_overlay.upstream import safetar

    try:
        with tarfile.open(archive, "r:*") as tar:
            try:
                safetar.extract_all(tar, dest)
            except OSError as exc:  # the machine's: a full or read-only file system
                needed = sum(member.size for member in tar.getmembers() if member.isfile())
                raise SourceError(
                    f"cannot unpack {archive.name} into {dest}: {exc.strerror or exc} "
                    f"(it needs about {needed / 2**20:,.0f} MiB there; the cache is $VLLM_OVERLAY_CACHE)"
                ) from None
    except (safetar.UnsafeArchive, tarfile.TarError, EOFError) as exc:
        raise SourceError(f"{archive.name}: refused to unpack: {exc}") from exc
    entries = [p for p in dest.iterdir()]
    if len(entries) != 1 or not entries[0].is_dir():
        raise SourceError(f"{archive.name}: expected one top-level directory, found {len(entries)} entries")
    return entries[0]


VERSION_FILE = "vllm/_version.py"
COMMIT_ID_RE = re.compile(r"commit_id\s*=\s*['\"]([^'\"]+)['\"]")
VERSION_RE_IN_FILE = re.compile(r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]")


def version_field(text: str | None, pattern: re.Pattern[str]) -> str | None:
    """A field of a release's vllm/_version.py (the release's own record of itself)."""
    match = pattern.search(text) if text else None
    return match.group(1) if match else None


def _version_file_of_tree(tree: Path) -> str | None:
    path = tree / VERSION_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def version_file_of_commit(repo: Path, commit: str) -> str | None:
    """``commit``'s vllm/_version.py (None: it has none), by one plain git process in ``repo`` (a
    working tree or a git directory)."""
    status, text, _err = gitcmd.run(repo, "show", f"{commit}:{VERSION_FILE}")
    if status != 0:
        return None
    return text[:-1] if text.endswith("\n") else text  # as GitPython gave it: one trailing newline less


def _store_repo(store: Store) -> git.Repo:
    import git

    if not (store.upstreams_git / "HEAD").exists():
        store.upstreams_git.parent.mkdir(parents=True, exist_ok=True)
        repo = git.Repo.init(store.upstreams_git, bare=True)
    else:
        repo = git.Repo(store.upstreams_git)
    gitcmd.attributes_off(store.upstreams_git)  # an imported tree's .gitattributes converts nothing
    return repo


def _store_git_dir(store: Store) -> Path:
    """The store repository's git directory, created on first use. A run that finds the upstream
    imported reads it by plain git processes: GitPython is imported only to import one."""
    if not (store.upstreams_git / "HEAD").exists():
        _store_repo(store)
    gitcmd.attributes_off(store.upstreams_git)
    return store.upstreams_git


def _tag_commit(git_dir: Path, tag: str) -> str | None:
    status, out, _err = gitcmd.run(git_dir, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
    return out.strip() if status == 0 else None


def import_tree(store: Store, tree: Path, tag: str, message: str) -> str:
    """Record ``tree`` (everything but .git) as a root commit tagged ``tag``; return its id.

    A private index file keeps the import independent of any repository state, and fixed
    identity and dates make the commit id a function of the tree alone. A nested repository is
    refused (git would record a gitlink and none of its files).
    """
    refuse_nested_repositories(tree, str(tree))
    repo = _store_repo(store)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vllm-overlay-index-") as tmp:
        env = dict(IMPORT_IDENTITY, GIT_INDEX_FILE=str(Path(tmp) / "index"), GIT_WORK_TREE=str(tree))
        gitcmd.git(store.upstreams_git, "add", "--all", "--force", "--", ".", ":(exclude).git", env=env)
        tree_id = gitcmd.git(store.upstreams_git, "write-tree", env=env).strip()
        commit = gitcmd.git(store.upstreams_git, "commit-tree", tree_id, "-m", message, env=env).strip()
    repo.git.tag("--force", tag, commit)
    return commit


def _import_release_archive(store: Store, archive: Path, tag: str, sha256: str) -> objects.ImportRecord:
    """Import a verified sdist with every object written anew, and record what proves it later.

    Unpacked inside the store (under its lock), so a killed import's tree is removed with the
    store's other leftovers rather than staying in /tmp.
    """
    repo = _store_repo(store)
    import tempfile

    git_dir = store.upstreams_git
    packed_before = objects.packed_objects(git_dir)
    with tempfile.TemporaryDirectory(prefix=UNPACK_PREFIX, dir=store.root) as tmp:
        top = unpack_sdist(archive, Path(tmp))
        refuse_nested_repositories(top, archive.name)
        content = objects.files_digest(top)
        try:
            commit = objects.import_fresh(git_dir, top, f"upstream: {archive.name}", IMPORT_IDENTITY)
        except objects.TamperedObject as exc:
            raise SourceError(str(exc)) from None
    listed = [commit, _rev(repo, f"{commit}^{{tree}}")]
    listed += [oid for _mode, kind, oid, _path in objects.tree_entries(git_dir, commit) if kind != "commit"]
    if packed_before.intersection(listed):
        # An older pack names objects of this release too (the import of another release, or one
        # planted): prove what git reads.
        _rehash_or_refuse(store, tag, commit, content)
    repo.git.tag("--force", tag, commit)
    # Loose copies of packed objects (a cache of an older version of the tool) are never read; without
    # them a clone of the store links a few packs instead of thousands of object files.
    repo.git.prune_packed()
    return objects.ImportRecord(
        sha256=sha256,
        commit=commit,
        tree=listed[1],
        content_sha256=content,
        objects=listed,
        fingerprint=objects.fingerprint(git_dir, listed),
    )


def _rev(repo: git.Repo, rev: str) -> str:
    return repo.git.rev_parse("--verify", "--quiet", rev)


def _rehash_or_refuse(store: Store, tag: str, commit: str, content: str) -> list[str]:
    """Read and hash every object of ``commit`` and check every pack whole; refuse (naming the object or
    the pack) unless it is the sdist's content."""
    repair = f"remove {store.upstreams_git} (the next run imports the verified sdist again)"
    try:
        actual, listed = objects.rehash(store.upstreams_git, commit)
        objects.verify_packs(store.upstreams_git)
    except objects.TamperedObject as exc:
        raise SourceError(f"the upstream cache's {tag} is not what was imported: {exc}; {repair}") from None
    if actual != content:
        raise SourceError(
            f"the upstream cache's {tag} does not hold the sdist's files (their sha256 is {actual}, "
            f"the import recorded {content}); {repair}"
        )
    return listed


def verify_import(store: Store, tag: str, record: objects.ImportRecord) -> None:
    """Prove the store's ``tag`` is still what was imported; cheap unless its object files changed.

    The caller has just seen ``tag`` name the recorded commit; the object files must match the
    recorded fingerprint, and where they changed every object is hashed again
    (vllm_overlay.upstream.objects) and the record renewed.
    """
    if objects.fingerprint(store.upstreams_git, record.objects) == record.fingerprint:
        return
    output.info(f"the upstream cache's object files of {tag} changed since they were checked: hashing them again")
    listed = _rehash_or_refuse(store, tag, record.commit, record.content_sha256)
    record.objects = listed
    record.fingerprint = objects.fingerprint(store.upstreams_git, listed)


def refuse_nested_repositories(tree: Path, what: str) -> None:
    """Refuse a tree holding a nested git repository: git would import it as a gitlink, its files missing."""
    nested = []
    for root, dirs, files in os.walk(tree):
        here = Path(root)
        if here != tree and (".git" in dirs or ".git" in files):
            nested.append(here.relative_to(tree).as_posix())
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not (here == tree and d == ".git")]
    if nested:
        raise SourceError(
            f"{what}: holds nested git repositories (their own .git) at {', '.join(sorted(nested))}: "
            "git would record each as a gitlink and none of their files; refusing (remove or flatten them)"
        )


def parse_spec(spec: str | None) -> tuple[str, str]:
    """Classify an --upstream value: (kind, value). ``None`` means the lock."""
    if spec is None or spec in ("", "locked"):
        return "locked", ""
    if Path(spec).is_dir():
        return "directory", spec
    if "@" in spec:
        return "git", spec
    if VERSION_RE.match(spec):
        return "release", spec
    raise SourceError(f"--upstream {spec!r}: not a version number, an existing directory, or REPOSITORY@REVISION")


def obtain(spec: str | None, lock: Lock, store: Store) -> Upstream:
    """Import the upstream named by ``spec`` into the store (cached) and describe it."""
    kind, value = parse_spec(spec)
    with store.exclusive():
        store.remove_leftovers()  # a killed run's; downloads and imports run under this lock
        if kind in ("locked", "release"):
            version = lock.version if kind == "locked" else value
            return _obtain_release(store, lock, version, locked=kind == "locked" or version == lock.version)
        if kind == "directory":
            return _obtain_directory(store, Path(value))
        return _obtain_git(store, value)


def check_provenance(lock: Lock, file_version: str | None, file_commit: str | None) -> None:
    """Refuse a lock whose version or commit differ from what the verified sdist itself records.

    The lock's values land in the image's labels, manifest and SBOM, and ``verify --expect``
    compares lock against lock: only here can a wrong value be caught, against the release.
    """
    problems = []
    if file_version and file_version != lock.version:
        problems.append(f"version {lock.version!r}, but the sdist's vllm/_version.py says {file_version!r}")
    if file_commit and file_commit != lock.commit:
        problems.append(f"commit {lock.commit!r}, but the sdist's vllm/_version.py says {file_commit!r}")
    if problems:
        raise SourceError(
            f"{lock.path or 'upstream.lock'}: "
            + "; ".join(problems)
            + " (fix upstream.lock: it must say what the release says)"
        )


def _obtain_release(store: Store, lock: Lock, version: str, locked: bool) -> Upstream:
    project = lock.project
    tag = f"upstream/{version}"
    filename = f"{project}-{version}.tar.gz"
    archive = store.download(filename)
    if locked:
        sha256 = lock.sdist.sha256
        url: str | None = None
    else:
        entry = sdist_of(project, version) if not archive.exists() else None
        sha256 = entry.sha256 if entry else _cached_sha(store, filename)
        url = entry.url if entry else None
    git_dir = _store_git_dir(store)
    marker = store.download(f"{filename}.imported")
    record = objects.ImportRecord.read(marker)
    if record is None or record.sha256 != sha256 or _tag_commit(git_dir, tag) != record.commit:
        failed_check = archive.exists() and sha256_file(archive) != sha256
        if failed_check or not archive.exists():
            if failed_check:  # said first: whatever fetching it again says after is about the index
                output.warn(f"the cached {archive} does not match its sha256 {sha256}: fetching it again")
            try:
                url = _fetch_release(project, version, archive, sha256, url, locked)
            except SourceError as exc:
                if failed_check:
                    raise SourceError(
                        f"the cached {archive} failed its sha256 check (expected {sha256}), and fetching it "
                        f"again failed: {exc}"
                    ) from exc
                raise
        output.info(f"importing {filename} into the upstream cache")
        record = _import_release_archive(store, archive, tag, sha256)
        record.write(marker)
        store.download(f"{filename}.sha256").write_text(sha256 + "\n")
    else:
        before = record.fingerprint
        # Every run: the cache still holds what was imported (the tag was just seen naming it).
        verify_import(store, tag, record)
        if record.fingerprint != before:
            record.write(marker)
    commit = record.commit
    version_file = version_file_of_commit(git_dir, commit)
    release_commit = version_field(version_file, COMMIT_ID_RE)
    if locked:
        check_provenance(lock, version_field(version_file, VERSION_RE_IN_FILE), release_commit)
    recorded_url = store.download(f"{filename}.url")
    if url is None and recorded_url.is_file():  # cached: say where it was downloaded from
        url = recorded_url.read_text().strip()
    return Upstream(
        kind="locked" if locked else "release",
        label=version,
        tag=tag,
        commit=commit,
        version=version,
        release_commit=release_commit,
        sha256=sha256,
        origin=output.redact_credentials(url or f"{index_url()}/{project}/ ({filename})"),
    )


def _fetch_release(project: str, version: str, archive: Path, sha256: str, url: str | None, locked: bool) -> str:
    """Download the release's sdist to ``archive`` (verified against ``sha256``); returns its URL."""
    filename = archive.name
    if url is None:
        entry = sdist_of(project, version)
        if locked and entry.sha256 != sha256:
            raise SourceError(
                f"the index's sha256 for {filename} ({entry.sha256}) differs from upstream.lock ({sha256})"
            )
        url = entry.url
    output.info(f"downloading {filename}")
    download(url, archive, sha256)
    archive.with_name(f"{filename}.url").write_text(output.redact_credentials(url) + "\n")
    return url


def imported_locked(lock: Lock, store: Store) -> dict[str, object] | None:
    """The locked upstream as its last verified import describes it (``Upstream.to_json()`` without
    ``release_commit``), read from the records beside the download, not from the store's objects.

    For a run that builds nothing (an unchanged re-apply, ``apply.unchanged_report``): it compares
    this with what a published tree recorded and reads no upstream file. Every run that reads the
    store goes through ``obtain``, which verifies it. ``release_commit`` is left out because obtain
    reads it from the commit's own vllm/_version.py: the same commit has the same one. None: not
    imported yet, imported for another sha256, or without a recorded origin (obtain then decides).
    """
    filename = f"{lock.project}-{lock.version}.tar.gz"
    record = objects.ImportRecord.read(store.download(f"{filename}.imported"))
    origin = store.download(f"{filename}.url")
    if record is None or record.sha256 != lock.sdist.sha256 or not origin.is_file():
        return None
    return {
        "kind": "locked",
        "label": lock.version,
        "tag": f"upstream/{lock.version}",
        "commit": record.commit,
        "version": lock.version,
        "sha256": lock.sdist.sha256,
        "origin": output.redact_credentials(origin.read_text().strip()),
    }


def _cached_sha(store: Store, filename: str) -> str:
    recorded = store.download(f"{filename}.sha256")
    if recorded.exists():
        return recorded.read_text().strip()
    raise SourceError(f"no recorded sha256 for cached {filename}; delete it from {store.downloads}")


def _obtain_directory(store: Store, directory: Path) -> Upstream:
    directory = directory.resolve()
    if not (directory / "vllm").is_dir():
        raise SourceError(f"{directory}: not a vLLM source tree (no vllm/ package directory)")
    tag = "upstream/dir-" + hashlib.sha256(str(directory).encode()).hexdigest()[:12]
    commit = import_tree(store, directory, tag, f"upstream: directory {directory}")
    return Upstream(
        kind="directory",
        label=directory.name,
        tag=tag,
        commit=commit,
        version=version_field(_version_file_of_tree(directory), VERSION_RE_IN_FILE),
        release_commit=version_field(_version_file_of_tree(directory), COMMIT_ID_RE),
        sha256=None,
        origin=str(directory),
    )


def refuse_option_shaped(value: str, what: str) -> str:
    """``value`` unless git could read it as an option (``--upload-pack=...`` would run a command)."""
    if value.startswith("-"):
        raise SourceError(f"{what} {value!r} starts with '-': git would read it as an option; refusing it")
    return value


def _obtain_git(store: Store, spec: str) -> Upstream:
    import git

    repository, _, revision = spec.rpartition("@")
    if not repository or not revision:
        raise SourceError(f"--upstream {spec!r}: expected REPOSITORY@REVISION")
    refuse_option_shaped(repository, "--upstream repository")
    refuse_option_shaped(revision, "--upstream revision")
    repo = _store_repo(store)
    depth = [] if Path(repository).exists() else ["--depth=1"]
    try:
        # "--" ends git's options: what follows is only ever a repository and a refspec.
        repo.git.fetch("--no-tags", "--quiet", *depth, "--", repository, revision)
    except git.GitCommandError as exc:
        raise SourceError(f"cannot fetch {revision} from {repository}: {exc.stderr.strip()}") from exc
    fetched = repo.git.rev_parse("FETCH_HEAD^{commit}")
    listing = repo.git.ls_tree("-r", fetched).splitlines()
    gitlinks = [line.split("\t", 1)[1] for line in listing if line.startswith("160000 ")]
    if gitlinks:
        raise SourceError(
            f"{spec}: holds nested repositories (submodules) at {', '.join(gitlinks)}: "
            "their files are not in the commit; refusing (give a tree that holds them)"
        )
    tag = f"upstream/git-{fetched[:12]}"
    repo.git.tag("--force", tag, fetched)
    version = version_field(version_file_of_commit(store.upstreams_git, fetched), VERSION_RE_IN_FILE)
    return Upstream(
        kind="git",
        label=f"git-{fetched[:12]}",
        tag=tag,
        commit=fetched,
        version=version,
        release_commit=fetched,
        sha256=None,
        origin=spec,
    )


def checkout(store: Store, upstream: Upstream, dest: Path, only: list[str] | None = None) -> None:
    """Clone the store repository into ``dest`` (which must not exist) at the upstream's commit.

    All upstream tags come along, so a 3-way merge finds the blobs a patch was made against even
    when the target is another release. With ``only`` (paths) the checkout may be narrowed to them
    (``narrow``); ``narrow.widened`` completes it. Plain git processes: a caller that needs
    GitPython opens the clone itself (an apply of a clean series never imports it).
    """
    clone_at(store, dest, upstream.commit, only=only)


def clone_at(
    store: Store,
    dest: Path,
    commit: str,
    add_objects: Callable[[Path], None] | None = None,
    only: list[str] | None = None,
) -> None:
    """Clone the store repository into ``dest`` (which must not exist) and check ``commit`` out as
    the branch ``patched``; ``add_objects`` may first put more objects into the clone's git directory
    (a kept build's pack: ``kept_builds``); ``only`` narrows the checkout (``narrow.narrow``)."""
    from vllm_overlay.apply import narrow

    if dest.exists():
        raise FileExistsError(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # No explicit --local: with it git dies ("Invalid cross-device link") where the cache and the
    # output lie on different file systems; without it a local path still clones locally,
    # hardlinking objects where it can and copying them where it cannot.
    gitcmd.git(dest.parent, "clone", "--quiet", "--no-checkout", "--", str(store.upstreams_git), str(dest))
    shutil.rmtree(dest / ".git" / "hooks", ignore_errors=True)
    gitcmd.attributes_off(dest / ".git")  # the working tree is the committed tree, byte for byte
    if add_objects is not None:
        add_objects(dest / ".git")
    if only:
        narrow.narrow(dest, commit, only)
    gitcmd.git(dest, "checkout", "--quiet", "-B", "patched", commit)
