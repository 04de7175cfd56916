"""Audit the series against another upstream release: keep / refresh / drop / resolve.

Applies the series to the locked upstream and to the new one (3-way merges, offsets and fuzz
allowed, so every patch gets its most useful status), compares each patch's Targets symbols
between the two upstreams by AST, and writes one row per patch:

    keep      applies cleanly and nothing it targets changed
    refresh   applies, but only with offset/fuzz/3-way, or a target symbol changed: review it
    drop      upstream already carries the change (the patch reverse-applies)
    resolve   conflict or missing target file: needs a person

The project carries the series on more than one upstream line (the locked release and, where
cpu/upstream.lock and cpu/patches exist, the CPU carry). A patch that reverse-applies on the new
upstream is "drop" only when every carried line has the fix too: each line's own series is
applied onto that line's upstream (--line-upstream cpu=VERSION|DIR|REPO@REV, default its own
lock), and a row says per line "has it", "lacks it" or "does not carry it"; a fix one line
still lacks keeps the patch.

plus what the DEP-3 Forwarded / Applied-Upstream headers say, and a warning for a patch whose
Last-Update is older than --max-age-releases upstream releases. Also writes the git range-diff
of the series between the two upstreams.

A conflict row names the files still conflicting in a 3-way merge (to resolve) apart from the
files that merge, and (JSON) every failing hunk. A clean or merged row whose changed functions
use names the new tree lacks is "resolve" (a broken merge). A patch's Dependency-Targets are
compared between the dependency versions each release pins (sources from the package index,
cached): a changed symbol makes the row "refresh", a missing one "resolve". The time each phase
took is printed last (and is "seconds" in the JSON).

Exit codes: 0 every row is keep; 1 some patch needs refresh, drop or resolve; 2 usage/input error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_overlay import atomicfile, output, project
from vllm_overlay.commands import add_line_upstream_argument
from vllm_overlay.upstream import indexes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    indexes.add_argument(parser)
    parser.add_argument("--upstream", required=True, metavar="VERSION|DIR|REPO@REV", help="the new upstream")
    parser.add_argument(
        "--from", dest="old", default=None, metavar="VERSION|DIR|REPO@REV", help="the old upstream (default: the lock)"
    )
    parser.add_argument(
        "--max-age-releases", type=int, default=3, help="warn when Last-Update is older than this many releases"
    )
    parser.add_argument("--markdown", type=Path, default=None, help="write the audit table (markdown) here")
    parser.add_argument("--json", type=Path, default=None, help="write the audit (JSON) here")
    parser.add_argument("--range-diff", type=Path, default=None, help="write the git range-diff here")
    parser.add_argument("--offline", action="store_true", help="do not ask the index for release dates")
    add_line_upstream_argument(parser)


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import report, series
    from vllm_overlay.audit import lines, session
    from vllm_overlay.audit.decisions import Decision, markdown
    from vllm_overlay.store import Store
    from vllm_overlay.upstream import lock
    from vllm_overlay.upstream import trees as upstream_trees

    proj = project.from_args(args)
    the_lock = lock.load(proj.lock_file)
    patches = series.load_series(proj.patches)
    others = lines.carried_lines(proj.root)[1:]
    specs = lines.parse_line_specs(args.line_upstream, [line.name for line in others])
    dates = {} if args.offline else upstream_trees.release_dates(the_lock.project)
    result = session.run_audit(
        patches,
        the_lock,
        Store(),
        args.upstream,
        args.max_age_releases,
        dates,
        progress=lambda i, n, name: output.info(f"[{i}/{n}] {name}"),
        old_spec=args.old,
        other_lines=[(line, specs.get(line.name)) for line in others],
    )
    table = markdown(result.rows, result.old.label, result.new.label, result.lines)
    output.result(table)
    if args.markdown:
        atomicfile.write_bytes(args.markdown, table.encode("utf-8"))
    if args.json:
        report.write_json(
            {
                "old": result.old.to_json(),
                "new": result.new.to_json(),
                "rows": [row.to_json() for row in result.rows],
                "seconds": result.seconds,
                "lines": result.lines,
            },
            args.json,
        )
    if args.range_diff:
        atomicfile.write_bytes(args.range_diff, result.range_diff.encode("utf-8"))
    else:
        output.info("range-diff (old series vs the series on the new upstream):")
        output.result(result.range_diff)
    output.info("audit took " + ", ".join(f"{phase} {sec:.1f} s" for phase, sec in result.seconds.items()))
    return 0 if all(row.decision is Decision.KEEP for row in result.rows) else 1
