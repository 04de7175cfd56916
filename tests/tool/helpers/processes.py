"""A verb run in a child process that a test can kill at a phase, and waits on it."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from vllm_overlay import cli


class Forked:
    """``cli.main(argv)`` (or ``run()``) in a forked child: a real process to kill or signal, without an
    interpreter's start-up. What the child writes to stderr comes back through a pipe."""

    def __init__(
        self, argv: list[str] | None = None, env: dict[str, str] | None = None, run: Callable[[], int] | None = None
    ) -> None:
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                # Ctrl-C as a terminal delivers it: a run started in the background by a shell without
                # job control (`cmd &` in a script) inherits SIGINT ignored, and Python then keeps it so.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.dup2(write, 2)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                sys.stdout = open(os.devnull, "w")
                os.environ.update(env or {})
                code = run() if run is not None else cli.main(argv or [])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        self.stderr = os.fdopen(read, "r")

    def wait(self) -> tuple[int, str]:
        """Exit code (negative: killed by that signal) and everything it wrote to stderr."""
        err = self.stderr.read()
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1]), err

    def running(self) -> bool:
        return os.waitpid(self.pid, os.WNOHANG)[0] == 0


def wait_for(path: Path, process: Forked) -> int:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text().strip():
        assert process.running(), "the run ended before it reached git am"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return int(path.read_text())


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat[stat.rindex(")") + 2 :].startswith("Z")
