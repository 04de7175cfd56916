"""CI for the image: build the real Dockerfile with buildah FROM a locally made stand-in base, then tamper tests.

No registry is reachable on CI machines, so the vllm/vllm-openai base is replaced by a stand-in: a
minimal Debian root filesystem with python3 (debootstrap, cached in the tool's store) holding the
pristine vllm package files and dist-info of the locked release, copied from an interpreter that has
them installed (--python; checked against RECORD first) into the stand-in's system site-packages
(/usr/local/lib/python3.X/dist-packages: the same scheme as the vllm-openai image, whose Python may
differ; the Dockerfile is told the path and proves it). Then:

  1. scripts/build-image builds the real Dockerfile on the stand-in and verifies inside the image;
  2. a second --no-cache build must give the same layer digests (reproducible layers);
  3. a file tampered in a staged layer must make the build's verify step fail;
  4. a file tampered in the built image (a replaced one and an untouched one) must make
     `python3 -m vllm_overlay_status verify` and the vLLM plugin fail.

buildah runs with its own storage under the store (CONTAINERS_STORAGE_CONF), driver --storage-driver
(overlay by default; vfs works everywhere but copies the ~1 GB base at every step).
Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap).

The stand-in's Debian root filesystem is debootstrapped from the machine's apt sources
(/etc/apt/sources.list, sources.list.d/*.list and *.sources) unless --mirror names one.

Exit codes: 0 every check passed; 1 a check failed; 2 usage, input or environment error.
"""

from __future__ import annotations

import argparse

from vllm_overlay import image_ci, project
from vllm_overlay.commands import build_image


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
        "--mirror",
        default=None,
        help="Debian archive URL for debootstrap (default: the one in the machine's apt sources)",
    )
    parser.add_argument("--rebuild-base", action="store_true", help="make the stand-in base again")


def run(args: argparse.Namespace) -> int:
    proj = project.from_args(args)

    def build(base: str, site: str, *extra: str) -> int:
        argv = ["--project", str(proj.root), "--engine", "buildah", "--base", base, "--no-pull", "--tag", image_ci.TAG]
        argv += ["--build-arg", f"VLLM_SITE_PACKAGES={site}", *extra]
        parser = argparse.ArgumentParser()
        build_image.add_arguments(parser)
        return build_image.run(parser.parse_args(argv))

    options = image_ci.Options(args.python, args.storage_driver, args.suite, args.mirror, args.rebuild_base)
    return image_ci.run_checks(proj, options, build)
