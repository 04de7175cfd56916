"""The one error path of the command line: an input error is said in one line, and the command exits 2.

Every error a user can fix by changing what they gave the tool (a lock, a series, a path, an
option, a missing program, a cache to remove) derives from :class:`InputError`; ``cli.main``
catches it once and prints it, the way a command's own ``except ... return 2`` blocks used to.
A failure of the work itself (a patch that does not apply, a test that fails, a conflict a person
must resolve) is not an input error: its command says what it found and exits 1.
"""

from __future__ import annotations


class InputError(Exception):
    """A problem with the command's input, usage or environment: exit 2 with this message."""

    exit_code = 2
