"""The newcomer check (scripts/ci-readme): README's first command and its workflows, as a new user meets them.

The two commands are read from README.md itself (its "The two commands" section), and so are the
workflow blocks "Forward a patch" and "Drop a patch upstream merged" (vllm_overlay.readme_blocks),
so what is tested is what the README says. The first command runs in a fresh container of a
Debian bookworm stand-in (debootstrap: bookworm's own python3 3.11.2 with venv, git and CA
certificates, nothing else; the same stand-in as the root Dockerfile's tool stage in ci-image
--root-build), as a non-root user, in a fresh clone of this checkout made in that user's home
(uncommitted changes to the project's files carried over, so it tests what is here); then the
workflow blocks, in the same container and clone. It checks:

  1. the command exits 0 (PEP 668: the system python3 refuses pip installs, so the command must
     make its own environment);
  2. build/patched in that clone has the same tree ids, commit for commit (upstream, then one per
     patch), as this checkout's build/patched;
  3. the command leaves nothing git sees in the clone (the environment and build/ are ignored);
  4. the command run a second time reuses the environment (no new virtual environment) and gives
     the same tree;
  5. the forward block, run as pasted: without a git identity its scripts/forward refuses (exit 2,
     nothing made); with the newcomer's, every line exits 0 and build/forward/<patch> holds the branch
     forward/<patch> with one commit over the release signed off by the newcomer, and the .pr.md;
  6. the drop block, run as pasted: the audit exits 1 (rows to refresh or resolve) and counts no
     drop, bump --drop says nothing to drop, and the clone is left as it was.

The index is the one pip is configured with here (passed as PIP_INDEX_URL / PIP_EXTRA_INDEX_URL;
file:// indexes stay on the host), the Debian archive the machine's apt sources'. Needs root, buildah
and debootstrap. Exit codes: 0 passed; 1 a check failed; 2 usage, input or environment error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import git

from vllm_overlay import git as gitcmd
from vllm_overlay import output, project
from vllm_overlay.image import engine
from vllm_overlay.image.ci_checks import index_build_args, use_storage
from vllm_overlay.image.standins import (
    TOOL_PACKAGES,
    TOOL_STANDIN,
    apt_mirror,
    machine_ca_bundle,
    make_tool_standin,
    rootfs_tar,
    sh,
)
from vllm_overlay.readme_blocks import (
    DROP_SECTION,
    FORWARD_SECTION,
    ReadmeError,
    block_script,
    drop_failures,
    exit_failures,
    forward_failures,
    forward_spec,
    forward_stem,
    section_block,
    strip_comment,
    workflow_commands,
)
from vllm_overlay.store import Store

SECTION = "## The two commands"
USER = "newcomer"
HOME = f"/home/{USER}"
CHECKOUT = f"{HOME}/vllm-overlay"
# The newcomer's git identity, set before the forward block as the README asks users to have theirs.
IDENTITY = ("New Comer", "newcomer@example.org")
STATUS_FILE = f"{HOME}/.readme-block-status"  # outside the clone: each command's exit
GIT_STATUS = ["git", "status", "--porcelain", "--untracked-files=all"]  # what git sees in the clone


def readme_commands(readme: Path) -> tuple[str, str]:
    """The two commands of README's "The two commands" section: the lines of its first indented block.

    A trailing ``# comment`` is dropped; the block must hold exactly two commands.
    """
    commands = [strip_comment(line) for line in section_block(readme, SECTION)]
    if len(commands) != 2 or not all(commands):
        raise ReadmeError(f"{readme}: '{SECTION}' must open with a block of two commands, found {commands}")
    return commands[0], commands[1]


def tree_ids(repo: Path | str, runner=None) -> list[str]:
    """The tree id of every commit of HEAD's history, oldest first."""
    args = ["-C", str(repo), "log", "--reverse", "--format=%T", "HEAD"]
    if runner:  # git in the newcomer's container
        return runner(["git", *args]).split()
    done = gitcmd.process(*args, capture_output=True, text=True)
    if done.returncode != 0:
        raise engine.EngineError(f"git {' '.join(args[:2])}...: {(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout.split()


def clone_into(proj: project.Project, dest: Path) -> int:
    """A clone of this checkout at ``dest``, with its uncommitted changes to tracked and unignored files.

    Returns how many files the working tree changed against HEAD.
    """
    git.Repo.clone_from(str(proj.root), str(dest), no_hardlinks=True)
    repo = git.Repo(proj.root)
    changed = [*repo.git.ls_files("-m", "-o", "--exclude-standard", "-z").split("\0")]
    deleted = set(repo.git.ls_files("-d", "-z").split("\0"))
    for rel in {rel for rel in changed if rel} - deleted:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(proj.root / rel, dest / rel)
    for rel in deleted - {""}:
        (dest / rel).unlink(missing_ok=True)
    return len({rel for rel in changed if rel} | (deleted - {""}))


@dataclass
class Options:
    storage_driver: str = "overlay"
    suite: str = "bookworm"
    mirror: str | None = None  # None: the machine's own apt sources
    rebuild_base: bool = False


def run_check(proj: project.Project, options: Options) -> int:
    failures: list[str] = []
    figures: list[str] = []
    started = time.monotonic()
    try:
        first, second = readme_commands(proj.root / "README.md")
        workflows = {
            heading: workflow_commands(proj.root / "README.md", heading) for heading in (FORWARD_SECTION, DROP_SECTION)
        }
        forward_spec(workflows[FORWARD_SECTION])  # refused here, before the stand-in, if there is none
        output.info(f"== README command 1: {first}")
        output.info(f"   README command 2: {second}")
        if os.geteuid() != 0:
            raise engine.EngineError("ci-readme needs root (buildah with chroot isolation)")
        if not (proj.patched_tree / ".git").exists():
            raise engine.EngineError(f"no {proj.patched_tree} here to compare with: run scripts/apply-patches first")
        host_trees = tree_ids(proj.patched_tree)
        store = Store()
        use_storage(store.ci, options.storage_driver)
        eng = engine.find_engine("buildah")
        ref = TOOL_STANDIN.format(suite=options.suite)
        if options.rebuild_base and eng.image_exists(ref):
            sh(eng.exe, "rmi", "-f", ref)
        if eng.image_exists(ref):
            figures.append(f"stand-in {ref}: present (cached)")
        else:
            made = time.monotonic()
            rootfs = rootfs_tar(store.ci, options.suite, options.mirror or apt_mirror(), TOOL_PACKAGES)
            make_tool_standin(eng, ref, rootfs, machine_ca_bundle())
            figures.append(f"stand-in {ref} created in {time.monotonic() - made:.0f} s")

        container = sh(eng.exe, "from", "--pull=never", ref).splitlines()[-1]
        try:
            _newcomer(proj, eng, container, first, workflows, host_trees, failures, figures)
        finally:
            subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)
    except (ReadmeError, engine.EngineError, git.GitCommandError, OSError) as exc:
        output.error(str(exc))
        for line in figures:
            output.result(line)
        return 1 if failures else 2
    figures.append(f"ci-readme took {time.monotonic() - started:.0f} s in all")
    for line in figures:
        output.result(line)
    for failure in failures:
        output.error(failure)
    output.result("ci-readme: " + ("all checks passed" if not failures else f"{len(failures)} check(s) failed"))
    return 1 if failures else 0


