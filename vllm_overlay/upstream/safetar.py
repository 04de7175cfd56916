"""Extract a tar archive without letting it write outside its directory or take owners from it.

Two code paths with the same refusals:

- where tarfile has the ``data`` extraction filter (Python 3.11.4+, 3.12+), that filter, with absolute
  member names refused first (the filter would silently strip the leading "/");
- where it does not (Python 3.11.0-3.11.3: Debian 12's 3.11.2), the same checks done here, each member
  checked just before it is extracted, so a link extracted earlier is followed when the next name is
  resolved, exactly as the filter does.

Refused: absolute member names, names that resolve outside the directory (``..``, or through a link
extracted before), symbolic links that are absolute or point outside it, hard links to a target
outside it, device files and FIFOs. Kept from the archive: names, contents, link targets, mtimes and
the permission bits without setuid/setgid/sticky and group/other write; never the owner ids or names
(a tree owned by another user is one git refuses to work in).
"""

from __future__ import annotations

import copy
import os
import tarfile
from pathlib import Path

# tarfile.data_filter exists from Python 3.11.4 / 3.12; tests switch this off to run the other path.
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
_FILTER_ERROR: type[Exception] | tuple[()] = getattr(tarfile, "FilterError", ())  # absent where the filter is


class UnsafeArchive(Exception):
    """The archive holds a member this module refuses to extract."""


def extract_all(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract every member of ``tar`` (random-access or stream mode) under ``dest``; raise UnsafeArchive."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if HAS_DATA_FILTER:
            tar.extractall(dest, filter=_refuse_absolute_then_data)
        else:
            # numeric_owner with uid/gid -1 (see _checked): a root process's chown changes nothing.
            tar.extractall(dest, members=_checked_members(tar, os.path.realpath(dest)), numeric_owner=True)
    except _FILTER_ERROR as exc:
        raise UnsafeArchive(str(exc)) from exc


def _refuse_absolute_then_data(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    _refuse_absolute(member)
    return tarfile.data_filter(member, dest)  # type: ignore[attr-defined]


def _refuse_absolute(member: tarfile.TarInfo) -> None:
    if member.name.startswith(("/", os.sep)) or os.path.isabs(member.name):
        raise UnsafeArchive(f"absolute member name {member.name!r}")


def _inside(path: str, dest: str) -> bool:
    return os.path.commonpath([path, dest]) == dest


def _checked_members(tar: tarfile.TarFile, dest: str):
    """Each member checked (against the tree as extracted so far) and sanitized, as extractall asks for it."""
    for member in tar:
        yield _checked(member, dest)


def _checked(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """What the data filter does to ``member``, for an interpreter that lacks it."""
    _refuse_absolute(member)
    name = member.name
    target = os.path.realpath(os.path.join(dest, name))
    if not _inside(target, dest):
        raise UnsafeArchive(f"member {name!r} would be extracted to {target}, outside {dest}")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchive(f"member {name!r} is a special file (device or FIFO)")
    if member.issym() or member.islnk():
        if os.path.isabs(member.linkname):
            raise UnsafeArchive(f"link {name!r} points to an absolute path {member.linkname!r}")
        base = os.path.join(dest, os.path.dirname(name)) if member.issym() else dest
        link_target = os.path.realpath(os.path.join(base, member.linkname))
        if not _inside(link_target, dest):
            raise UnsafeArchive(f"link {name!r} points outside {dest} ({link_target})")
        # tarfile copies a hard link's target out of the archive, attributes and all, when the target is
        # not on disk yet; an sdist links only to files it already holds.
        if member.islnk() and not os.path.isfile(link_target):
            raise UnsafeArchive(f"hard link {name!r} to {member.linkname!r}, which is not an extracted file")
    if not member.isdir() and os.path.isdir(target) and not os.path.islink(target):
        raise UnsafeArchive(f"member {name!r} would replace a directory")
    safe = copy.copy(member)
    mode = member.mode & 0o755  # no setuid/setgid/sticky, no group/other write
    if member.isreg() or member.islnk():
        if not mode & 0o100:
            mode &= ~0o111
        mode |= 0o600
    elif member.isdir():
        mode |= 0o700
    safe.mode = mode
    safe.uid = safe.gid = -1  # os.chown(path, -1, -1) keeps the extracting user's ownership
    safe.uname = safe.gname = ""
    return safe
