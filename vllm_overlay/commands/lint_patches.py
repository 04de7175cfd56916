"""Check patches/ without applying anything.

Every patch parses (unidiff), is listed in series exactly once, carries the DEP-3 headers
(Description, Origin, Bug or Forwarded, Last-Update) and the project's (Series, Tests,
Upstream-Tests, Targets), touches only regular files inside the upstream tree (no absolute
paths, no '..', no symlinks or binary content), and every file named under Tests exists. Its
From: and its one Signed-off-by: trailer are its series' maintainer (maintainers.toml), and its
message, subject through the line before the trailer block, is at most 60 lines of at most 72
characters.
With --tree, paths are also resolved against that tree to catch symlinks leaving it.

README.md's index of the patches (the table between its patch-index markers: name, what each
fixes, forwarded or bug, drop when) is written from the patches' own trailers, and lint fails
naming every row that differs from what they say. --write-readme-index writes it first (after an
export, or any edit of a patch's Description, Forwarded, Bug or Applied-Upstream).

With --upstream-style [TREE] (default: build/patched, as apply-patches leaves it), the Python files
the series changes are also checked against upstream's own ruff configuration (the upstream tree's
pyproject.toml, as vLLM's pre-commit runs it): a patched file may have no ruff finding and no
formatting difference that the same file in the pristine tree does not have. Findings pristine
already has are not the series' and are not reported.

Exit codes: 0 clean; 1 problems found; 2 the upstream-style check cannot run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_overlay import output, project
from vllm_overlay.errors import InputError, WorkFailure

# --upstream-style without TREE: a marker no path given on the command line can equal (Path() would
# equal an explicit "--upstream-style .").
PATCHED_TREE = object()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument("--tree", type=Path, default=None, help="upstream tree to resolve paths against")
    parser.add_argument(
        "--write-readme-index",
        action="store_true",
        help="write README.md's index of the patches from their trailers before checking",
    )
    parser.add_argument(
        "--upstream-style",
        type=Path,
        nargs="?",
        const=PATCHED_TREE,
        default=None,
        metavar="TREE",
        help="also check the patched files against upstream's ruff configuration, pristine beside patched "
        "(TREE: the patched repository; default build/patched)",
    )


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import lint

    proj = project.from_args(args)
    if args.write_readme_index:
        _write_readme_index(proj)
    problems = lint.lint(proj.root, proj.patches, args.tree)
    for problem in problems:
        output.result(problem)
    if problems:
        raise WorkFailure(f"{len(problems)} problem(s) in patches/")
    output.info("patches/: no problems")
    if args.upstream_style is not None:
        tree = proj.patched_tree if args.upstream_style is PATCHED_TREE else args.upstream_style
        return _upstream_style(tree)
    return 0


def _write_readme_index(proj: project.Project) -> None:
    """Write README's patch index from the series as patches/ holds it, saying whether it changed."""
    from vllm_overlay import patch_index, series

    patches = series.load_series(proj.patches)
    series.parse_all_trailers(patches)
    readme = proj.root / patch_index.README_NAME
    changed = patch_index.write(readme, patches)
    output.info(f"{readme.name}: patch index {'written' if changed else 'already up to date'} ({len(patches)} patches)")


def _upstream_style(tree: Path) -> int:
    import git

    from vllm_overlay import upstream_style
    from vllm_overlay.apply import patched_repo

    try:
        base = patched_repo.upstream_base(git.Repo(tree))
        report = upstream_style.check(tree, base)
    except (
        patched_repo.NoUpstream,
        upstream_style.UpstreamStyleError,
        git.InvalidGitRepositoryError,
        git.NoSuchPathError,
    ) as exc:
        raise InputError(f"upstream style: {exc}") from exc
    for finding in report.new_findings:
        output.result(f"{finding}  (not in the pristine file)")
    for name in report.newly_unformatted:
        output.result(f"{name}: not formatted as upstream's ruff format writes it (the pristine file is)")
    summary = (
        f"{len(report.files)} changed Python file(s) under the upstream ruff configuration ({base[:12]}): "
        f"{report.pristine_findings} finding(s) pristine, {report.patched_findings} patched"
    )
    if not report.ok:
        raise WorkFailure(f"upstream style: {summary}; {len(report.new_findings) + len(report.newly_unformatted)} new")
    output.info(f"upstream style: {summary}; none new")
    return 0