def _newcomer(
    proj: project.Project,
    eng: engine.Engine,
    container: str,
    command: str,
    workflows: dict[str, list[str]],
    host_trees: list[str],
    failures: list[str],
    figures: list[str],
) -> None:
    isolation = os.environ.get("BUILDAH_ISOLATION", "chroot")
    index = index_build_args()
    env = [f"HOME={HOME}", "LANG=C.UTF-8", *(f"{key}={value}" for key, value in index.items())]

    def as_user(*argv: str, stream: bool = False, merged: bool = False) -> subprocess.CompletedProcess:
        full = [eng.exe, "run", "--isolation", isolation, "--user", USER, "--workingdir", CHECKOUT, container]
        full += ["--", "env", *env, *argv]
        if stream:  # the command's own output, as the newcomer sees it
            return subprocess.run(full, stdout=2, stderr=2, check=False)
        if merged:  # stdout and stderr in the order the newcomer sees them
            return subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        return subprocess.run(full, capture_output=True, text=True, check=False)

    def user_output(argv: list[str]) -> str:
        result = as_user(*argv)
        if result.returncode != 0:
            raise engine.EngineError(f"{' '.join(argv)} as {USER}: {(result.stderr or result.stdout).strip()[-800:]}")
        return result.stdout

    _prepare_clone(proj, eng, container, isolation, index)
    if not _two_runs(command, host_trees, failures, figures, as_user, user_output):
        return
    _forward_workflow(workflows[FORWARD_SECTION], host_trees[0], failures, figures, as_user, user_output)
    _drop_workflow(workflows[DROP_SECTION], failures, figures, as_user, user_output)


