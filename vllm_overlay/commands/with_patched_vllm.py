"""``with-patched-vllm``: run a command with a patched tree's vllm files laid over the install.

The files the tree changes against its upstream base are laid over the interpreter's installed
vllm package as a shadow on PYTHONPATH; the installation itself is never modified.

Exit codes: the command's own; 2 no command given, or a usage or input error (a tree that is not a
git repository, a base that is not a revision of the tree, an interpreter without vllm).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay.env import shadow
from vllm_overlay.errors import InputError

if TYPE_CHECKING:
    import git


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree", type=Path, required=True, help="patched vLLM source tree (a git repository)")
    parser.add_argument(
        "--base",
        default=None,
        help="upstream revision the tree is compared with (default: the upstream commit apply-patches "
        "recorded, else the newest upstream/* or upstream-* tag that HEAD descends from)",
    )
    parser.add_argument(
        "--python",
        default=None,
        help="interpreter whose installed vllm is overlaid (default: the command's first word "
        "if it is a Python interpreter, else python3)",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command to run")


def upstream_base(repo: git.Repo) -> str:
    """The tree's upstream base (``patched_repo.upstream_base``: the commit apply-patches recorded,
    else the newest ``upstream/*`` or ``upstream-*`` tag below HEAD), named by its upstream tag."""
    from vllm_overlay.apply import patched_repo

    try:
        return patched_repo.base_name(repo, patched_repo.upstream_base(repo))
    except patched_repo.NoUpstream as exc:
        raise patched_repo.NoUpstream(f"{exc}; pass --base") from None


def changed_package_files(tree: Path, base: str | None) -> list[str]:
    """Files of the tree that differ from the upstream revision, uncommitted edits included."""
    import git

    try:
        repo = git.Repo(tree)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise InputError(f"with-patched-vllm: --tree {tree}: not a git repository") from None
    if base is None:
        base = upstream_base(repo)
    if base.startswith("-"):
        raise InputError(f"with-patched-vllm: --base {base!r} starts with '-': git would read it as an option")
    try:
        diff = repo.git.diff("--name-only", "--no-renames", "--end-of-options", base, "--", shadow.PACKAGE)
    except git.GitCommandError:
        raise InputError(f"with-patched-vllm: --base {base!r} is not a revision of {tree}") from None
    names = set(diff.splitlines())
    names.update(p for p in repo.untracked_files if p.startswith(shadow.PACKAGE + "/"))
    return sorted(names)


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise InputError("with-patched-vllm: no command given")
    python = args.python or (cmd[0] if Path(cmd[0]).name.startswith("python") else "python3")
    changed = changed_package_files(args.tree, args.base)  # the user's input first
    try:
        installed = shadow.installed_package_dir(python)
    except OSError as exc:  # no such interpreter, or one without vllm
        raise InputError(f"with-patched-vllm: {exc}") from exc
    replacements = shadow.replacements_from_tree(args.tree, changed)
    with tempfile.TemporaryDirectory(prefix="vllm-shadow-") as tmp:
        shadow.build_shadow(installed, replacements, (), Path(tmp))
        env = dict(
            os.environ,
            PYTHONPATH=shadow.pythonpath_with(Path(tmp), os.environ.get("PYTHONPATH")),
            PYTHONDONTWRITEBYTECODE="1",  # never write bytecode through a symlink into the install
        )
        print(f"with-patched-vllm: {len(replacements)} file(s) overlaid from {args.tree}", file=sys.stderr)
        return subprocess.call(cmd, env=env)
