#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How apply-patches scales with the series: seconds per patch and peak memory for N patches.

Builds a synthetic upstream (a ``vllm/`` package of ``--files`` modules) and a series of N
git-format-patch files, each changing one line of one module (patches stack: each is made on
the tree the earlier ones left), then runs the real ``apply-patches`` command in a child process
against that directory upstream, with a fresh cache, ``--repeat`` times. Prints the wall time of
each run, the time per patch, and the peak resident memory of the run (the child's and its git
processes' largest, from getrusage). Nothing here touches the project's own patches/ or cache.

Example::

    python3 benchmarks/apply_many_patches.py --patches 500 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_overlay.upstream.trees import IMPORT_IDENTITY  # noqa: E402  (fixed identity and dates)

TRAILERS = (
    "Description: bench patch {index}\nOrigin: vendor\nForwarded: no\nLast-Update: 2026-12-01\n"
    "Series: bench\nTests: tests/patches/bench/test_bench.py\nTargets: vllm.mod_{module}:line_{line}\n"
)


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, **IMPORT_IDENTITY)
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_project(root: Path, patches: int, files: int) -> tuple[Path, Path]:
    """A project with ``patches`` stacked patches over an upstream of ``files`` modules."""
    upstream = root / "upstream"
    (upstream / "vllm").mkdir(parents=True)
    (upstream / "vllm" / "__init__.py").write_text("")
    (upstream / "vllm" / "_version.py").write_text(
        "__version__ = version = '9.9.9'\n__commit_id__ = commit_id = 'g0'\n"
    )
    for module in range(files):
        text = "".join(f"line_{i} = {i}\n" for i in range(1, 201))
        (upstream / "vllm" / f"mod_{module}.py").write_text(text)
    project = root / "project"
    (project / "patches" / "bench").mkdir(parents=True)
    (project / "tests" / "patches" / "bench").mkdir(parents=True)
    (project / "tests" / "patches" / "bench" / "test_bench.py").write_text("def test_x():\n    assert True\n")
    (project / "upstream.lock").write_bytes((REPO / "upstream.lock").read_bytes())
    work = root / "work"
    subprocess.run(["cp", "-r", str(upstream), str(work)], check=True)
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "upstream")
    names = []
    for index in range(patches):
        module, line = index % files, 1 + (index // files) * 3 % 200
        path = work / "vllm" / f"mod_{module}.py"
        path.write_text(path.read_text().replace(f"line_{line} = {line}\n", f"line_{line} = -{line}\n", 1))
        git(
            work,
            "commit",
            "-qam",
            f"mod_{module}: change line {line} ({index})\n\nWhy.\n\n"
            + TRAILERS.format(index=index, module=module, line=line),
        )
        name = f"bench/patch-{index:04d}.patch"
        text = git(work, "format-patch", "--zero-commit", "--no-signature", "--full-index", "-1", "--stdout")
        (project / "patches" / name).write_text(text)
        names.append(name)
    (project / "patches" / "series").write_text("\n".join(names) + "\n")
    return project, upstream


def run_once(project: Path, upstream: Path, cache: Path) -> tuple[float, int, str]:
    """One apply-patches run in a child: wall seconds, peak RSS of the child tree (KiB), its last line."""
    env = dict(os.environ, VLLM_OVERLAY_CACHE=str(cache))
    argv = [str(REPO / "scripts" / "apply-patches"), "--project", str(project)]
    argv += ["--upstream", str(upstream), "--base-upstream", str(upstream), "--discard-unexported"]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"apply-patches failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, peak, (done.stdout.strip().splitlines() or [""])[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patches", type=int, default=500, help="patches in the synthetic series (default 500)")
    parser.add_argument("--files", type=int, default=50, help="modules in the synthetic upstream (default 50)")
    parser.add_argument("--repeat", type=int, default=2, help="runs; the first also imports the upstream")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="apply-many-") as tmp:
        root = Path(tmp)
        made = time.monotonic()
        project, upstream = make_project(root, args.patches, args.files)
        print(f"made {args.patches} patches over {args.files} modules in {time.monotonic() - made:.1f} s")
        for run in range(1, args.repeat + 1):
            seconds, peak_kib, last = run_once(project, upstream, root / "cache")
            print(
                f"run {run}: {seconds:.1f} s wall, {seconds / args.patches * 1000:.0f} ms per patch, "
                f"peak RSS {peak_kib / 1024:.0f} MB ({last})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
