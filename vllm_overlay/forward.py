"""Forward one carried patch upstream: one commit on a branch of the pinned release, and its PR body.

A vLLM maintainer merges a small diff with its test beside it, signed off by its author, titled
with vLLM's tag convention, described as Purpose / Test Plan / Test Result. This module builds
exactly that from a patch of the series, and changes nothing in patches/:

* the pinned upstream is checked out into ``build/forward/<patch>`` on a branch
  ``forward/<patch>``, and the patch's diff is applied there alone: a patch made on top of an
  earlier patch is refused, naming the patch it needs and the ``--onto`` command that stacks it;
* with ``onto`` (``forward/<earlier patch>``), the branch starts from that earlier patch's
  forwarded branch instead, as a contributor stacks dependent pull requests: the earlier
  commit(s), then this patch's one commit, whose test is red on the commit it sits on;
* its ported regression test, a vLLM-style test file kept in this repository at
  ``tests/patches/<series>/upstream/<patch>/<path in vLLM's tree>``, is copied to that path;
* the commit's title is ``<tag> <subject>`` (``title_tag``), its body the patch's Why and How, its
  last line ``Signed-off-by:`` from the user's own git identity (never made up);
* the ported test runs on the pristine release (it must fail) and on the forwarded tree (it must
  pass), in the project's test environment, and the checks of the release's own
  .pre-commit-config.yaml that can run offline run on the touched files (``precommit``).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import git as gitcmd
from vllm_overlay import series
from vllm_overlay.apply import patched_repo
from vllm_overlay.env import shadow
from vllm_overlay.errors import InputError
from vllm_overlay.lint import SPDX_LINES
from vllm_overlay.series import MESSAGE_HEADINGS, Patch

# The title tag: the patch's own ``Forward-Tag:`` trailer wins; else its series' entry here; else
# [Bugfix], since a carried patch exists because the release has a defect.
TAG_TRAILER = "Forward-Tag"
SERIES_TAGS = {"workspace-reuse": "[Perf]", "byte-accounting": "[Core]"}
DEFAULT_TAG = "[Bugfix]"
TAG_RE = re.compile(r"^(\[[A-Za-z0-9/ _.-]+\])+$")
# Where a patch's ported test lives, under tests/patches/<series>/.
PORTED_DIR = "upstream"
BRANCH_PREFIX = "forward/"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class ForwardError(InputError, RuntimeError):
    """The patch cannot be forwarded as asked (exit 2): no identity, no ported test, not alone."""


@dataclass(frozen=True)
class Identity:
    name: str
    email: str

    @property
    def signoff(self) -> str:
        return f"Signed-off-by: {self.name} <{self.email}>"


@dataclass(frozen=True)
class PortedTest:
    source: Path  # the file kept in this repository
    upstream_path: str  # where it goes in vLLM's tree, e.g. tests/platforms/test_x.py


@dataclass(frozen=True)
class StackBase:
    """An earlier patch's forwarded branch that a dependent patch's branch is stacked on."""

    patch: Patch
    tree: Path  # build/forward/<earlier patch>
    branch: str  # forward/<earlier patch>
    commit: str  # its tip: the commit the dependent commit sits on
    title: str  # its tip's subject: the pull request the dependent one needs first


@dataclass(frozen=True)
class ForwardBranch:
    tree: Path
    branch: str
    base: str  # the upstream commit the branch starts from
    commit: str
    title: str
    message: str
    files: tuple[str, ...]  # every file the commit touches
    tests: tuple[str, ...]  # the ported tests, as paths in vLLM's tree
    onto: StackBase | None = None

    @property
    def sits_on(self) -> str:
        """The commit the patch's commit sits on: the upstream's, or the earlier branch's tip (stacked)."""
        return self.base if self.onto is None else self.onto.commit


def user_identity(cwd: Path) -> Identity:
    """The name and e-mail the user's own git signs with (read outside the tool's git isolation)."""
    name = gitcmd.user_setting("user.name", cwd)
    email = gitcmd.user_setting("user.email", cwd)
    if not name or not email:
        missing = " and ".join(key for key, value in (("user.name", name), ("user.email", email)) if not value)
        raise ForwardError(
            f"no git identity to sign off with ({missing} unset): set it with `git config --global user.name "
            "'Your Name'` and `git config --global user.email you@example.com`; a Signed-off-by is never made up"
        )
    return Identity(name, email)


