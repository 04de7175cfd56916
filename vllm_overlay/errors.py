"""The one error path of the command line: every verb's error is one line, and its exit code says what kind.

Every error a user can fix by changing what they gave the tool (a lock, a series, a path, an
option, a missing program, a cache to remove) derives from :class:`InputError` (exit 2). A failure
of the work itself (a patch that does not apply, a stop at a conflict a person must resolve, a
carry refused) derives from :class:`WorkFailure` (exit 1). A verb raises them; ``cli.main``
catches both in one place and prints the message, so no command writes its own
``except ...: return N``. Ctrl-C (and SIGTERM, which ``interrupts`` turns into it) ends any verb
with exit 130: a verb that knows what the interruption left raises :class:`Interrupted` with that
line, any other says "interrupted".
"""

from __future__ import annotations

from vllm_overlay import output


class InputError(Exception):
    """A problem with the command's input, usage or environment: exit 2 with this message."""

    exit_code = 2


class WorkFailure(Exception):
    """The work ran and failed, or stopped for a person: exit 1 with this message."""

    exit_code = 1


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, with the one line that says what the interrupted work left behind: exit 130."""

    exit_code = 130


def report(exc: InputError | WorkFailure | Interrupted) -> int:
    """Say ``exc`` in its one line; its exit code. What ``cli.main`` does with every error a verb raises,
    also for a caller that runs a verb's work inside its own and goes on (bump's test-patches run)."""
    output.error(str(exc))
    return exc.exit_code
