"""``ci-image``: parse the options and run the image check of :mod:`vllm_overlay.image.ci_checks`.

Its help text is that module's docstring (what the check builds and proves), kept in one place.
"""

from __future__ import annotations

import argparse
import os

from vllm_overlay import project
from vllm_overlay.commands import docstring_of

__doc__ = docstring_of("vllm_overlay.image.ci_checks")  # shown by --help (cli builds the verb's description from it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument(
        "--python",
        default=None,
        help="interpreter whose installed vllm is the pristine source (default: the cached test environment "
        "that test-patches uses, built on first use)",
    )
    parser.add_argument(
        "--storage-driver", default="overlay", choices=("overlay", "vfs"), help="buildah storage driver"
    )
    parser.add_argument("--suite", default="bookworm", help="Debian suite of the stand-in (default: bookworm)")
    parser.add_argument(
        "--tool-suite",
        default="bookworm",
        help="Debian suite of the first stage's stand-in for --root-build (python3 3.11+; default: bookworm)",
    )
    parser.add_argument(
        "--mirror",
        default=None,
        help="Debian archive URL for debootstrap (default: the one in the machine's apt sources)",
    )
    parser.add_argument("--rebuild-base", action="store_true", help="make the stand-in bases again")
    parser.add_argument(
        "--engines",
        default=os.environ.get("VLLM_OVERLAY_CI_ENGINES", "auto"),
        help="engines to check beside buildah, comma-separated (docker, podman), each required; 'none' for "
        "buildah alone (default $VLLM_OVERLAY_CI_ENGINES, else auto: every one installed, the others named as "
        "not checked; .ci/run requires docker,podman)",
    )
    parser.add_argument(
        "--root-build",
        action="store_true",
        help="also checks 5 and 6: build the project's Dockerfile as `docker build .` does (digests and labels "
        "must equal build-image's), and build over a non-root base",
    )


def run(args: argparse.Namespace) -> int:
    from vllm_overlay.image import ci_checks

    proj = project.from_args(args)
    options = ci_checks.Options(
        python=args.python,
        storage_driver=args.storage_driver,
        suite=args.suite,
        tool_suite=args.tool_suite,
        mirror=args.mirror,
        rebuild_base=args.rebuild_base,
        root_build=args.root_build,
        engines=args.engines,
    )
    return ci_checks.run_checks(proj, options)
