# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The differential oracle's plumbing: pristine vLLM beside the patched tree,
one long-lived child process each, and the intended differences as data.

The test process runs with the patched tree's shadow package first on
PYTHONPATH (scripts/test-patches puts it there). The patched child inherits
that; the pristine child gets the same environment without the PYTHONPATH
entries that hold a ``vllm`` package, so ``import vllm`` there resolves to the
test environment's installed, pristine 0.33.0. Each child imports vLLM once
and then answers one JSON request per line, so hypothesis can run hundreds of
examples in the parent without paying vLLM's import per example.

Hypothesis settings: the profile ``ci`` (a fixed example budget per
subsystem, set by each oracle module) unless VLLM_OVERLAY_ORACLE_PROFILE is
``deep``; the example database lives where VLLM_OVERLAY_ORACLE_DB says
(test-patches: in its cache), so a failing example is replayed first next
time.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# How long a child may take to import vLLM and say which it imported.
START_BOUND_S = 180.0


def pristine_env() -> dict[str, str]:
    """This process's environment without the PYTHONPATH entries that shadow ``vllm``."""
    env = dict(os.environ)
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in entries if not (Path(p) / "vllm" / "__init__.py").exists()]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


class Side:
    """One child process running ``script``: requests in, traces out, every wait bounded."""

    def __init__(self, name: str, script: Path, env: dict[str, str]) -> None:
        self.name = name
        self.script = script.resolve()
        self.env = dict(env, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
        self.restarts = 0
        self._spawn()

    def _start(self) -> None:
        self._spawn()
        self.wait_ready()

    def _spawn(self) -> None:
        self.lines: queue.Queue = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, str(self.script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=self.script.parent,
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def wait_ready(self) -> None:
        """Wait for the child to say which vllm it imported."""
        hello = self._line(START_BOUND_S)
        if hello is None:
            self.close()
            raise RuntimeError(f"the {self.name} side did not start within {START_BOUND_S} s")
        self.vllm_dir = hello["vllm"]

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _line(self, timeout: float) -> dict[str, Any] | None:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        return None if line is None else json.loads(line)

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any]:
        """The trace of the last request; a child that hangs or dies is replaced."""
        trace = self._line(timeout)
        if trace is None:
            self.close()
            self.restarts += 1
            self._start()
            return {"child_hung": f"no trace within {timeout} s; the child was replaced"}
        return trace

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


class Sides:
    """Pristine and patched, each in its own child, fed the same requests."""

    def __init__(self, script: Path) -> None:
        self.pristine = Side("pristine", script, pristine_env())
        self.patched = Side("patched", script, dict(os.environ))
        self.pristine.wait_ready()
        self.patched.wait_ready()
        # Without a shadow (a run outside test-patches) both sides import the
        # installed vllm: the oracle then checks that it agrees with itself.
        self.same_vllm = self.pristine.vllm_dir == self.patched.vllm_dir

    def run(self, request: dict[str, Any], timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
        self.pristine.send(request)
        self.patched.send(request)
        return self.pristine.receive(timeout), self.patched.receive(timeout)

    def close(self) -> None:
        self.pristine.close()
        self.patched.close()


def series_patches(root: Path = PROJECT_ROOT) -> set[str]:
    """The patch file names patches/series lists (the intended differences that apply)."""
    names = set()
    for line in (root / "patches" / "series").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(Path(line.split()[0]).name)
    return names


def intended_differences(path: Path, patches: set[str] | None = None) -> list[dict[str, Any]]:
    """The differences the patches of the series intend, each tagged with its patch.

    ``path`` is a TOML file beside the patches' tests: one table per patch file
    name, each with a ``difference`` array of tables.
    """
    patches = series_patches() if patches is None else patches
    data = tomllib.loads(path.read_text())
    found = []
    for patch, table in data.items():
        if patch not in patches:
            continue
        for entry in table.get("difference", []):
            found.append(dict(entry, patch=patch))
    return found


def oracle_settings(ci_examples: int, deep_examples: int) -> settings:
    """Hypothesis settings for one subsystem's oracle: its fixed budget, or the deep one."""
    deep = os.environ.get("VLLM_OVERLAY_ORACLE_PROFILE") == "deep"
    db = os.environ.get("VLLM_OVERLAY_ORACLE_DB")
    return settings(
        max_examples=deep_examples if deep else ci_examples,
        deadline=None,
        database=DirectoryBasedExampleDatabase(db) if db else None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        print_blob=True,
        derandomize=False,
    )


_VIOLATIONS: dict[str, type[AssertionError]] = {}


def violation(kind: str) -> type[AssertionError]:
    """The exception type of one kind of break of the property: one per kind, so that hypothesis keeps
    distinct defects apart and shrinks each to its own minimal example."""
    if kind not in _VIOLATIONS:
        _VIOLATIONS[kind] = type(f"OracleViolation[{kind}]", (AssertionError,), {})
    return _VIOLATIONS[kind]