def find_patch(patches: list[Patch], spec: str) -> tuple[Patch, list[Patch]]:
    """The patch ``SERIES/PATCH`` names (``.patch`` optional) and the patches before it in patches/series
    (of any series: a patch may be made on top of another series' patch)."""
    series_name, _, patch_name = spec.partition("/")
    stem = patch_name.removesuffix(".patch")
    if not series_name or not stem or "/" in stem:
        raise ForwardError(f"{spec!r}: expected SERIES/PATCH, e.g. byte-accounting/<file name>")
    for index, patch in enumerate(patches):
        if series_of(patch) == series_name and patch_stem(patch) == stem:
            return patch, patches[:index]
    raise ForwardError(f"{spec!r} names no patch listed in patches/series")


def find_onto(project_root: Path, patches: list[Patch], patch: Patch, onto: str, upstream: str) -> StackBase:
    """The forwarded branch ``onto`` (``forward/<earlier patch>``) names, built on ``upstream``:
    refused when it names no earlier patch, or is not built yet (with the command that builds it)."""
    stem = onto.removeprefix(BRANCH_PREFIX)
    earlier = next((p for p in patches if patch_stem(p) == stem), None)
    if earlier is None:
        raise ForwardError(f"--onto {onto}: no patch of patches/series is named {stem}")
    if patches.index(earlier) >= patches.index(patch):
        raise ForwardError(f"--onto {onto}: {earlier.name} does not come before {patch.name} in patches/series")
    tree = project_root / "build" / "forward" / stem
    branch = BRANCH_PREFIX + stem
    if not (tree / ".git").exists() or gitcmd.run(tree, "rev-parse", "--verify", "--quiet", branch)[0] != 0:
        raise ForwardError(
            f"--onto {branch}: {tree.relative_to(project_root)} holds no branch {branch}; "
            f"make it first with `scripts/forward {series_of(earlier)}/{stem}`"
        )
    commit = gitcmd.git(tree, "rev-parse", branch).strip()
    if gitcmd.run(tree, "merge-base", "--is-ancestor", upstream, commit)[0] != 0:
        raise ForwardError(
            f"--onto {branch}: it is not built on the upstream release {upstream[:12]}; make it again with "
            f"`scripts/forward {series_of(earlier)}/{stem} --replace`"
        )
    title = gitcmd.git(tree, "log", "-1", "--format=%s", commit).strip()
    return StackBase(earlier, tree, branch, commit, title)


def series_of(patch: Patch) -> str:
    return patch.name.split("/", 1)[0]


def patch_stem(patch: Patch) -> str:
    return Path(patch.name).stem


def title_tag(patch: Patch) -> str:
    """vLLM's PR tag for the patch: its ``Forward-Tag:`` trailer, else its series', else [Bugfix]."""
    tag = patch.value(TAG_TRAILER)
    if tag is not None:
        if not TAG_RE.match(tag.strip()):
            raise ForwardError(f"{patch.name}: {TAG_TRAILER}: {tag!r} is not a tag like [Bugfix] or [Core][Perf]")
        return tag.strip()
    return SERIES_TAGS.get(series_of(patch), DEFAULT_TAG)


def message_sections(message: str) -> dict[str, str]:
    """The patch message's headed sections (Why, How, ...), each its paragraphs as written."""
    sections: dict[str, str] = {}
    heading: str | None = None
    for paragraph in re.split(r"\n\s*\n", message.strip()):
        text = paragraph.strip("\n")
        if text in MESSAGE_HEADINGS:
            heading = text
            sections[heading] = ""
        elif heading is not None and not series.parse_trailers(text + "\n"):
            sections[heading] = (sections[heading] + "\n\n" + text).strip("\n")
    return sections


