"""Command-line entry point: builds the argument parser and dispatches to one verb module.

Only the verb being run is imported (with the modules it needs): every other verb is listed by
its one-line help alone, so ``--help`` and the start of any command do not pay for the imports
of all of them (the speed target: under 0.3 s CPU).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from vllm_overlay import errors, output, report
from vllm_overlay import git as gitcmd
from vllm_overlay.upstream import indexes

# verb -> (module under vllm_overlay.commands, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "apply-patches": ("apply_patches", "apply the series onto a fresh upstream tree"),
    "export-patches": ("export_patches", "export the patched repository back to patches/"),
    "forward": ("forward", "forward one patch upstream: a branch of the release, one signed-off commit, a PR body"),
    "lint-patches": ("lint_patches", "check patches/ without applying anything"),
    "bump": ("bump", "move the series to a new upstream release and re-lock"),
    "audit-upstream": ("audit_upstream", "keep/refresh/drop/resolve audit of the series against another upstream"),
    "test-patches": ("patch_tests", "prove every patch red -> green and guard vLLM's own tests"),
    "with-patched-vllm": ("with_patched_vllm", "run a command with a patched tree laid over the installed vllm"),
    "build-image": ("build_image", "build the image: locked base + one layer per series, verified"),
    "verify-install": ("verify_install", "verify a site-packages against vllm's RECORD and an overlay manifest"),
    "cache": ("cache", "list the cache; --prune removes test environments no current lock uses"),
    "serve-e2e": ("serve_e2e", "end to end on CPU: real vLLM servers, pristine beside patched, scenarios side by side"),
    "carry-cpu": ("carry_cpu", "carry patches/ onto the CPU runtime's release again (cpu/patches), reusing reviews"),
    "ci-image": ("ci_image", "CI: build the Dockerfile on a local stand-in base with buildah, then tamper tests"),
    "ci-readme": ("ci_readme", "CI: README command 1 as a new user on a Debian 12 stand-in, same build/patched"),
}


def _chosen_verb(argv: Sequence[str]) -> str | None:
    """The verb ``argv`` names (its first argument that is not an option), if it is one."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in VERBS else None
    return None


def build_parser(verbs: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; the full arguments (and module) of ``verbs`` only (None: every verb's)."""
    parser = argparse.ArgumentParser(prog="vllm-overlay", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        if verbs is not None and verb not in verbs:
            sub.add_parser(verb, help=help_text, description=help_text)  # listed, never run from here
            continue
        module = importlib.import_module(f"vllm_overlay.commands.{module_name}")
        verb_parser = sub.add_parser(
            verb,
            help=help_text,
            description=(module.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(verb_parser)
        verb_parser.set_defaults(_module=module)
    return parser


# Options of any verb that name a report file to write: checked before the verb's work starts.
REPORT_OPTIONS = ("json", "junit", "markdown", "range_diff")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen_verb(argv)
    args = build_parser([chosen] if chosen else []).parse_args(argv)
    index_url = getattr(args, "index_url", None)
    if index_url:
        indexes.set_override(index_url)
    try:
        # Only options that name a file: serve-e2e's --range-diff is a switch (it prints the diff).
        destinations = {name: getattr(args, name, None) for name in REPORT_OPTIONS}
        report.check_destinations(**{k: v for k, v in destinations.items() if isinstance(v, Path)})
        with gitcmd.isolated():  # the user's git configuration never changes what the tool builds
            return int(args._module.run(args))
    except (errors.InputError, errors.WorkFailure) as exc:  # the one error path: one line; exit 2 or 1
        return errors.report(exc)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the verb turned it into one
        output.error(str(exc) if isinstance(exc, errors.Interrupted) else "interrupted")
        return errors.Interrupted.exit_code
    except BrokenPipeError:  # `lint-patches | head`: the reader has all it wanted
        return _stdout_closed()
    finally:
        if index_url:  # this run's alone: a later run in the same process reads pip's configuration again
            indexes.set_override(None)


def _stdout_closed() -> int:
    """End quietly, as a command killed by SIGPIPE would (exit 141): point stdout at /dev/null so the
    interpreter's last flush finds nowhere to fail and prints no second traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
