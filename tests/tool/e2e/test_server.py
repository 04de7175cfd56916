"""Stopping a server: its process group, leader and children."""

from __future__ import annotations

import subprocess
import sys
import time

from vllm_overlay.e2e import server


def test_stop_group_ends_the_leader_and_its_children():
    child = "import time; time.sleep(60)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(server._group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(server._group_members(proc.pid)) == 2
    server.stop_group(proc, grace=5)
    assert server._group_members(proc.pid) == []
    assert proc.returncode is not None
