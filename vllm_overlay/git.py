"""The one door every git process of the tool goes through, and the environment it runs in.

Every ``git`` command the tool starts itself is started here (:func:`git`, :func:`run`,
:func:`process`, :func:`popen`): in one place the isolation below applies to all of them, and a
failure is one exception, :class:`GitError`, with git's own message, the command and the
repository. No other module starts a git process (a tool test scans for one).

GitPython stays where a repository is worked with as objects, not as one command's output: the apply
engine's 3-way steps (engine, classify), the upstream store's ``Repo`` (fetch, tags, clones),
export's reads of the tree, the patched repository's tags, bump, recarry, the audit, lint, the image's
build context, ci-readme's clone and with-patched-vllm read commits, tags, refs and diffs through
it; rewriting those as command lines would only re-implement its parsers. A run that needs none of
that (a re-apply on the spare) never imports it. Its processes are isolated the same way:
:func:`isolated`, entered once by ``cli.main`` for every verb, isolates this process's environment,
which GitPython reads at every call (and which the door's processes then inherit). Its failure,
``GitCommandError``, is raised as a :class:`GitError` where a step catches git failures
(:func:`gitpython_failures`, :func:`failure`), so no caller catches both types side by side.

The isolation: the user's git configuration has no say. ``core.autocrlf``, ``apply.whitespace=fix``,
``trailer.*``, ``core.hooksPath``, ``gc.auto`` and the like in ~/.gitconfig or /etc/gitconfig, and
``GIT_*`` variables in the environment (``GIT_DIR``, ``GIT_INDEX_FILE``, ``GIT_OBJECT_DIRECTORY``,
``GIT_CONFIG_PARAMETERS`` ...), would change the tree an import, ``git apply``, ``git am`` or a
commit makes, run the user's hooks, or leave a detached ``git gc --auto`` repacking a tree after the
run ended. So the global and system files are not read, every ``GIT_*`` variable but those that only
say how to reach a remote is dropped, replace refs are ignored, and the settings below are given at
command-line level, above any repository's own config. The user's name and e-mail are kept (commits
the tool makes in the user's repository stay theirs); they never change a tree.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, overload

# Variables that only say how to reach a remote or talk to the user; kept.
KEPT = (
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_ASKPASS",
    "GIT_TERMINAL_PROMPT",
    "GIT_SSL_NO_VERIFY",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_PROXY_COMMAND",
    "GIT_HTTP_USER_AGENT",
    "GIT_PYTHON_GIT_EXECUTABLE",
    "GIT_PYTHON_REFRESH",
    "GIT_PYTHON_TRACE",
)
# Given at command-line level (GIT_CONFIG_COUNT): they win over every configuration file. Mostly
# git's own defaults, pinned; hooks, attributes and automatic gc/maintenance switched off.
SETTINGS = (
    ("core.autocrlf", "false"),
    ("core.filemode", "true"),
    ("core.symlinks", "true"),
    ("core.ignorecase", "false"),
    ("core.hooksPath", os.devnull),
    ("core.attributesFile", os.devnull),
    ("core.excludesFile", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.commentChar", "#"),
    ("apply.whitespace", "warn"),
    ("apply.ignoreWhitespace", "no"),
    ("am.keepcr", "false"),
    ("am.threeWay", "false"),
    ("am.messageid", "false"),
    ("mailinfo.scissors", "false"),
    ("commit.gpgSign", "false"),
    ("commit.cleanup", "default"),
    ("tag.gpgSign", "false"),
    ("format.signOff", "false"),
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
    ("i18n.commitEncoding", "UTF-8"),
    ("gc.auto", "0"),
    ("gc.autoDetach", "false"),
    ("maintenance.auto", "false"),
    ("fetch.writeCommitGraph", "false"),
    ("init.defaultBranch", "main"),
    ("advice.detachedHead", "false"),
    ("submodule.recurse", "false"),
    ("trailer.ifexists", "addIfDifferentNeighbor"),
    ("trailer.ifmissing", "add"),
    ("trailer.where", "end"),
    ("trailer.separators", ":"),
    # One process writes a tree, as git's own default and the hand way do: a second checkout worker
    # on one tree cost this machine's file system 0.15-0.4 s more CPU for the same 8,500 files and
    # gave back no wall time on a quiet disk (docs/speed.md, 2026-12-05, fifth round). A first
    # apply still uses both cores: one writes the tree while the other applies the series (narrow).
    ("checkout.workers", "1"),
)
_IDENTITY_KEYS = ("user.name", "user.email")

# Every attribute by which git converts a file against its blob, diffs or merges it, set back to
# unspecified for every path. ``core.attributesFile`` above hides the user's file; a tree's own
# ``.gitattributes`` (an upstream's, or one a patch adds) is read from the tree itself, and no
# setting hides it. ``info/attributes`` in the repository's git directory outranks every
# ``.gitattributes`` (gitattributes(5)), so there these lines switch them off: a file is its blob
# byte for byte, on import, checkout and commit, whatever the tree holds.
ATTRIBUTES_OFF = "* !text !eol !crlf !ident !filter !working-tree-encoding !diff !merge\n"


def attributes_off(git_dir: Path) -> None:
    """Write ``ATTRIBUTES_OFF`` as ``git_dir``'s ``info/attributes`` (unless it is there already)."""
    target = git_dir / "info" / "attributes"
    try:
        if target.read_text() == ATTRIBUTES_OFF:
            return
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(ATTRIBUTES_OFF)


