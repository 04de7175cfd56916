# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Puts tests/patches on sys.path (pytest does so for a conftest's folder) for shared harnesses."""
