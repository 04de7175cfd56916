"""Apply the patch series onto a fresh copy of the upstream tree.

The output directory becomes a git repository: the upstream tree as the first commit (tagged
upstream/<version>), then one commit per patch, ready to inspect, amend and re-export with
export-patches. Every patch gets exactly one status: clean, offset, fuzz, merged-3way, conflict,
already-upstream or target-missing. Anything but clean fails the run unless widened on purpose
(--allow-offset, --allow-fuzz, --3way). A failed run leaves the output directory as it was.

A re-apply reuses what the output already holds, when it is untouched since this tool published
it from the same upstream.lock, upstream and options (the tree records them): with the same patch
bytes nothing is rebuilt and the recorded statuses are reported; after patch k changed, patches
k..n are re-applied on the published 1..k-1, and the result replaces the output in one step as a
full apply does. An output changed by hand in any way (a commit, an edit, a new file) is built
from upstream as before; --rebuild always builds from upstream.

One run at a time writes an output: a second one waits for the first (or, with --no-wait, exits 2
naming its pid); so it does for the cache's lock, saying once whose run it waits for. Ctrl-C or
SIGTERM stop a run with one line and exit 130; the output is left as it was (or, interrupted after
publishing, is the new tree, as the line says).

Exit codes: 0 all patches applied; 1 a patch was refused (nothing written); 2 usage or input error,
or the output or the cache busy with --no-wait; 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import project
from vllm_overlay.upstream import indexes

if TYPE_CHECKING:
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    indexes.add_argument(parser)
    parser.add_argument(
        "--upstream",
        default=None,
        metavar="VERSION|DIR|REPO@REV",
        help="upstream to patch: the locked release (default), another release by number (e.g. 0.32.0), "
        "a local source directory, or a git repository and revision",
    )
    parser.add_argument("--output", "-o", type=Path, default=None, help="patched repository (default: build/patched)")
    parser.add_argument("--allow-offset", action="store_true", help="accept hunks that apply at other lines")
    parser.add_argument("--allow-fuzz", action="store_true", help="accept hunks that apply only with reduced context")
    parser.add_argument("--3way", dest="three_way", action="store_true", help="accept patches that need a 3-way merge")
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        help="apply only this series (or this patch and nothing else); repeat for several",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the machine-readable report")
    parser.add_argument(
        "--discard-unexported",
        action="store_true",
        help="replace the output even though it holds commits or changes patches/ does not have "
        "(refused without this flag: exit 2, naming them)",
    )
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="build the output from upstream even when it already holds this build (by default an unchanged "
        "output is left as it is, and after a patch changed only it and the patches after it are re-applied)",
    )
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="if another run is writing the output or holds the cache, exit 2 (naming its pid) instead of "
        "waiting for it",
    )
    parser.add_argument(
        "--base-upstream",
        default=None,
        metavar="VERSION|DIR|REPO@REV",
        help="the upstream the series was written against (default: the lock); used for 3-way merges "
        "and the target-drift comparison",
    )


def run(args: argparse.Namespace) -> int:
    from vllm_overlay.apply import session  # imported here: --help and other verbs never need it

    request = session.Request(
        upstream=args.upstream,
        output=args.output,
        only=args.only,
        allow_offset=args.allow_offset,
        allow_fuzz=args.allow_fuzz,
        three_way=args.three_way,
        rebuild=args.rebuild,
        wait=args.wait,
        base_upstream=args.base_upstream,
        discard_unexported=args.discard_unexported,
        json=args.json,
    )
    return session.run(project.from_args(args), request)
