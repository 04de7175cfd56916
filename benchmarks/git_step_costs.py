#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What single git steps of a re-apply and of a full apply cost, each beside its alternative (docs/speed.md).

The figures docs/speed.md quotes for the choices made in the apply engine and the git settings
of the tool, measured the same way as speed_tool_vs_git.py (the two variants of a step run
ALTERNATELY; medians of CPU, the process and its children; the load average printed):

  check      one patch's check: ``git apply --cached --verbose`` on a copy of the tree's index
             (read and written whole) beside ``git apply --check --verbose`` on the tree
  status     the output's ``git status --porcelain=v2 --branch --untracked-files=all``: plain,
             with the untracked cache (``core.untrackedCache`` and ``status.showUntrackedFiles=all``,
             populated by a first run, on a copy of the tree), and with ``core.preloadIndex=false``
  reset      ``git reset --hard HEAD`` of the tree with ``core.preloadIndex`` on and off
  pack       ``git pack-objects --revs`` of what the series but its last patch adds, as the cache
             keeps a build (no deltas): deflated at git's default level, and stored
             (``pack.compression=0``, as ``kept_builds`` packs)
  verify     ``git verify-pack`` of that pack (stored), which a kept build's use costs
  private    the private index a first apply's untouched files are written from (``narrow``): the
             upstream's entries less the files the series touches, by ``read-tree`` then
             ``update-index --force-remove`` of the touched paths, beside ``update-index
             --index-info`` of the ``ls-tree -r`` listing less the touched entries
  split      a first apply's series on its narrowed clone (``narrow``: the files the series touches
             checked out), the check of the series on a copy of the index then ``git am`` of it,
             with the index split while narrowed (``core.splitIndex``: each write of the index
             writes the entries that changed, the shared rest written once by the checkout), as
             the apply engine narrows, beside the whole index written at each step
  loose      the same series (index split), the check, ``git am`` and the pack of what it adds
             (``kept_builds``), with the loose objects written stored (``core.looseCompression=0``,
             as the apply engine narrows) beside deflated at git's default level
  checkout   ``git checkout`` of the upstream into a ``--shared`` clone with ``checkout.workers=1``
             beside ``checkout.workers=0`` (a worker per core); wall time too, the clone removed and
             the disk synced before each
  fresh      right after a checkout (workers=0) into a new directory, the check of the whole series
             on a copy of the index (``git apply --cached --verbose`` of every patch): the copy as
             made (git takes the files as new as the index for racily clean, and hashes them when it
             writes the index) beside the copy dated a minute ahead, as the apply engine dates it
             (``_copy_index``)

The tree is the upstream with the project's series applied by hand (clone ``--shared`` of the
tool's upstream cache, checkout, ``git am``), the patch the series' last one, checked on its
parent. Run scripts/apply-patches once first (the upstream comes from the tool's cache). Example::

    .venv/bin/python benchmarks/git_step_costs.py --repeat 20 --checkouts 4
    .venv/bin/python benchmarks/git_step_costs.py --rows split,loose --repeat 12   # those rows alone
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from speed_tool_vs_git import ENV, series_files, store_repo, upstream_tag  # this folder: the same cache

from vllm_overlay import series  # importable once speed_tool_vs_git put the checkout on the path
from vllm_overlay.apply import (
    narrow,  # importable once speed_tool_vs_git put the checkout on the path
    patched_repo,  # importable once speed_tool_vs_git put the checkout on the path
)

REPO = Path(__file__).resolve().parents[1]
STATUS = ["status", "--porcelain=v2", "--branch", "--untracked-files=all", "--no-renames"]
UNTRACKED_CACHE = ["-c", "core.untrackedCache=true", "-c", "status.showUntrackedFiles=all"]


def timed(argv: list[str], env: dict[str, str] | None = None, stdin: Path | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children); ``stdin``, a file, its input."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(stdin or os.devnull, "rb") as given:
        subprocess.run(argv, check=True, stdin=given, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


ROWS: set[str] = set()  # the rows to run (--rows); empty: all


def compare(name: str, variants: dict[str, Callable[[], tuple[float, float]]], repeat: int) -> None:
    """Run each variant (a callable giving (wall, cpu)) in turn, ``repeat`` rounds, order alternating."""
    if ROWS and name not in ROWS:
        return
    results: dict[str, list[tuple[float, float]]] = {label: [] for label in variants}
    labels = list(variants)
    for round_number in range(repeat):
        for label in labels if round_number % 2 == 0 else labels[::-1]:
            results[label].append(variants[label]())
    load = os.getloadavg()[0]
    for label, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(
            f"{name:<9} {label:<48} {cpu * 1000:8.1f} ms CPU {wall * 1000:8.1f} ms wall  [n={repeat}, load {load:.2f}]"
        )


def clone_and_checkout(dest: Path, workers: str) -> list[str]:
    """Clone the tool's upstream cache into ``dest`` (``--shared``, no checkout); return the argv of
    the upstream's checkout there with ``checkout.workers=workers``, for the caller to run or time."""
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(store_repo()), str(dest)], check=True)
    return [
        "git",
        "-c",
        f"checkout.workers={workers}",
        "-C",
        str(dest),
        "checkout",
        "-q",
        "-B",
        "patched",
        upstream_tag(REPO),
    ]


