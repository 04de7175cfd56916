"""List what the tool's cache holds and remove test environments no current lock uses.

Every upstream bump (a new upstream.lock) or change of the test pins builds a new ~10 GB test
environment and leaves the previous one in the cache. Without options this lists the cache:
each environment as current (the one this checkout's upstream.lock uses), stale (another lock's)
or orphan (an interrupted build nobody points to), each verdict scope, and the size of every other
folder, as the cache's Store names it (``Store.present``; a folder it does not name, as such).
--prune removes the stale and orphan ones under the cache's lock; --dry-run shows what it would
remove. --env-python prints the current environment's interpreter (scripts/check runs the overlay
package's tests with it). The cache root is $VLLM_OVERLAY_CACHE, else $XDG_CACHE_HOME/vllm-overlay, else
~/.cache/vllm-overlay.

Exit codes: 0 done; 2 usage or input error.
"""

from __future__ import annotations

import argparse

from vllm_overlay import output, project
from vllm_overlay.errors import InputError

GB = 1000**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    mode = parser.add_mutually_exclusive_group()  # --env-python with --prune would silently not prune
    mode.add_argument("--prune", action="store_true", help="remove stale environments and unfinished builds")
    parser.add_argument("--dry-run", action="store_true", help="with --prune: list what would be removed")
    mode.add_argument(
        "--env-python",
        action="store_true",
        help="print the interpreter of this lock's test environment (verified pristine; built if missing), "
        'for running tests that import the real vllm: "$(scripts/cache --env-python)" -m pytest ...',
    )


def _size(size: int) -> str:
    return f"{size / GB:.2f} GB"


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import cache
    from vllm_overlay.env import testenv
    from vllm_overlay.store import Store
    from vllm_overlay.upstream import lock

    proj = project.from_args(args)
    the_lock = lock.load(proj.lock_file)
    store = Store()
    if args.dry_run and not args.prune:
        raise InputError("--dry-run only goes with --prune")
    if args.env_python:
        print(testenv.ensure(the_lock, store).python)
        return 0
    if args.prune:
        removed = cache.prune(store, the_lock, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for entry in removed:
            output.result(f"{verb} {entry.kind} {entry.path} ({_size(entry.size)}, {entry.status})")
        output.info(f"{verb} {len(removed)} item(s), {_size(sum(e.size for e in removed))}")
        return 0
    listed = cache.entries(store, the_lock)
    output.info(f"cache {store.root}; upstream.lock's environment key {cache.current_key(the_lock)}")
    for entry in listed:
        output.result(f"{entry.status:<8} {_size(entry.size):>10}  {entry.kind:<17} {entry.path}")
    reclaim = sum(e.size for e in listed if e.removable)
    output.info(f"{_size(sum(e.size for e in listed))} in all; --prune would free {_size(reclaim)}")
    return 0
