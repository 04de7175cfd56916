"""Forward one patch upstream: a branch of the pinned release with one commit a vLLM maintainer
could merge, and the pull request's body beside it.

SERIES/PATCH names a patch of patches/series (the file name, .patch optional). The pinned
upstream is checked out into build/forward/<patch> on a new branch forward/<patch>, and one
commit is made there: the patch's diff applied alone (a patch made on top of an earlier patch is
refused, naming it and the --onto command), its ported test copied from
tests/patches/<series>/upstream/<patch>/<path in vLLM's tree>, the title "<tag> <subject>" and a
Signed-off-by: line with the user's own git identity (git config user.name / user.email; none
set: refused, exit 2).

--onto forward/<earlier patch> stacks the branch, as a contributor stacks dependent pull requests:
it starts from that patch's forwarded branch in build/forward/<earlier patch> (not there: refused
with the command that makes it, exit 2), so it holds the earlier commit(s) and then this patch's
one commit. The ported test must then fail on the earlier commit and pass on this one, the hooks
check this commit's files, and the PR body says it depends on the earlier branch.

The title's tag is the patch's Forward-Tag: trailer (e.g. [Perf]); else [Perf] for the
workspace-reuse series and [Core] for byte-accounting; else [Bugfix].

The ported test then runs in the test environment on the pristine release (it must fail) and with
the commit's vllm/ files laid over it (it must pass), and every hook of the release's own
.pre-commit-config.yaml is reported on the commit's files: passed, failed, or skipped and why (a
hook pre-commit would install from the network, or whose tool or dependencies are not installed
here, is skipped, never passed). build/forward/<patch>.pr.md gets Purpose, Test Plan and Test
Result. Nothing in patches/ changes.

Exit codes: 0 forwarded, red -> green, no check failed; 1 the branch was made but the test was not
red -> green or a check failed; 2 usage or input error (no identity, no ported test, a patch that
does not apply alone, --onto a branch not built, build/forward/<patch> already there without
--replace); 130 interrupted.
"""

from __future__ import annotations

import argparse

from vllm_overlay import project


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument("patch", metavar="SERIES/PATCH", help="the patch to forward, e.g. byte-accounting/<file>")
    parser.add_argument(
        "--upstream", default=None, help="another upstream than the lock's (a release, a directory, REPO@REV)"
    )
    parser.add_argument("--replace", action="store_true", help="replace build/forward/<patch> if it exists")
    parser.add_argument(
        "--onto",
        metavar="forward/EARLIER",
        default=None,
        help="stack the branch on the earlier patch's forwarded branch (build/forward/EARLIER)",
    )
    parser.add_argument("--skip-test-run", action="store_true", help="make the branch without running the ported test")
    parser.add_argument("--skip-checks", action="store_true", help="make the branch without the pre-commit checks")


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import forward, output

    proj = project.from_args(args)
    outcome = forward.forward(
        proj.root,
        args.patch,
        upstream=args.upstream,
        replace=args.replace,
        test_run=not args.skip_test_run,
        checks=not args.skip_checks,
        onto=args.onto,
    )
    if outcome.runs is not None and not (outcome.runs[0].red and outcome.runs[1].green):
        pristine, forwarded = outcome.runs
        output.error(f"the ported test is not red -> green: pristine {pristine.summary}; forwarded {forwarded.summary}")
    failed = [c.hook for c in outcome.checks if c.outcome == "failed"]
    if failed:
        output.error(f"pre-commit check(s) failed: {', '.join(failed)}")
    return 0 if outcome.ok else 1
