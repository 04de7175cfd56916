"""README's shell blocks as scripts/ci-readme reads, runs and judges them.

What ci-readme runs is read from README.md itself, so what is tested is the text users read: the
two commands, and the workflow blocks "Forward a patch" and "Drop a patch upstream merged", each
the first indented block of its section. A workflow block is run as it would be pasted into one
shell (a ``cd`` carries over to the next line), every line as it is: a block holding a
placeholder such as ``<patch>`` is refused, as users could not paste it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

FORWARD_SECTION = "### Forward a patch"
DROP_SECTION = "### Drop a patch upstream merged"
# <series>, <patch>, <commit of patch k-1>; not a redirection such as `sort <in >out`
PLACEHOLDER = re.compile(r"<[A-Za-z][\w.-]*(?: [\w.-]+)*>")
HEADING = re.compile(r"#{1,6} ")
# What each command of a workflow block exits with when it does what the README says: 0, but the
# audit's, which exits 1 while any row is not keep (the README says the new release needs refreshes).
EXPECTED_EXIT = {"scripts/audit-upstream": 1}
TOTALS = re.compile(r"^Totals: .*\bdrop (\d+)\b", re.MULTILINE)


class ReadmeError(RuntimeError):
    """README.md does not hold a block where ci-readme reads it, or holds one users could not paste."""


def section_block(readme: Path, heading: str) -> list[str]:
    """The lines of the first indented block of section ``heading``, indentation removed.

    The block ends at its first blank or unindented line; none before the next heading is an empty list.
    """
    lines = readme.read_text(encoding="utf-8").splitlines()
    try:
        start = lines.index(heading) + 1
    except ValueError as exc:
        raise ReadmeError(f"{readme}: no '{heading}' section") from exc
    block: list[str] = []
    for line in lines[start:]:
        if HEADING.match(line):
            break
        if line.startswith("    ") and line.strip():
            block.append(line[4:])
        elif block:
            break
    return block


def strip_comment(line: str) -> str:
    """The command of a block line: a trailing ``# comment`` (and a line that is only one) dropped."""
    return "" if line.lstrip().startswith("#") else re.sub(r"\s+#.*$", "", line).strip()


def workflow_commands(readme: Path, heading: str) -> list[str]:
    """The lines of a workflow block, as users paste them (comments kept: the shell ignores them).

    Refused: no section, no block, a placeholder in a command, a line continued with a backslash.
    """
    block = section_block(readme, heading)
    commands = [strip_comment(line) for line in block]
    if not any(commands):
        raise ReadmeError(f"{readme}: '{heading}' holds no block of commands")
    for command in commands:
        if found := PLACEHOLDER.search(command):
            raise ReadmeError(f"{readme}: '{heading}' has a placeholder, {found.group()}, in `{command}`")
        if command.endswith("\\"):
            raise ReadmeError(f"{readme}: '{heading}' continues a line (`{command}`): write one command a line")
    return block


def block_script(block: list[str], status_file: str) -> str:
    """The block as one bash script that appends each command's exit status to ``status_file``.

    The lines run as pasted into one shell, each exactly as written; only the status lines are added.
    """
    quoted = shlex.quote(status_file)
    lines = [f": > {quoted}"]
    for line in block:
        lines.append(line)
        if strip_comment(line):
            lines.append(f'echo "$?" >> {quoted}')
    return "\n".join(lines) + "\n"


def exit_failures(name: str, block: list[str], statuses: list[int]) -> list[str]:
    """Each command of the block that did not exit as expected (:data:`EXPECTED_EXIT`), or did not run."""
    commands = [command for command in map(strip_comment, block) if command]
    failures = []
    for index, command in enumerate(commands):
        expected = next((code for prefix, code in EXPECTED_EXIT.items() if command.startswith(prefix + " ")), 0)
        if index >= len(statuses):
            failures.append(f"{name}: `{command}` did not run (the block ended before it)")
        elif statuses[index] != expected:
            failures.append(f"{name}: `{command}` exited {statuses[index]}, expected {expected} (output above)")
    return failures


def forward_spec(block: list[str]) -> tuple[str, str]:
    """The forward block's ``scripts/forward`` command and the SERIES/PATCH it forwards."""
    for command in map(strip_comment, block):
        words = shlex.split(command)
        if words[:1] == ["scripts/forward"]:
            spec = next((word for word in words[1:] if not word.startswith("-")), None)
            if spec:
                return command, spec
    raise ReadmeError(f"'{FORWARD_SECTION}' runs no `scripts/forward SERIES/PATCH`")


def forward_stem(spec: str) -> str:
    """The name scripts/forward gives the patch's folder and branch: the file name without .patch."""
    return spec.rsplit("/", 1)[-1].removesuffix(".patch")


def forward_failures(
    spec: str, upstream_tree: str, signoff: str, user_output: Callable[[list[str]], str], exists: Callable[[str], bool]
) -> list[str]:
    """What the forward block promises, checked in the clone it ran in.

    The branch forward/<patch> in build/forward/<patch>, one commit over the release (the parent's
    tree is the upstream tree), its last line the user's ``signoff``, and the .pr.md beside it.
    """
    stem = forward_stem(spec)
    tree = f"build/forward/{stem}"
    if not exists(f"{tree}/.git"):
        return [f"forward: no {tree} after the block"]
    failures = []
    branch = user_output(["git", "-C", tree, "rev-parse", "--abbrev-ref", "HEAD"]).strip()
    if branch != f"forward/{stem}":
        failures.append(f"forward: {tree} is on {branch!r}, not forward/{stem}")
    trees = user_output(["git", "-C", tree, "log", "--format=%T", "HEAD"]).split()
    if len(trees) != 2 or trees[1] != upstream_tree:
        failures.append(
            f"forward: {tree} has {len(trees)} commit(s), the first tree {trees[-1][:12] if trees else '-'}; "
            f"expected one commit over the release (tree {upstream_tree[:12]})"
        )
    message = user_output(["git", "-C", tree, "log", "-1", "--format=%B", "HEAD"]).strip().splitlines()
    if not message or message[-1] != signoff:
        failures.append(f"forward: the commit's last line is {message[-1:]!r}, not {signoff!r}")
    if not exists(f"build/forward/{stem}.pr.md"):
        failures.append(f"forward: no build/forward/{stem}.pr.md")
    return failures


def drop_failures(output: str, status_before: str, status_after: str) -> list[str]:
    """What the drop block promises on the series today: no patch upstream yet, nothing dropped, nothing changed."""
    failures = []
    totals = TOTALS.search(output)
    if totals is None:
        failures.append("drop: the audit printed no 'Totals: ... drop N' line")
    elif totals.group(1) != "0":
        failures.append(
            f"drop: the audit now finds {totals.group(1)} patch(es) upstream on every carried line; "
            "the README's drop workflow says none: update it"
        )
    if "nothing to drop" not in output:
        failures.append("drop: `bump --drop` did not say 'nothing to drop'")
    if status_after != status_before:
        new = sorted(set(status_after.splitlines()) ^ set(status_before.splitlines()))
        failures.append(f"drop: the block changed the clone: {'; '.join(new)[:400]}")
    return failures
