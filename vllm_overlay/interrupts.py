"""Ctrl-C and SIGTERM: one exception for both, steps they must not cut, child processes ended.

A command wraps its work in ``terminate_as_interrupt()`` and catches ``KeyboardInterrupt`` once:
it removes what it made, ends the git processes it started (``end_child_processes``; a SIGTERM
reaches only this process, not its children, unlike Ctrl-C at a terminal) and prints one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt, as Ctrl-C (SIGINT) does."""
    if not _in_main_thread():  # only the main thread may set handlers; nothing to do elsewhere
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for a step that must not be cut in two; they arrive after it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), children first; empty where /proc is absent."""
    if not Path("/proc/self/stat").exists():
        return []
    tree = _children_by_parent()
    found: list[int] = []
    pending = list(tree.get(pid or os.getpid(), []))
    while pending:
        child = pending.pop(0)
        found.append(child)
        pending.extend(tree.get(child, []))
    return found


def _gone(pid: int, direct: bool) -> bool:
    if direct:  # our own child: reap it (subprocess copes with a child reaped behind its back)
        try:
            return os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:
            return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].startswith("Z")  # a zombie has ended; its parent reaps it


def end_child_processes(grace: float = 2.0) -> None:
    """SIGTERM every descendant (git and what git started), SIGKILL any still there after ``grace`` s."""
    direct = set(_children_by_parent().get(os.getpid(), [])) if Path("/proc/self/stat").exists() else set()
    pids = descendants()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if not _gone(pid, pid in direct)]
            if pids:
                time.sleep(0.02)
        if not pids:
            return
