"""Carry patches/ onto the CPU runtime's release again (cpu/patches), reusing reviewed resolutions.

    scripts/carry-cpu              start: bump's git am --3way of patches/ onto cpu/upstream.lock's release
    scripts/carry-cpu --continue   after resolving the patch it stopped at (git add the files there)
    scripts/carry-cpu --abort      give up (cpu/ is written only when every patch is in)

A patch whose file is the one the current carry was made from (its sha256 in cpu/carried-from),
met on the same tree as its carried commit's parent, takes that carried commit: the resolution
and the note a person reviewed. Any other patch goes through bump (a clean 3-way goes in, a
conflict stops in build/carry-cpu/bump for a person, with rerere on). When every patch is in,
cpu/patches, cpu/upstream.lock and cpu/carried-from are written; the patches carried anew are
listed: say in each one's message what differs on the runtime's release. See docs/e2e.md.

Exit codes: 0 carried; 1 stopped for a person or refused; 2 usage or input error.
"""

from __future__ import annotations

import argparse

from vllm_overlay import output, project
from vllm_overlay.errors import WorkFailure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--continue", dest="resume", action="store_true", help="go on after resolving a stop")
    group.add_argument("--abort", action="store_true", help="give up the carry in progress")


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import bump  # when run, not for --help
    from vllm_overlay.cpu import (
        carry,  # when run, not for --help
        recarry,  # when run, not for --help
    )
    from vllm_overlay.store import Store

    root = project.from_args(args).root
    store = Store()
    # A refused or stopped carry (recarry.RecarryError, bump.BumpError) ends in cli.main: exit 1.
    try:
        if args.abort:
            for line in recarry.abort(root):
                output.info(line)
            return 0
        done = recarry.resume(root, store) if args.resume else recarry.start(root, store)
    except recarry.NeedsPerson as exc:  # the stop is bump's: name carry-cpu's own commands
        raise recarry.NeedsPerson(str(exc).replace("scripts/bump --continue", "scripts/carry-cpu --continue").replace(
            "scripts/bump --abort", "scripts/carry-cpu --abort")) from exc  # fmt: skip
    except (carry.CarryError, bump.ForeignRepository) as exc:  # input errors elsewhere; here, a carry refused
        raise WorkFailure(str(exc)) from exc
    for name in done.reused:
        output.result(f"reused from the earlier carry: {name}")
    for name in done.anew:
        output.result(f"carried anew (say in its message what differs on the runtime's release): cpu/patches/{name}")
    output.result(f"{len(done.written)} file(s) of cpu/ changed: {', '.join(done.written) or 'none'}")
    return 0