def _prepare_clone(
    proj: project.Project, eng: engine.Engine, container: str, isolation: str, index: dict[str, str]
) -> None:
    """The newcomer user made in ``container``, a fresh clone of this checkout in its home, owned by it."""
    as_root = [eng.exe, "run", "--isolation", isolation, container, "--"]
    sh(*as_root, "useradd", "--create-home", "--shell", "/bin/bash", USER)
    version = sh(*as_root, "python3", "--version")
    mount = Path(sh(eng.exe, "mount", container))
    checkout = mount / CHECKOUT.lstrip("/")
    carried = clone_into(proj, checkout)
    passwd = (mount / "etc" / "passwd").read_text(encoding="utf-8").splitlines()
    uid, gid = next(line.split(":")[2:4] for line in passwd if line.startswith(USER + ":"))
    sh("chown", "-R", f"{uid}:{gid}", str(checkout))
    output.info(
        f"== as {USER} (uid {uid}) on Debian {_debian_version(mount)}, {version}, in a fresh clone"
        + (f" (+{carried} uncommitted file(s) of this working tree)" if carried else "")
    )
    output.info(f"   index: {index.get('PIP_INDEX_URL', 'pip default of the stand-in')}")


def _two_runs(
    command: str,
    host_trees: list[str],
    failures: list[str],
    figures: list[str],
    as_user: Callable[..., subprocess.CompletedProcess],
    user_output: Callable[[list[str]], str],
) -> bool:
    """README command 1 run twice as the newcomer: its exit, its tree ids, what it leaves, the reused .venv.

    False when the command failed: the workflows need its environment.
    """
    before = user_output(GIT_STATUS)  # the carried changes, if any
    runs = []
    for attempt in (1, 2):
        output.info(f"== run {attempt}: {command}")
        began = time.monotonic()
        code = as_user("bash", "-c", command, stream=True).returncode
        runs.append(time.monotonic() - began)
        if code != 0:
            failures.append(f"README command 1, run {attempt}, exited {code} as {USER} on Debian 12 (output above)")
            return False
        _compare_trees(attempt, host_trees, user_output, failures, figures)
        if attempt == 1:
            venv = user_output(["stat", "-c", "%i %Y", ".venv/pyvenv.cfg"]).strip()
            after = user_output(GIT_STATUS)
            if after != before:
                new = sorted(set(after.splitlines()) - set(before.splitlines()))
                failures.append(f"command 1 left files git sees in the clone: {'; '.join(new)[:400]}")
            else:
                figures.append("command 1 leaves nothing git sees in the clone (.venv and build/ ignored)")
    again = user_output(["stat", "-c", "%i %Y", ".venv/pyvenv.cfg"]).strip()
    if again != venv:
        failures.append("run 2 made the virtual environment again instead of reusing it")
    else:
        figures.append("run 2 reused .venv")
    figures.append(
        f"README command 1 as {USER} on Debian 12: {runs[0]:.0f} s the first time (set-up, sdist download, apply), "
        f"{runs[1]:.0f} s again"
    )
    return True


