#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How export scales with the series: seconds and git processes for N patch commits.

Builds, for each N of ``--patches``, a repository shaped as apply-patches leaves one (an upstream
of ``--files`` modules recorded as the base, then N commits, each changing one line and carrying
a Series trailer) and runs the library's export of it (``export.export_commits``: what
``export-patches`` and ``export-patches --check`` run) ``--repeat`` times in this process. Prints
the medians of its wall time and CPU (this process and the git processes it waited for), the
git processes it started (counted at ``subprocess.Popen``), and, beside it, ``git format-patch
--stdout`` of the same range alone. Nothing here touches the project's patches/ or cache.

It imports the tool from the tree it lies in: to measure another commit, run a copy of this
script from a ``git archive`` of that commit with this checkout's interpreter. Example::

    .venv/bin/python benchmarks/export_many_patches.py --patches 15 200 500 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_overlay.apply import export  # noqa: E402  (the tool of the tree this script lies in)
from vllm_overlay.upstream.trees import IMPORT_IDENTITY  # noqa: E402  (fixed identity and dates)

MESSAGE = "mod_{module}: change line {line} ({index})\n\nWhy.\n\nSeries: bench\n"


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, **IMPORT_IDENTITY)
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_repository(root: Path, patches: int, files: int) -> Path:
    """A patched repository: an upstream commit recorded as its base, then ``patches`` commits."""
    repo = root / f"repo-{patches}"
    (repo / "vllm").mkdir(parents=True)
    for module in range(files):
        (repo / "vllm" / f"mod_{module}.py").write_text("".join(f"line_{i} = {i}\n" for i in range(1, 201)))
    git(repo, "init", "-q", "-b", "patched")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "upstream")
    git(repo, "config", "vllm-overlay.upstream", git(repo, "rev-parse", "HEAD").strip())
    for index in range(patches):
        module, line = index % files, 1 + (index // files) * 3 % 200
        path = repo / "vllm" / f"mod_{module}.py"
        path.write_text(path.read_text().replace(f"line_{line} = {line}\n", f"line_{line} = -{line}\n", 1))
        git(repo, "commit", "-qam", MESSAGE.format(module=module, line=line, index=index))
    return repo


def cpu_seconds() -> float:
    """CPU of this process and of every child it waited for, user and system."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measured(work: Callable[[], object]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and git processes of one call of ``work``."""
    started: list[str] = []
    real_init = subprocess.Popen.__init__

    def counting_init(self: subprocess.Popen[bytes], args: object, *rest: object, **options: object) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)  # type: ignore[call-overload]
        started.append(os.path.basename(str(argv[0])))
        real_init(self, args, *rest, **options)  # type: ignore[arg-type]

    subprocess.Popen.__init__ = counting_init  # type: ignore[method-assign]
    try:
        cpu, wall = cpu_seconds(), time.perf_counter()
        work()
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    finally:
        subprocess.Popen.__init__ = real_init  # type: ignore[method-assign]
    return wall, cpu, started.count("git")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patches", type=int, nargs="+", default=[15, 200, 500], help="series lengths (15 200 500)")
    parser.add_argument("--files", type=int, default=50, help="modules in the synthetic upstream (default 50)")
    parser.add_argument("--repeat", type=int, default=5, help="exports of each series (default 5)")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} cores; tool at {REPO}")
    with tempfile.TemporaryDirectory(prefix="export-many-") as tmp:
        for patches in args.patches:
            repo = make_repository(Path(tmp), patches, args.files)
            base = git(repo, "config", "--get", "vllm-overlay.upstream").strip()
            exported = len(export.export_commits(repo))  # untimed: settles the index, warms the caches
            assert exported == patches, (exported, patches)
            runs = [measured(lambda repo=repo: export.export_commits(repo)) for _ in range(args.repeat)]
            alone = [
                measured(lambda repo=repo, base=base: git(repo, "format-patch", "--stdout", f"{base}..HEAD"))
                for _ in range(args.repeat)
            ]
            wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            print(
                f"{patches:>4} patches: export {wall:.3f} s wall, {cpu:.3f} s CPU, {runs[0][2]} git processes; "
                f"git format-patch of the range alone {statistics.median(r[0] for r in alone):.3f} s wall "
                f"[n={args.repeat}, load average {os.getloadavg()[0]:.2f}]"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