def commit_message(patch: Patch, identity: Identity) -> str:
    """Title, the patch's Why and How, and the user's sign-off: what vLLM's history keeps."""
    sections = message_sections(patch.message)
    body = "\n\n".join(sections[h] for h in ("Why", "How") if sections.get(h))
    return f"{title_tag(patch)} {patch.subject}\n\n{body}\n\n{identity.signoff}\n"


def harness_modules(project_root: Path) -> set[str]:
    """Modules a ported test may not import: the tool and this repository's test harnesses."""
    return {"vllm_overlay", "tests"} | {p.stem for p in (project_root / "tests" / "patches").glob("*.py")}


def ported_tests(project_root: Path, patch: Patch) -> list[PortedTest]:
    """The patch's ported tests, checked to be vLLM-style: SPDX lines first, nothing of this repository."""
    folder = project_root / "tests" / "patches" / series_of(patch) / PORTED_DIR / patch_stem(patch)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    if not files:
        raise ForwardError(
            f"{patch.name}: no ported test: write it in vLLM's style at "
            f"{folder.relative_to(project_root)}/tests/<folder vLLM keeps the module's tests in>/test_<what>.py"
        )
    forbidden = harness_modules(project_root)
    found = []
    for path in files:
        rel = path.relative_to(folder).as_posix()
        if not rel.startswith("tests/"):
            raise ForwardError(f"{path}: a ported test goes under vLLM's tests/ (its path there, from {folder})")
        if path.suffix == ".py":
            text = path.read_text(encoding="utf-8")
            if tuple(text.splitlines()[:2]) != SPDX_LINES:
                raise ForwardError(f"{path}: must start with vLLM's two SPDX lines")
            imported = _imported_modules(text, path)
            if imported & forbidden:
                raise ForwardError(f"{path}: imports {', '.join(sorted(imported & forbidden))}, which vLLM lacks")
        found.append(PortedTest(path, rel))
    return found


