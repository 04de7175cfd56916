"""Fault injection for the tests: ``VLLM_OVERLAY_KILL_AT=PHASE`` SIGKILLs the process at PHASE,
``VLLM_OVERLAY_TERM_AT=PHASE`` sends it SIGTERM there (as a user's ``kill`` would),
``VLLM_OVERLAY_INT_AT=PHASE`` SIGINT (Ctrl-C at a terminal).

The engine calls ``phase(name)`` at the points where a kill could leave something behind
(after the lock is taken, after the checkout, after a commit, around publishing), so a test can
prove in a real subprocess that every such point leaves the previous output intact and that the
next run removes every leftover. Unset, a phase costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "VLLM_OVERLAY_KILL_AT"
TERM_AT_ENV = "VLLM_OVERLAY_TERM_AT"
INT_AT_ENV = "VLLM_OVERLAY_INT_AT"


def phase(name: str) -> None:
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(TERM_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGTERM)
    if os.environ.get(INT_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGINT)
