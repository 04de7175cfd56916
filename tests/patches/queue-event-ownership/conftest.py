# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Imports hypothesis while the series' tests are collected, not at the end of the session.

hypothesis's pytest plugin imports hypothesis lazily, in its terminal summary. By then the
shared-memory ring buffers these tests leave to the garbage collector can be finalized in the
middle of that import's compile, which CPython 3.11 reports as "SystemError: AST constructor
recursion depth mismatch": the pytest process exits 1 after every test passed. Imported here,
before any test ran, nothing is waiting to be finalized.
"""

import hypothesis  # noqa: F401