def _imported_modules(text: str, path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def apply_alone(tree: Path, patch: Patch, earlier: list[Patch], scratch: Path, onto: StackBase | None = None) -> None:
    """Apply the patch's diff to the tree's index and files; refuse one that needs an earlier patch
    (one the tree's branch does not hold), naming the ``--onto`` command that stacks it on that one."""
    mail = scratch / "patch.mail"
    mail.write_bytes(patch.raw)
    where = "the upstream release" if onto is None else onto.branch
    code, _, err = gitcmd.run(tree, "apply", "--index", "--check", str(mail))
    if code != 0:
        candidates = earlier if onto is None else earlier[earlier.index(onto.patch) + 1 :]
        needed = _needed_earlier(tree, mail, candidates, scratch)
        if needed is not None:
            whose = "of its series" if series_of(needed) == series_of(patch) else f"of the {series_of(needed)} series"
            stacked = (
                f"scripts/forward {series_of(patch)}/{patch_stem(patch)} --onto {BRANCH_PREFIX}{patch_stem(needed)}"
            )
            raise ForwardError(
                f"{patch.name} does not apply alone on {where}: it is made on top of "
                f"{needed.name} (the earlier patch {whose} it needs, with those before it); forward that one "
                f"first and stack this one on it (`{stacked}`), or fold them into one pull request"
            )
        raise ForwardError(f"{patch.name} does not apply on {where}: {err.strip().splitlines()[-1]}")
    gitcmd.git(tree, "apply", "--index", str(mail))


def _needed_earlier(tree: Path, mail: Path, earlier: list[Patch], scratch: Path) -> Patch | None:
    """The earlier patch after which (with those before it in patches/series) the patch applies."""
    index = scratch / "index"
    shutil.copyfile(tree / ".git" / "index", index)
    env = {"GIT_INDEX_FILE": str(index)}
    for position, before in enumerate(earlier):
        before_mail = scratch / f"earlier-{position}.mail"
        before_mail.write_bytes(before.raw)
        if gitcmd.run(tree, "apply", "--cached", str(before_mail), env=env)[0] != 0:
            return None
        if gitcmd.run(tree, "apply", "--cached", "--check", str(mail), env=env)[0] == 0:
            return before
    return None


def make_branch(
    clone: Callable[[Path], None],
    dest: Path,
    project_root: Path,
    patch: Patch,
    earlier: list[Patch],
    identity: Identity,
    base: str,
    onto: StackBase | None = None,
) -> ForwardBranch:
    """Check the upstream out at ``dest`` (``clone(dest)``), or with ``onto`` that earlier forwarded
    branch, and commit the patch and its ported test there."""
    tests = ported_tests(project_root, patch)
    message = commit_message(patch, identity)
    if dest.exists():
        raise ForwardError(f"{dest} exists: remove it (or pass --replace) to forward {patch.name} again")
    # Built beside dest and renamed into place once committed: a refused or interrupted forward
    # leaves no half-made checkout that the next run would have to be told to replace.
    partial = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        checkout = clone if onto is None else functools.partial(clone_stack, onto)
        branch = _commit_in(checkout, partial, patch, earlier, identity, tests, message, onto)
        partial.rename(dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    commit = gitcmd.git(dest, "rev-parse", "HEAD").strip()
    sits_on = base if onto is None else onto.commit
    files = gitcmd.git(dest, "diff", "--name-only", "--no-renames", sits_on, commit).split()
    return ForwardBranch(
        tree=dest,
        branch=branch,
        base=base,
        commit=commit,
        title=message.splitlines()[0],
        message=message,
        files=tuple(files),
        tests=tuple(t.upstream_path for t in tests),
        onto=onto,
    )


def clone_stack(onto: StackBase, dest: Path) -> None:
    """Clone the earlier forwarded tree at ``dest``, its branch checked out (the upstream's tags come
    along); no remote is kept, so the new tree stands alone once the earlier one is replaced."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    gitcmd.git(dest.parent, "clone", "--quiet", "--branch", onto.branch, "--", str(onto.tree), str(dest))
    shutil.rmtree(dest / ".git" / "hooks", ignore_errors=True)
    gitcmd.git(dest, "remote", "remove", "origin")


def _commit_in(
    clone: Callable[[Path], None],
    dest: Path,
    patch: Patch,
    earlier: list[Patch],
    identity: Identity,
    tests: list[PortedTest],
    message: str,
    onto: StackBase | None = None,
) -> str:
    """Clone the upstream (or ``onto``'s tree) at ``dest`` and commit the patch and its ported tests
    there, on a new branch; the branch name."""
    clone(dest)
    branch = BRANCH_PREFIX + patch_stem(patch)
    if onto is None:
        gitcmd.git(dest, "branch", "--move", "patched", branch)
    else:  # the earlier branch stays beside it, as the stacked pull request it depends on
        gitcmd.git(dest, "switch", "--quiet", "--create", branch)
    with tempfile.TemporaryDirectory(prefix="forward-") as scratch:
        apply_alone(dest, patch, earlier, Path(scratch), onto)
        for test in tests:
            target = dest / test.upstream_path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(test.source, target)
        gitcmd.git(dest, "add", "--", *(t.upstream_path for t in tests))
        message_file = Path(scratch) / "message"
        message_file.write_text(message, encoding="utf-8")
        env = {
            "GIT_AUTHOR_NAME": identity.name,
            "GIT_AUTHOR_EMAIL": identity.email,
            "GIT_COMMITTER_NAME": identity.name,
            "GIT_COMMITTER_EMAIL": identity.email,
        }
        gitcmd.git(dest, "commit", "--quiet", "--no-verify", "--cleanup=verbatim", "-F", str(message_file), env=env)
    return branch


@dataclass(frozen=True)
class TestRun:
    side: str  # "pristine" (or, stacked, the earlier branch's name) or "forwarded"
    exit_code: int
    summary: str  # pytest's closing line
    failures: tuple[str, ...]  # its FAILED / ERROR lines
    log: Path

    @property
    def red(self) -> bool:
        return self.exit_code == 1

    @property
    def green(self) -> bool:
        return self.exit_code == 0


def run_tests(python: Path, branch: ForwardBranch, workdir: Path, timeout: int = 300) -> tuple[TestRun, TestRun]:
    """The ported tests on the commit the patch's commit sits on (the pristine release, or a stacked
    branch's earlier commit), then on the forwarded commit: each tree's vllm/ files laid over the
    environment's pristine install as a shadow package, in vLLM's tests/ of the commit."""
    from vllm_overlay.testrun.trees import export_tree, extract

    shutil.rmtree(workdir, ignore_errors=True)
    root = workdir / "root"
    export_tree(branch.tree, branch.commit, ["tests", "pyproject.toml"], root)
    installed = shadow.installed_package_dir(python)

    def laid_over(commit: str, name: str) -> Path | None:
        present, deleted = patched_repo.changed_between(branch.tree, branch.base, commit, shadow.PACKAGE + "/")
        if not present and not deleted:
            return None
        replacements = extract(branch.tree, commit, present, workdir / name / "files")
        return shadow.build_shadow(installed, replacements, deleted, workdir / name / "shadow")

    red_side = "pristine" if branch.onto is None else branch.onto.branch
    runs = []
    for side, pythonpath in (
        (red_side, laid_over(branch.sits_on, "base")),
        ("forwarded", laid_over(branch.commit, "commit")),
    ):
        env = dict(os.environ, **OFFLINE_ENV, PYTHONDONTWRITEBYTECODE="1")
        if pythonpath is not None:
            env["PYTHONPATH"] = shadow.pythonpath_with(pythonpath, os.environ.get("PYTHONPATH"))
        command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--color=no"]
        command += [f"--timeout={timeout}", f"--rootdir={root}", *branch.tests]
        log = workdir / f"{side.replace('/', '-')}.log"
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
        log.write_text("$ " + " ".join(command) + "\n" + done.stdout + done.stderr, encoding="utf-8")
        runs.append(_test_run(side, done.returncode, done.stdout, log))
    return runs[0], runs[1]


def _test_run(side: str, exit_code: int, stdout: str, log: Path) -> TestRun:
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\bin [\d.]+s\b", line)), "")
    failures = tuple(line for line in lines if line.startswith(("FAILED ", "ERROR ")))
    return TestRun(side, exit_code, summary or f"pytest exit code {exit_code}", failures, log)


def pr_body(
    patch: Patch, branch: ForwardBranch, version: str, runs: tuple[TestRun, TestRun] | None, checks: list
) -> str:
    """The pull request's body, as vLLM's template asks: Purpose, Test Plan, Test Result."""
    sections = message_sections(patch.message)
    purpose = "\n\n".join(sections[h] for h in ("Why", "How", "Configurations covered") if sections.get(h))
    tests = " ".join(branch.tests)
    before = f"vLLM {version}" if branch.onto is None else f"vLLM {version} with {branch.onto.branch}"
    lines = [f"# {branch.title}", ""]
    if branch.onto is not None:
        lines += [
            f"Depends on {branch.onto.branch} ({branch.onto.title}): this branch holds that pull request's "
            "commit(s) and then this one; merge that one first, and review only the last commit here.",
            "",
        ]
    lines += [
        "## Purpose",
        "",
        purpose,
        "",
        "## Test Plan",
        "",
        f"The regression test this PR adds, on {before} as released and with this change:"
        if branch.onto is None
        else f"The regression test this PR adds, on {before} (the commit this one sits on) and with this change:",
        "",
        "```bash",
        f"pytest {tests}",
        "```",
        "",
        "## Test Result",
        "",
    ]
    if runs is None:
        lines += ["Not run here (forwarded with --skip-test-run).", ""]
    else:
        for run, label in zip(runs, (f"Without this change ({before})", "With this change"), strict=True):
            lines += [f"{label}: `{run.summary}`", *(f"    {line}" for line in run.failures), ""]
    if checks:
        lines += [f"Pre-commit hooks of vLLM {version} (.pre-commit-config.yaml) that run offline:", ""]
        lines += [f"- {check}" for check in checks]
        lines.append("")
    return "\n".join(lines)


# The release's pre-commit hooks. pre-commit installs every hook of a remote repository from the
# network, and each local hook's additional_dependencies too; offline, a hook runs here only with
# what is installed: ruff (the tool's own, under the release's pyproject.toml), a hook's binary on
# PATH, a local hook whose dependencies the interpreter has. Anything else is skipped, with why.
LOCAL_REPOS = ("local", "meta")
RUFF_HOOKS = {"ruff": "check", "ruff-check": "check", "ruff-format": "format"}
BINARY_HOOKS = {"typos": "typos", "codespell": "codespell"}
FILE_STAGES = ("pre-commit", "commit", "manual")  # the stages at which a hook checks files
OPTION_FIXES = ("--fix", "--write-changes", "-w")  # a check reports; it never rewrites the commit


@dataclass(frozen=True)
class Hook:
    id: str
    repo: str
    rev: str | None
    language: str
    entry: str
    args: tuple[str, ...] = ()
    files: str = ""
    exclude: str = "^$"
    types: tuple[str, ...] = ("file",)
    types_or: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()
    additional_dependencies: tuple[str, ...] = ()
    pass_filenames: bool = True
    always_run: bool = False


@dataclass(frozen=True)
class PreCommitConfig:
    hooks: tuple[Hook, ...]
    exclude: str
    default_stages: tuple[str, ...]


@dataclass(frozen=True)
class CheckResult:
    hook: str
    outcome: str  # passed, failed or skipped
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.hook}: {self.outcome}" + (f": {self.detail}" if self.detail else "")


def load_precommit(text: str) -> PreCommitConfig:
    """The hooks of a .pre-commit-config.yaml, with pre-commit's defaults where a key is absent."""
    import yaml

    data = yaml.safe_load(text) or {}
    hooks = []
    for repo in data.get("repos", []):
        for hook in repo.get("hooks", []):
            hooks.append(
                Hook(
                    id=str(hook.get("alias") or hook["id"]),
                    repo=str(repo["repo"]),
                    rev=str(repo["rev"]) if "rev" in repo else None,
                    language=str(hook.get("language", "unknown" if repo["repo"] not in LOCAL_REPOS else "system")),
                    entry=str(hook.get("entry", hook["id"])),
                    args=tuple(str(a) for a in hook.get("args", [])),
                    files=str(hook.get("files", "")),
                    exclude=str(hook.get("exclude", "^$")),
                    types=tuple(hook.get("types", ["file"])),
                    types_or=tuple(hook.get("types_or", [])),
                    exclude_types=tuple(hook.get("exclude_types", [])),
                    stages=tuple(hook.get("stages", [])),
                    additional_dependencies=tuple(str(d) for d in hook.get("additional_dependencies", [])),
                    pass_filenames=bool(hook.get("pass_filenames", True)),
                    always_run=bool(hook.get("always_run", False)),
                )
            )
    return PreCommitConfig(tuple(hooks), str(data.get("exclude", "^$")), tuple(data.get("default_stages", [])))


def hook_files(hook: Hook, config: PreCommitConfig, tree: Path, files: list[str]) -> list[str]:
    """The files among ``files`` the hook checks: pre-commit's files/exclude patterns and types
    (the file's tags as ``identify``, pre-commit's own library, tells them)."""
    from identify import identify

    chosen = []
    for name in files:
        if re.search(config.exclude, name) or not re.search(hook.files, name) or re.search(hook.exclude, name):
            continue
        path = tree / name
        if not path.exists():
            continue
        tags = identify.tags_from_path(str(path))
        if set(hook.types) <= tags and (not hook.types_or or tags & set(hook.types_or)):
            if not tags & set(hook.exclude_types):
                chosen.append(name)
    return chosen


@dataclass(frozen=True)
class Tools:
    """What is installed here, for the hooks to run with."""

    python: Path  # runs the local Python hooks
    ruff: bool
    which: Callable[[str], str | None] = shutil.which
    missing_dependencies: Callable[[Hook], list[str]] | None = None


def classify(hook: Hook, config: PreCommitConfig, matched: list[str], tools: Tools) -> CheckResult | None:
    """Why the hook cannot run offline here (a skipped result), or None: it can run."""
    stages = hook.stages or config.default_stages or FILE_STAGES
    if not set(stages) & set(FILE_STAGES):
        return CheckResult(hook.id, "skipped", f"runs at the {', '.join(stages)} stage, not on files")
    if not matched and not hook.always_run:
        return CheckResult(hook.id, "skipped", "no file of the commit matches its files/types")
    if hook.repo not in LOCAL_REPOS:
        if hook.id in RUFF_HOOKS and tools.ruff:
            return None
        binary = BINARY_HOOKS.get(hook.id)
        if binary and tools.which(binary):
            return None
        why = f"needs the network: pre-commit installs it from {hook.repo}"
        return CheckResult(hook.id, "skipped", why + (f", and {binary} is not installed here" if binary else ""))
    if hook.language == "python":
        missing = tools.missing_dependencies(hook) if tools.missing_dependencies else []
        if missing:
            return CheckResult(
                hook.id, "skipped", f"needs {', '.join(missing)}, not installed in {tools.python} (offline)"
            )
        return None
    if hook.language in ("system", "script"):
        return None
    return CheckResult(hook.id, "skipped", f"language {hook.language}: pre-commit builds its environment online")


def missing_dependencies(python: Path, requirements: list[str]) -> list[str]:
    """The requirements (PEP 508 strings) ``python`` does not satisfy, asked through importlib.metadata."""
    import json

    from packaging.requirements import Requirement

    parsed = [Requirement(r) for r in requirements]
    if not parsed:
        return []
    code = (
        "import importlib.metadata as m, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(found))"
    )
    done = subprocess.run(
        [str(python), "-c", code, *(r.name for r in parsed)], capture_output=True, text=True, check=False
    )
    found = json.loads(done.stdout or "{}") if done.returncode == 0 else {}
    return [str(r) for r in parsed if r.name not in found or not r.specifier.contains(found[r.name], prereleases=True)]


def run_checks(tree: Path, base: str, files: list[str], tools: Tools, timeout: int = 600) -> list[CheckResult]:
    """Every hook of the release's .pre-commit-config.yaml on ``files``: passed, failed, or skipped and why."""
    config_file = tree / ".pre-commit-config.yaml"
    if not config_file.is_file():
        return [CheckResult(".pre-commit-config.yaml", "skipped", "the release has none")]
    config = load_precommit(config_file.read_text(encoding="utf-8"))
    results = []
    style = None
    for hook in config.hooks:
        matched = hook_files(hook, config, tree, files)
        skipped = classify(hook, config, matched, tools)
        if skipped is not None:
            results.append(skipped)
        elif hook.id in RUFF_HOOKS and hook.repo not in LOCAL_REPOS:
            style = style or _ruff_style(tree, base)
            results.append(_ruff_result(hook, style))
        else:
            results.append(_run_hook(hook, tree, matched, tools, timeout))
    return results


def _ruff_style(tree: Path, base: str) -> object:
    from vllm_overlay import upstream_style

    return upstream_style.check_in_place(tree, base)


def _ruff_result(hook: Hook, style: object) -> CheckResult:
    """ruff under the release's pyproject.toml: no finding (or format change) the pristine files lack."""
    import importlib.metadata

    from vllm_overlay.upstream_style import StyleReport

    assert isinstance(style, StyleReport)
    version = importlib.metadata.version("ruff")
    pinned = f" (the release pins {hook.rev})" if hook.rev else ""
    how = f"ruff {version}{pinned}, the release's pyproject.toml"
    if RUFF_HOOKS[hook.id] == "check":
        if style.new_findings:
            return CheckResult(hook.id, "failed", f"{how}: " + "; ".join(str(f) for f in style.new_findings[:5]))
        return CheckResult(hook.id, "passed", f"{how}; no finding the pristine files lack")
    if style.newly_unformatted:
        return CheckResult(hook.id, "failed", f"{how}: ruff format would change {', '.join(style.newly_unformatted)}")
    return CheckResult(hook.id, "passed", how)


def _run_hook(hook: Hook, tree: Path, matched: list[str], tools: Tools, timeout: int) -> CheckResult:
    import shlex

    words = shlex.split(hook.entry)
    if hook.repo not in LOCAL_REPOS:  # a remote hook's binary, installed here
        words = [tools.which(BINARY_HOOKS[hook.id]) or words[0]]
    elif hook.language == "python" and words[0] in ("python", "python3"):
        words[0] = str(tools.python)
    elif hook.language == "script":
        words[0] = str(tree / words[0])
    args = [a for a in hook.args if a not in OPTION_FIXES]
    command = [*words, *args, *(matched if hook.pass_filenames else [])]
    try:
        done = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return CheckResult(hook.id, "failed", f"did not finish in {timeout} s")
    except OSError as exc:
        return CheckResult(hook.id, "skipped", f"cannot start {words[0]}: {exc.strerror}")
    if done.returncode == 0:
        return CheckResult(hook.id, "passed", f"{len(matched)} file(s)" if hook.pass_filenames else "")
    said = (done.stdout + done.stderr).strip().splitlines()
    return CheckResult(hook.id, "failed", f"exit {done.returncode}: " + " | ".join(said[-3:]))


@dataclass
class Outcome:
    branch: ForwardBranch
    runs: tuple[TestRun, TestRun] | None
    checks: list[CheckResult]
    pr_file: Path

    @property
    def ok(self) -> bool:
        red_green = self.runs is None or (self.runs[0].red and self.runs[1].green)
        return red_green and not any(c.outcome == "failed" for c in self.checks)


def forward(
    project_root: Path,
    spec: str,
    *,
    upstream: str | None = None,
    replace: bool = False,
    test_run: bool = True,
    checks: bool = True,
    onto: str | None = None,
) -> Outcome:
    """Forward the patch ``spec`` (SERIES/PATCH): the branch, the red -> green run, the checks, the PR body;
    with ``onto`` (``forward/<earlier patch>``) the branch is stacked on that earlier forwarded branch."""
    from vllm_overlay import output
    from vllm_overlay.env import testenv
    from vllm_overlay.store import Store
    from vllm_overlay.upstream import lock
    from vllm_overlay.upstream import trees as upstream_trees

    identity = user_identity(project_root)  # refused before anything is built
    locked = lock.load(project_root / lock.LOCK_NAME)
    patches = series.load_series(project_root / "patches")
    patch, earlier = find_patch(patches, spec)
    store = Store()
    source = upstream_trees.obtain(upstream, locked, store)
    stack_base = find_onto(project_root, patches, patch, onto, source.commit) if onto is not None else None
    out_dir = project_root / "build" / "forward"
    dest = out_dir / patch_stem(patch)
    if replace and dest.exists():
        shutil.rmtree(dest)
    branch = make_branch(
        lambda target: upstream_trees.checkout(store, source, target),
        dest,
        project_root,
        patch,
        earlier,
        identity,
        source.commit,
        stack_base,
    )
    on = "" if stack_base is None else f" on {stack_base.branch} {stack_base.commit[:12]}"
    output.result(f"{branch.tree}: branch {branch.branch}, commit {branch.commit[:12]} {branch.title}{on}")
    env = testenv.ensure(locked, store) if test_run else None
    runs = run_tests(env.python, branch, out_dir / f".{patch_stem(patch)}.tests") if env is not None else None
    for run in runs or ():
        output.result(f"ported test on the {run.side} tree: {run.summary} (log {run.log})")
    results: list[CheckResult] = []
    if checks:
        python = env.python if env is not None else Path(shutil.which("python3") or "python3")
        tools = Tools(
            python=python,
            ruff=_ruff_installed(),
            missing_dependencies=lambda hook: missing_dependencies(python, list(hook.additional_dependencies)),
        )
        results = run_checks(branch.tree, branch.sits_on, list(branch.files), tools)
        for result in results:
            output.result(f"pre-commit {result}")
    pr_file = out_dir / f"{patch_stem(patch)}.pr.md"
    pr_file.write_text(pr_body(patch, branch, source.label, runs, results), encoding="utf-8")
    output.result(f"wrote {pr_file}")
    return Outcome(branch, runs, results, pr_file)


def _ruff_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ruff") is not None