def prepared_tree(scratch: Path) -> tuple[Path, Path]:
    """The upstream with the series applied by hand, and the series' last patch (HEAD's)."""
    tree = scratch / "tree"
    subprocess.run(clone_and_checkout(tree, "1"), check=True)  # git's default: one worker
    am = ["git", "-C", str(tree), "am", "-q", "--keep-cr", *series_files(REPO)]
    subprocess.run(am, check=True, env=ENV)  # a committer whatever the machine's git config says
    mail = scratch / "last.patch"
    mail.write_bytes(
        subprocess.run(
            ["git", "-C", str(tree), "format-patch", "-1", "--stdout"], check=True, capture_output=True
        ).stdout
    )
    subprocess.run(["git", "-C", str(tree), "reset", "-q", "--hard", "HEAD~1"], check=True)
    return tree, mail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="rounds of the small steps (default 20)")
    parser.add_argument("--checkouts", type=int, default=4, help="rounds of the checkout (default 4; 0: skip)")
    parser.add_argument(
        "--fresh", type=int, default=4, help="rounds of the check after a checkout (default 4; 0: skip)"
    )
    parser.add_argument("--rows", default="", help="comma-separated rows to run (default: all)")
    args = parser.parse_args()
    ROWS.update(filter(None, args.rows.split(",")))
    with tempfile.TemporaryDirectory(prefix="vllm-overlay-git-steps-") as tmp:
        scratch = Path(tmp)
        tree, mail = prepared_tree(scratch)
        git = ["git", "-C", str(tree)]
        copied_index = scratch / "run-index"

        def on_copied_index() -> tuple[float, float]:
            shutil.copyfile(tree / ".git" / "index", copied_index)
            env = {**os.environ, "GIT_INDEX_FILE": str(copied_index)}
            return timed([*git, "apply", "--cached", "--verbose", str(mail)], env)

        compare(
            "check",
            {
                "git apply --cached, a copy of the index": on_copied_index,
                "git apply --check on the tree": lambda: timed([*git, "apply", "--check", "--verbose", str(mail)]),
            },
            args.repeat,
        )
        # The untracked cache on a copy of the tree: a plain status on the same tree would rewrite
        # the cache for its own untracked-files mode at every other run.
        cached = scratch / "tree-with-untracked-cache"
        shutil.copytree(tree, cached, symlinks=True)
        with_cache = ["git", *UNTRACKED_CACHE, "-C", str(cached)]
        subprocess.run([*with_cache, "update-index", "--untracked-cache"], check=True)
        subprocess.run([*with_cache, *STATUS], check=True, capture_output=True)  # populates it
        no_preload = ["git", "-c", "core.preloadIndex=false", "-C", str(tree)]
        compare(
            "status",
            {
                "plain": lambda: timed([*git, *STATUS]),
                "untracked cache (populated; a copy of the tree)": lambda: timed([*with_cache, *STATUS]),
                "core.preloadIndex=false": lambda: timed([*no_preload, *STATUS]),
            },
            args.repeat,
        )
        compare(
            "reset",
            {
                "core.preloadIndex=true": lambda: timed(
                    ["git", "-c", "core.preloadIndex=true", "-C", str(tree), "reset", "-q", "--hard", "HEAD"]
                ),
                "core.preloadIndex=false": lambda: timed(
                    ["git", "-c", "core.preloadIndex=false", "-C", str(tree), "reset", "-q", "--hard", "HEAD"]
                ),
            },
            args.repeat,
        )
        pack_dir = scratch / "kept"
        pack_dir.mkdir()
        revs = scratch / "revs"
        revs.write_text(f"patched\n^{upstream_tag(REPO)}\n")  # the series but its last patch (the tree's HEAD)
        pack = [*git, "pack-objects", "--revs", "--window=0", "--depth=0", "-q", str(pack_dir / "pack")]
        stored = [*git, "-c", "pack.compression=0", *pack[3:]]
        compare(
            "pack",
            {
                "deflated (git's default level)": lambda: timed(pack, stdin=revs),
                "stored (pack.compression=0)": lambda: timed(stored, stdin=revs),
            },
            args.repeat,
        )
        with open(revs, "rb") as given:
            name = subprocess.run(stored, stdin=given, capture_output=True, text=True, check=True).stdout.strip()
        index = pack_dir / f"pack-{name}.idx"
        compare(
            "verify",
            {
                f"git verify-pack ({index.with_suffix('.pack').stat().st_size} B)": lambda: timed(
                    ["git", "verify-pack", str(index)]
                )
            },
            args.repeat,
        )
        private_index = scratch / "private-index"
        on_private = {**os.environ, "GIT_INDEX_FILE": str(private_index)}
        touched = narrow.touched_paths(series.load_series(REPO / "patches")) or []
        touched_list = scratch / "touched"
        touched_list.write_bytes(b"".join(name.encode() + b"\0" for name in touched))
        listing = subprocess.run([*git, "ls-tree", "-r", "-z", upstream_tag(REPO)], capture_output=True, check=True)
        untouched = scratch / "untouched"
        entries = narrow.untouched_entries(listing.stdout, touched)
        assert entries is not None, "the series is never narrowed here: no private index to compare"
        untouched.write_bytes(entries)

        def read_tree_less_touched() -> tuple[float, float]:
            private_index.unlink(missing_ok=True)
            read = timed([*git, "read-tree", upstream_tag(REPO)], on_private)
            removed = timed([*git, "update-index", "--force-remove", "-z", "--stdin"], on_private, touched_list)
            return read[0] + removed[0], read[1] + removed[1]

        def index_info_of_listing() -> tuple[float, float]:
            private_index.unlink(missing_ok=True)
            return timed([*git, "update-index", "-z", "--index-info"], on_private, untouched)

        compare(
            "private",
            {
                "read-tree + update-index --force-remove": read_tree_less_touched,
                "update-index --index-info of the listing": index_info_of_listing,
            },
            args.repeat,
        )
        split_numbers = itertools.count()

        def series_on_narrowed(*settings: str, keep: bool = False) -> tuple[float, float]:
            """The check and ``git am`` of the series on a new narrowed clone with ``settings``
            (``-c`` options above the included narrowing); with ``keep``, the pack of what it adds
            too (``kept_builds``)."""
            narrowed = scratch / f"narrowed-{next(split_numbers)}"  # none removed until the end
            checkout = clone_and_checkout(narrowed, "1")
            assert narrow.narrow(narrowed, upstream_tag(REPO), touched), "the series is never narrowed here"
            subprocess.run([checkout[0], *settings, *checkout[1:]], check=True)
            shutil.copyfile(narrowed / ".git" / "index", copied_index)
            patched_repo.date_ahead(copied_index)  # as the apply engine dates its copy
            on = ["git", *settings, "-C", str(narrowed)]
            env = {**os.environ, "GIT_INDEX_FILE": str(copied_index)}
            steps = [
                timed([*on, "apply", "--cached", "--verbose", *series_files(REPO)], env),
                timed([*on, "am", "-q", "--keep-cr", *series_files(REPO)], ENV),
            ]
            if keep:
                kept = narrowed / ".git" / "kept"
                kept.mkdir()
                revs.write_text(f"HEAD\n^{upstream_tag(REPO)}\n")
                keep_pack = ["-c", "pack.compression=0", "pack-objects", "--revs", "--window=0", "--depth=0", "-q"]
                steps.append(timed(["git", "-C", str(narrowed), *keep_pack, str(kept / "pack")], stdin=revs))
            return sum(step[0] for step in steps), sum(step[1] for step in steps)

        split, whole = ("-c", "core.splitIndex=true"), ("-c", "core.splitIndex=false")
        compare(
            "split",
            {
                "check + am, index split (as apply narrows)": lambda: series_on_narrowed(*split),
                "check + am, whole index": lambda: series_on_narrowed(*whole),
            },
            args.repeat,
        )
        compare(
            "loose",
            {
                "check + am + pack, loose objects stored": lambda: series_on_narrowed(
                    *split, "-c", "core.looseCompression=0", keep=True
                ),
                "check + am + pack, loose objects deflated (git's default)": lambda: series_on_narrowed(
                    *split, keep=True
                ),
            },
            args.repeat,
        )
        if args.fresh:  # before the checkout rounds, which remove a tree each
            fresh_numbers = itertools.count()

            def check_after_checkout(dated_ahead: bool) -> tuple[float, float]:
                # A new directory each round, none removed until the end: a checkout right after a
                # removal takes seconds here (docs/speed.md), which leaves few files as new as the
                # index; one on a machine that removed nothing just before takes under one.
                fresh = scratch / f"fresh-{next(fresh_numbers)}"
                subprocess.run(clone_and_checkout(fresh, "0"), check=True)
                shutil.copyfile(fresh / ".git" / "index", copied_index)
                if dated_ahead:
                    patched_repo.date_ahead(copied_index)  # as the apply engine dates its copy
                env = {**os.environ, "GIT_INDEX_FILE": str(copied_index)}
                return timed(["git", "-C", str(fresh), "apply", "--cached", "--verbose", *series_files(REPO)], env)

            compare(
                "fresh",
                {
                    "the series on a copy of the index, as copied": lambda: check_after_checkout(False),
                    "the series on a copy of the index, dated ahead": lambda: check_after_checkout(True),
                },
                args.fresh,
            )
        if args.checkouts:
            clone = scratch / "checkout"

            def checkout(workers: str) -> tuple[float, float]:
                shutil.rmtree(clone, ignore_errors=True)
                os.sync()
                return timed(clone_and_checkout(clone, workers))

            compare(
                "checkout",
                {
                    "checkout.workers=1": lambda: checkout("1"),
                    "checkout.workers=0 (a worker per core)": lambda: checkout("0"),
                },
                args.checkouts,
            )


if __name__ == "__main__":
    main()
