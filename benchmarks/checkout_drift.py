#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a full apply's checkout costs on this machine's file system, and why it moves (speed job 4).

A full apply and the hand way both write the upstream's 8,500 files with ``git checkout``; that
write is most of either side's time, so its cost decides the ratio speed_tool_vs_git.py prints.
This script measures, on the file system holding the scratch directory (``--scratch``, default
the system's temporary directory):

  clone     ``git clone --no-checkout`` of the tool's upstream cache, hard-linking its objects as
            the tool's clone does, beside ``--shared``, which borrows them as the hand way's does
  create    N empty files made in new directories, beside N hard links to them: the first costs
            an inode each, the second a directory entry only (CPU of this process); once first,
            once after the checkout rounds (their last tree just removed)
  checkout  ``git clone --shared --no-checkout`` of the tool's upstream cache, then ``git checkout``
            of the locked upstream, ``--rounds`` times; between rounds the clone is removed, the
            disk synced and ``--pause`` seconds waited. Each round's CPU is printed: where it grows
            from round to round, the removal of the trees before it is what the next one pays for

and says whether an ext4 file system there keeps a journal (/sys/fs/ext4/DEVICE/journal_task):
without one, ext4 checks every candidate inode for a recent deletion before it hands it out.
Run scripts/apply-patches once first (the upstream comes from the tool's cache). Example::

    .venv/bin/python benchmarks/checkout_drift.py --rounds 4 --pause 8
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from speed_tool_vs_git import store_repo, upstream_tag  # this folder: the same cache and tag

REPO = Path(__file__).resolve().parents[1]


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def journal_of(path: Path) -> str:
    """The ext4 journal's state for the file system holding ``path`` (or why it is not known)."""
    device = os.stat(path).st_dev
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        major, minor = (int(x) for x in fields[2].split(":"))
        if os.makedev(major, minor) != device:
            continue
        fstype, source = line.split(" - ", 1)[1].split()[:2]
        if fstype != "ext4":
            return f"{fstype} ({source})"
        task = Path("/sys/fs/ext4") / Path(source).name / "journal_task"
        state = task.read_text().strip() if task.is_file() else "unknown"
        return f"ext4 ({source}), journal task: {state}" + (" (no journal)" if state == "<none>" else "")
    return "unknown"


def create_and_link(scratch: Path, count: int) -> tuple[float, float]:
    """CPU seconds to create ``count`` empty files (85 per new directory), then as many hard links."""
    made, linked = scratch / "made", scratch / "linked"
    names = [Path(f"d{index // 85}", f"f{index % 85}") for index in range(count)]

    def timed_fill(root: Path, make: Callable[[Path, Path], None]) -> float:
        started = own_cpu()
        for name in names:
            if name.name == "f0":
                (root / name.parent).mkdir(parents=True)
            make(name, root / name)
        return own_cpu() - started

    create = timed_fill(made, lambda _name, path: path.touch())
    link = timed_fill(linked, lambda name, path: os.link(made / name, path))
    shutil.rmtree(made)
    shutil.rmtree(linked)
    return create, link


def clone_store(clone: Path, *options: str) -> None:
    subprocess.run(["git", "clone", "-q", "--no-checkout", *options, str(store_repo()), str(clone)], check=True)


def clone_costs(scratch: Path) -> tuple[str, float, float]:
    """What the cache's object directory holds (loose objects, packs), and the CPU seconds of a clone
    that hard-links its files (as the tool's does, so the tree it publishes needs no cache) and of
    one that borrows them (``--shared``)."""
    objects = store_repo() / "objects"
    loose = sum(1 for folder in objects.iterdir() if len(folder.name) == 2 for _ in folder.iterdir())
    packs = len(list((objects / "pack").glob("*.pack")))
    costs = []
    for options in ((), ("--shared",)):
        before = children_cpu()
        clone_store(scratch / "clone", *options)
        costs.append(children_cpu() - before)
        shutil.rmtree(scratch / "clone")
    return f"{loose} loose objects, {packs} packs", costs[0], costs[1]


def checkout_rounds(scratch: Path, rounds: int, pause: float) -> list[float]:
    tag = upstream_tag(REPO)
    clone = scratch / "clone"
    costs = []
    for _ in range(rounds):
        shutil.rmtree(clone, ignore_errors=True)
        os.sync()
        time.sleep(pause)
        clone_store(clone, "--shared")
        before = children_cpu()
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", "-B", "patched", tag], check=True)
        costs.append(children_cpu() - before)
        print(f"checkout     round {len(costs)}: {costs[-1]:.3f} s CPU", flush=True)
    shutil.rmtree(clone, ignore_errors=True)
    return costs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scratch", type=Path, default=None, help="where to write (default: the temporary directory)")
    parser.add_argument("--files", type=int, default=8500, help="files for the create/link comparison (default 8500)")
    parser.add_argument("--rounds", type=int, default=4, help="checkout rounds (default 4)")
    parser.add_argument("--pause", type=float, default=8.0, help="seconds waited after each removal (default 8)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-drift-", dir=options.scratch) as tmp:
        scratch = Path(tmp)
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} cores; {scratch}")
        print(f"file system  {journal_of(scratch)}")
        count = options.files

        def create_line(when: str) -> None:
            create, link = create_and_link(scratch, count)
            print(f"create       {when}: {count} empty files {create:.3f} s CPU; as many hard links {link:.3f} s CPU")

        create_line("first")
        held, linked, shared = clone_costs(scratch)
        print(f"clone        {held}: hard-linked {linked:.3f} s CPU, --shared {shared:.3f} s CPU")
        costs = checkout_rounds(scratch, options.rounds, options.pause)
        print(f"checkout     first {costs[0]:.3f} s, last {costs[-1]:.3f} s CPU, load average {os.getloadavg()[0]:.2f}")
        create_line("after the rounds' trees were removed")