def _run_block(
    name: str,
    block: list[str],
    as_user: Callable[..., subprocess.CompletedProcess],
    user_output: Callable[[list[str]], str],
    failures: list[str],
    figures: list[str],
) -> str:
    """A workflow block run as the newcomer, as pasted into one shell; its output, each exit checked."""
    output.info(f"== {name} workflow, as pasted:")
    for line in block:
        output.info(f"   {line}")
    began = time.monotonic()
    done = as_user("bash", "-c", block_script(block, STATUS_FILE), merged=True)
    took = time.monotonic() - began
    output.info(done.stdout.rstrip("\n"))  # what the newcomer saw, credentials of an index URL masked
    statuses = [int(word) for word in user_output(["cat", STATUS_FILE]).split()]
    failures.extend(exit_failures(name, block, statuses))
    figures.append(f"README {name} workflow as {USER}: {took:.0f} s, exits {statuses}")
    return done.stdout


def _forward_workflow(
    block: list[str],
    upstream_tree: str,
    failures: list[str],
    figures: list[str],
    as_user: Callable[..., subprocess.CompletedProcess],
    user_output: Callable[[list[str]], str],
) -> None:
    """The forward block: refused without a git identity, then run with the newcomer's, its promises checked."""
    command, spec = forward_spec(block)
    refused = as_user("bash", "-c", command)
    made = as_user("test", "-e", f"build/forward/{forward_stem(spec)}").returncode == 0
    if refused.returncode != 2 or made:
        failures.append(
            f"forward without a git identity: exit {refused.returncode}"
            + (", build/forward made" if made else "")
            + f", expected exit 2 and nothing made ({(refused.stderr or refused.stdout).strip()[-300:]})"
        )
    else:
        figures.append("forward without a git identity: refused, exit 2, nothing made")
    name, email = IDENTITY
    user_output(["git", "config", "--global", "user.name", name])
    user_output(["git", "config", "--global", "user.email", email])
    before = user_output(GIT_STATUS)
    _run_block("forward", block, as_user, user_output, failures, figures)
    found = forward_failures(
        spec,
        upstream_tree,
        f"Signed-off-by: {name} <{email}>",
        user_output,
        lambda path: as_user("test", "-e", path).returncode == 0,
    )
    if user_output(GIT_STATUS) != before:
        found.append("forward: the block left files git sees in the clone")
    failures.extend(found)
    if not found:
        figures.append(
            f"forward: branch forward/{forward_stem(spec)}, one commit over the release signed off by "
            f"{name}, its .pr.md; the clone unchanged"
        )


def _drop_workflow(
    block: list[str],
    failures: list[str],
    figures: list[str],
    as_user: Callable[..., subprocess.CompletedProcess],
    user_output: Callable[[list[str]], str],
) -> None:
    """The drop block on the real series: no patch upstream yet, so nothing dropped and nothing changed."""
    before = user_output(GIT_STATUS)
    said = _run_block("drop", block, as_user, user_output, failures, figures)
    found = drop_failures(said, before, user_output(GIT_STATUS))
    failures.extend(found)
    if not found:
        figures.append("drop: the audit counts no drop, bump --drop drops nothing, the clone unchanged")


def _compare_trees(
    attempt: int,
    host_trees: list[str],
    user_output: Callable[[list[str]], str],
    failures: list[str],
    figures: list[str],
) -> None:
    trees = tree_ids(f"{CHECKOUT}/build/patched", user_output)
    if trees != host_trees:
        failures.append(
            f"run {attempt}: build/patched has {len(trees)} commits, tree ids {[t[:12] for t in trees]}; "
            f"here {len(host_trees)}, {[t[:12] for t in host_trees]}"
        )
    else:
        figures.append(
            f"run {attempt}: build/patched has the same {len(trees)} tree ids as here (last {trees[-1][:12]})"
        )


def _debian_version(mount: Path) -> str:
    path = mount / "etc" / "debian_version"
    return path.read_text(encoding="utf-8").strip() if path.is_file() else "?"
