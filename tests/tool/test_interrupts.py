"""interrupts: SIGTERM raised as KeyboardInterrupt, steps that hold signals back, children ended.

Every signal here is a real one, sent to a forked child, so pytest's own process is never at risk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from tests.tool.helpers.processes import Forked, alive
from vllm_overlay import interrupts


class Child(Forked):
    """``body(say)`` in a forked child; ``say`` writes a line to the parent. Its return value is the exit code."""

    def __init__(self, body: Callable[[Callable[[str], None]], int]) -> None:
        super().__init__(run=lambda: body(lambda line: print(line, file=sys.stderr, flush=True)))

    def line(self) -> str:
        return self.stderr.readline().strip()

    def wait(self) -> tuple[int, list[str]]:  # type: ignore[override]
        code, rest = super().wait()
        return code, rest.splitlines()


def test_sigterm_raises_keyboard_interrupt_inside_the_block_only() -> None:
    def body(say: Callable[[str], None]) -> int:
        try:
            with interrupts.terminate_as_interrupt():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            say("not interrupted")
        except KeyboardInterrupt as exc:
            say(f"interrupted:{exc}")
        say("restored" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else "not-restored")
        os.kill(os.getpid(), signal.SIGTERM)  # outside the block: SIGTERM kills as it always did
        return 0

    code, lines = Child(body).wait()
    assert lines == ["interrupted:SIGTERM", "restored"]
    assert code == -signal.SIGTERM


def test_ctrl_c_is_the_same_exception_inside_the_block() -> None:
    def body(say: Callable[[str], None]) -> int:
        try:
            with interrupts.terminate_as_interrupt():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
        except KeyboardInterrupt:
            say("interrupted")
        return 3

    assert Child(body).wait() == (3, ["interrupted"])


def test_outside_the_main_thread_the_block_changes_no_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def worker() -> None:
        with interrupts.terminate_as_interrupt():  # signal.signal would raise ValueError here
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [before] and signal.getsignal(signal.SIGTERM) == before


def test_a_deferred_step_finishes_before_a_signal_sent_during_it_arrives() -> None:
    def body(say: Callable[[str], None]) -> int:
        try:
            with interrupts.terminate_as_interrupt():
                with interrupts.deferred():
                    say("inside")
                    time.sleep(0.4)  # the parent's SIGTERM arrives now and must wait
                    say("step done")
                say("after the step")  # never reached: the held signal is raised as the block ends
        except KeyboardInterrupt as exc:
            say(f"interrupted:{exc}")
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        say("mask-restored" if not blocked & interrupts.SIGNALS else "still-blocked")
        return 0

    child = Child(body)
    assert child.line() == "inside"
    os.kill(child.pid, signal.SIGTERM)
    code, lines = child.wait()
    assert lines == ["step done", "interrupted:SIGTERM", "mask-restored"]
    assert code == 0


def test_descendants_lists_children_before_grandchildren() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    grandchild = 0
    try:
        deadline = time.monotonic() + 5
        while not interrupts.descendants(shell.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (grandchild,) = interrupts.descendants(shell.pid)
        mine = interrupts.descendants()
        assert shell.pid in mine and grandchild in mine
        assert mine.index(shell.pid) < mine.index(grandchild)
        assert interrupts.descendants(grandchild) == []
    finally:
        shell.kill()
        shell.wait()
        if grandchild:
            os.kill(grandchild, signal.SIGKILL)


def test_end_child_processes_kills_what_ignores_sigterm() -> None:
    def body(say: Callable[[str], None]) -> int:
        # A shell that ignores SIGTERM (so does the sleep it starts), and a plain sleep.
        stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 30 & wait"])
        plain = subprocess.Popen(["sleep", "30"])
        deadline = time.monotonic() + 5
        while not interrupts.descendants(stubborn.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pids = interrupts.descendants()
        say(" ".join(map(str, pids)))
        started = time.monotonic()
        interrupts.end_child_processes(grace=0.3)
        elapsed = time.monotonic() - started
        # Both were reaped by end_child_processes itself (subprocess then reads their status as 0).
        gone = plain.poll() is not None and stubborn.poll() is not None
        say("ok" if 0.3 <= elapsed < 1.5 and gone else f"bad:{elapsed}:{plain.poll()}:{stubborn.poll()}")
        return 0

    child = Child(body)
    pids = [int(p) for p in child.line().split()]
    code, lines = child.wait()
    assert (code, lines) == (0, ["ok"])
    assert len(pids) == 3
    assert [pid for pid in pids if alive(pid)] == []


def test_end_child_processes_returns_at_once_when_children_obey() -> None:
    def body(say: Callable[[str], None]) -> int:
        sleeper = subprocess.Popen(["sleep", "30"])
        started = time.monotonic()
        interrupts.end_child_processes(grace=5.0)
        quick = time.monotonic() - started < 1.0
        say(f"{alive(sleeper.pid)} {quick}")
        return 0

    assert Child(body).wait() == (0, ["False True"])


def test_end_child_processes_without_children_does_nothing() -> None:
    def body(say: Callable[[str], None]) -> int:
        started = time.monotonic()
        interrupts.end_child_processes(grace=5.0)
        say(str(time.monotonic() - started < 0.5))
        return 0

    assert Child(body).wait() == (0, ["True"])