def _user_identity(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The user's name and e-mail from their own configuration (read once, in one git process, before
    it is hidden); the last value of each wins, as ``git config --get`` takes it."""
    try:
        done = subprocess.run(
            ["git", "config", "--global", "--null", "--get-regexp", r"^user\.(name|email)$"],
            capture_output=True,
            text=True,
            env={k: v for k, v in environ.items() if not k.startswith("GIT_CONFIG")},
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    found: dict[str, str] = {}
    for item in done.stdout.split("\0") if done.returncode == 0 else []:
        key, _, value = item.partition("\n")
        if key.lower() in _IDENTITY_KEYS and value.strip():
            found[key.lower()] = value.strip()
    return [(key, found[key]) for key in _IDENTITY_KEYS if key in found]


_identity_cache: dict[str, list[tuple[str, str]]] = {}
# The environment ``isolated`` replaced, while it is in force: what the user's own git sees.
_outside: dict[str, str] | None = None


def user_setting(key: str, cwd: Path) -> str | None:
    """``git config --get KEY`` as the user's own git answers it in ``cwd`` (their global, system and
    repository files, their ``GIT_*`` variables), read outside the isolation; None when unset.

    For what must be the user's and never the tool's: the identity a ``Signed-off-by:`` names."""
    env = dict(_outside if _outside is not None else os.environ)
    try:
        done = subprocess.run(
            ["git", "config", "--get", key], cwd=cwd, env=env, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = done.stdout.strip()
    return value if done.returncode == 0 and value else None


def outside_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with git's variables as the user has them, not as the isolation sets them.

    For a process that is the user's own run rather than a git process of the tool: the tool
    tests that test-patches starts (some check what the tool does with the user's own git
    configuration, which the isolation's injected settings would override)."""
    user = _outside if _outside is not None else os.environ
    kept = {k: v for k, v in env.items() if not k.startswith("GIT_")}
    kept.update((k, v) for k, v in user.items() if k.startswith("GIT_"))
    return kept


def environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) as every git process of the tool sees it."""
    base = dict(os.environ if base is None else base)
    home = base.get("HOME", "")
    if home not in _identity_cache:
        _identity_cache[home] = _user_identity(base)
    settings = [*SETTINGS, *_identity_cache[home]]
    env = {k: v for k, v in base.items() if not k.startswith("GIT_") or k in KEPT}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_CONFIG_COUNT=str(len(settings)),
    )
    for index, (key, value) in enumerate(settings):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Run the block with this process's environment isolated for git (restored afterwards).

    GitPython reads ``os.environ`` at every call, so every git process the block starts (through
    GitPython or subprocess, and the processes those start) runs isolated.
    """
    global _outside
    saved = dict(os.environ)
    env = environment(saved)
    outer = _outside
    _outside = saved if outer is None else outer  # a nested block: still the user's own
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _outside = outer


# --- the door -------------------------------------------------------------------------------------


