"""Build the patched vLLM image: the locked base plus one thin layer per series, then verify it.

Stages build/image/ from the patched tree (run apply-patches first): one directory per series holding
only the files that series changes, as they stand after it; the overlay/ files with the manifest of
applied patches; the Dockerfile with its series block and ARG defaults filled in. Then builds with
docker, podman or buildah (the first that works; --engine picks), tags, and runs
`python3 -m vllm_overlay_status verify` in the image. Prints the bytes the layers add over the base
and the build time. Layers are reproducible: same inputs, same layer digests (SOURCE_DATE_EPOCH,
default the newest patch's Last-Update date, fixes every timestamp).

The project's Dockerfile (what `docker build .` builds: a first stage runs this tool, the second is
the same as the staged one) carries the series block and the provenance ARG defaults too:
--sync-dockerfile writes them, --check-dockerfile fails when they are stale.

Exit codes: 0 built and verified; 1 the build or the in-image verify failed, or --check-dockerfile
found ./Dockerfile stale; 2 usage, input or engine error.

Engine flags a machine needs go with --runtime, --ulimit and --network (Debian's podman 4.3:
--engine podman --runtime runc --ulimit nofile=1024:1024 --ulimit nproc=4096:4096).
"""

from __future__ import annotations

import argparse

from vllm_overlay import output, project
from vllm_overlay.errors import InputError
from vllm_overlay.image import engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument("--engine", choices=("auto", *engine.ENGINES), default="auto", help="default: first that works")
    parser.add_argument(
        "--runtime",
        default=None,
        metavar="NAME",
        help="OCI runtime for the build and the in-image verify (podman's global --runtime, docker run's and "
        "buildah's --runtime), e.g. runc where podman's default fails",
    )
    parser.add_argument(
        "--ulimit",
        action="append",
        default=[],
        metavar="TYPE=SOFT:HARD",
        help="ulimit for the build's RUN steps and the verify run (repeatable), e.g. nofile=1024:1024",
    )
    parser.add_argument(
        "--network", default=None, metavar="MODE", help="network mode of the RUN steps and the verify run (e.g. none)"
    )
    parser.add_argument(
        "--base", default=None, help="base image (default: upstream.lock [base-image], by digest if locked)"
    )
    parser.add_argument(
        "--tag", "-t", action="append", default=None, help="tag (repeatable; default vllm-overlay:<ver>-<hash>)"
    )
    parser.add_argument(
        "--build-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra build argument, e.g. VLLM_SITE_PACKAGES=/usr/local/lib/python3.11/dist-packages for another base",
    )
    parser.add_argument(
        "--source-url", default=None, help="org.opencontainers.image.source (default: git remote origin)"
    )
    parser.add_argument("--stage-only", action="store_true", help="stage build/image and stop (no engine needed)")
    parser.add_argument("--no-pull", action="store_true", help="never pull the base; fail if it is not present")
    parser.add_argument("--no-cache", action="store_true", help="rebuild every layer (proves reproducibility)")
    parser.add_argument(
        "--sync-dockerfile",
        action="store_true",
        help="rewrite the generated parts of ./Dockerfile (series block, provenance ARG defaults) from the series",
    )
    parser.add_argument(
        "--check-dockerfile",
        action="store_true",
        help="exit 1 if the generated parts of ./Dockerfile are stale (what `docker build .` would build with)",
    )


def run(args: argparse.Namespace) -> int:
    """The options as :class:`vllm_overlay.image.build.BuildOptions`; :func:`~vllm_overlay.image.build.build_image`'s
    result lines printed."""
    from vllm_overlay.image import build

    proj = project.from_args(args)
    extra_args = {}
    for item in args.build_arg:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--build-arg {item!r}: expected KEY=VALUE")
        extra_args[key] = value
    options = build.BuildOptions(
        engine=args.engine,
        engine_options=engine.Options(runtime=args.runtime, ulimits=tuple(args.ulimit), network=args.network),
        base=args.base,
        tags=tuple(args.tag or ()),
        build_args=extra_args,
        source_url=args.source_url,
        stage_only=args.stage_only,
        pull=not args.no_pull,
        no_cache=args.no_cache,
        sync_dockerfile=args.sync_dockerfile,
        check_dockerfile=args.check_dockerfile,
    )
    result = build.build_image(proj, options)
    for line in result.summary():
        output.result(line)
    return result.code
