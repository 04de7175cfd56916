"""``ci-readme``: parse the options and run the newcomer check of :mod:`vllm_overlay.readme_ci`."""

from __future__ import annotations

import argparse

from vllm_overlay import project
from vllm_overlay.commands import docstring_of

__doc__ = docstring_of("vllm_overlay.readme_ci")  # shown by --help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument(
        "--storage-driver", default="overlay", choices=("overlay", "vfs"), help="buildah storage driver"
    )
    parser.add_argument("--suite", default="bookworm", help="Debian suite of the stand-in (default: bookworm)")
    parser.add_argument(
        "--mirror",
        default=None,
        help="Debian archive URL for debootstrap (default: the one in the machine's apt sources)",
    )
    parser.add_argument("--rebuild-base", action="store_true", help="make the stand-in again")


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import readme_ci

    options = readme_ci.Options(
        storage_driver=args.storage_driver, suite=args.suite, mirror=args.mirror, rebuild_base=args.rebuild_base
    )
    return readme_ci.run_check(project.from_args(args), options)