class GitError(subprocess.CalledProcessError):
    """A git call failed; the message is git's own, with the command and the repository.

    Also GitPython's failure, translated (:func:`failure`): ``repo`` None, the message as GitPython
    gives its command and stderr."""

    def __init__(
        self,
        repo: Path | None,
        args: tuple[str, ...],
        returncode: int,
        stderr: bytes,
        *,
        command: list[str] | None = None,
        said: str | None = None,
    ) -> None:
        super().__init__(returncode, command or ["git", "-C", str(repo), *args], b"", stderr)
        self.repo = repo
        self.git_args = args
        self._said = said

    def __str__(self) -> str:
        if self._said is not None:
            return self._said
        stderr = self.stderr.decode(errors="replace").strip() if self.stderr else ""
        return f"git {' '.join(self.git_args)} in {self.repo}: {stderr}"


def failure(exc: BaseException) -> GitError | None:
    """``exc`` as the door's one failure type: a GitError as it is, GitPython's ``GitCommandError``
    translated; None for anything else (a run that never imported GitPython raises none of its errors)."""
    if isinstance(exc, GitError):
        return exc
    gitpython = sys.modules.get("git")
    if gitpython is None or not isinstance(exc, gitpython.GitCommandError):
        return None
    command = [str(part) for part in exc.command] if isinstance(exc.command, (list, tuple)) else [str(exc.command)]
    stderr = str(exc.stderr).strip()
    return GitError(
        None,
        tuple(command[1:]),
        exc.status if isinstance(exc.status, int) else 1,
        stderr.encode(),
        command=command,
        said=f"{' '.join(map(str, exc.command))}: {stderr}",
    )


@contextlib.contextmanager
def gitpython_failures() -> Iterator[None]:
    """Raise a GitPython failure of the block as a GitError (chained to it): callers catch one type."""
    try:
        yield
    except Exception as exc:
        translated = failure(exc)
        if translated is None or translated is exc:
            raise
        raise translated from exc


def _environment_with(extra: Mapping[str, str] | None) -> dict[str, str] | None:
    """The isolated environment, ``extra`` on top (``GIT_INDEX_FILE`` for a private index, a committer).

    Inside :func:`isolated` (every verb) this process's environment is the isolated one already:
    None (inherit it) or a copy with ``extra``, as GitPython's processes get it, instead of building
    it again for every git process (0.1 ms each). Outside it (a library caller) it is built here."""
    if _outside is not None:
        return {**os.environ, **extra} if extra else None
    env = environment()
    if extra:
        env.update(extra)
    return env


def process(*args: str, env: Mapping[str, str] | None = None, **given: Any) -> subprocess.CompletedProcess[Any]:
    """``git ARGS`` run to its end, isolated, ``env`` on top; ``given``: ``subprocess.run``'s own
    options (``capture_output``, ``input``, ``stdin``, ``check``, ``text``, ``cwd`` ...)."""
    return subprocess.run(["git", *args], env=_environment_with(env), **given)


def popen(*args: str, env: Mapping[str, str] | None = None, **given: Any) -> subprocess.Popen[Any]:
    """``git ARGS`` started, isolated, ``env`` on top, for a caller that streams its input or output;
    ``given``: ``subprocess.Popen``'s own options."""
    return subprocess.Popen(["git", *args], env=_environment_with(env), **given)


@overload
def git(
    repo: Path | str,
    *args: str,
    binary: Literal[False] = False,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> str: ...
@overload
def git(
    repo: Path | str,
    *args: str,
    binary: Literal[True],
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> bytes: ...
def git(
    repo: Path | str,
    *args: str,
    binary: bool = False,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> str | bytes:
    """``git -C repo ARGS``: its stdout (text unless ``binary``); GitError when it fails.

    ``env`` is added to the isolated environment (``GIT_INDEX_FILE`` for a private index)."""
    result = process("-C", str(repo), *args, env=env, input=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        raise GitError(Path(repo), args, result.returncode, result.stderr)
    return result.stdout if binary else result.stdout.decode()


def run(
    repo: Path | str, *args: str, env: Mapping[str, str] | None = None, stdin: Path | None = None
) -> tuple[int, str, str]:
    """``git -C repo ARGS``, which may fail: its exit status, stdout and stderr (text).

    ``env`` is added to the isolated environment; ``stdin``, a file, is git's standard input.
    For the steps whose failure is an answer (``git apply`` of a patch that may not apply).
    """
    with open(stdin if stdin is not None else os.devnull, "rb") as given:
        done = process("-C", str(repo), *args, env=env, stdin=given, capture_output=True, check=False)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
