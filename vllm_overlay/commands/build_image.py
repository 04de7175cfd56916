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
import time

from vllm_overlay import output, project
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


def _mb(size: int | None) -> str:
    return "?" if size is None else f"{size:,} bytes ({size / 1e6:.3f} MB)"


def run(args: argparse.Namespace) -> int:
    from vllm_overlay import lock, series
    from vllm_overlay.image import build_context

    proj = project.from_args(args)
    step = iter(range(1, 7))
    total = 2 if args.stage_only else 6
    say = lambda text: output.info(f"[{next(step)}/{total}] {text}")  # noqa: E731
    extra_args = {}
    for item in args.build_arg:
        key, sep, value = item.partition("=")
        if not sep:
            output.error(f"--build-arg {item!r}: expected KEY=VALUE")
            return 2
        extra_args[key] = value
    the_lock = lock.load(proj.lock_file)
    patches = series.load_series(proj.patches)
    say(f"staging {len(patches)} patch(es) from {proj.patched_tree}")
    staging = build_context.stage(proj, the_lock, patches, base_image=args.base, source_url=args.source_url)
    for layer in staging.layers:
        output.info(f"      layer {layer.layer}: {len(layer.files)} file(s), {layer.bytes:,} bytes")
    for entry in staging.unshipped:
        output.warn(
            f"{entry['path']} is outside the installed vllm package: not shipped ({', '.join(entry['patches'])})"
        )
    say(f"staged {staging.root} ({staging.staged_bytes:,} bytes; series sha256 {staging.series_sha256[:16]})")
    stale = build_context.stale_dockerfile_lines(proj, staging)
    if stale and args.sync_dockerfile:
        build_context.sync_dockerfile(proj, staging)
        output.info(f"      updated the generated parts of {proj.root / 'Dockerfile'} ({len(stale)} line(s))")
    elif stale:
        shown = "\n".join(f"        {line}" for line in stale[:12])
        more = f"\n        ... and {len(stale) - 12} more" if len(stale) > 12 else ""
        message = (
            f"the generated parts of {proj.root / 'Dockerfile'} (series block, provenance defaults) do not match "
            f"patches/series, so `docker build .` would be refused:\n{shown}{more}\n"
            "      run scripts/build-image --stage-only --sync-dockerfile and commit the Dockerfile"
        )
        if args.check_dockerfile:
            output.error(message)
            return 1
        output.warn(message + " (the staged copy is right)")
    elif args.check_dockerfile:
        output.info(f"      {proj.root / 'Dockerfile'}: generated parts match the series")
    if args.stage_only:
        output.result(str(staging.root))
        return 0

    options = engine.Options(runtime=args.runtime, ulimits=tuple(args.ulimit), network=args.network)
    eng = engine.find_engine(args.engine, options)
    say(f"engine: {eng.name} ({eng.exe})")
    base = staging.build_args["BASE_IMAGE"]
    if not eng.image_exists(base):
        if args.no_pull:
            raise engine.EngineError(f"base image {base} is not present locally (--no-pull)")
        output.info(f"      pulling {base}")
        ok, message = eng.pull(base)
        if not ok:
            reason = message.splitlines()[-1] if message else "no reason given"
            raise engine.EngineError(
                f"base image {base} is not present and cannot be pulled: {reason}"
                "\n  pass --base with a local image, or make the registry reachable"
            )
    build_args = dict(staging.build_args)
    base_digest = eng.digest(base)
    if base_digest and not the_lock.base_digest:
        build_args["OVERLAY_BASE_DIGEST"] = base_digest
    build_args.update(extra_args)
    tags = args.tag or [f"vllm-overlay:{the_lock.version}-{staging.series_sha256[:12]}"]
    say(f"building {tags[0]} FROM {base} (base present)")
    started = time.monotonic()
    code = eng.build(staging.root, tags, build_args, staging.source_date_epoch, no_cache=args.no_cache)
    seconds = time.monotonic() - started
    if code != 0:
        output.error(f"{eng.name} build failed (exit {code}) after {seconds:.1f} s; see its output above")
        return 1
    say(f"verifying inside {tags[0]}")
    site = build_args.get("VLLM_SITE_PACKAGES")
    verify_argv = ["python3", "-m", "vllm_overlay_status", "verify"] + (["--site-packages", site] if site else [])
    code, text = eng.run(tags[0], verify_argv)
    output.info("      " + text.strip().replace("\n", "\n      "))
    if code != 0:
        output.error(f"in-image verify failed for {tags[0]}")
        return 1
    base_layers = len(eng.diff_ids(base))
    sizes = eng.layer_sizes(tags[0])
    added = sizes[base_layers:]
    added_total = None if None in added else sum(s for s in added if s is not None)
    if added_total is None:
        full, base_size = eng.image_size(tags[0]), eng.image_size(base)
        added_total = full - base_size if full and base_size else None
    say("done")
    output.result(f"image: {', '.join(tags)}")
    output.result(f"layers added over the base: {len(added)}; {_mb(added_total)}")
    output.result(f"build time (base present): {seconds:.1f} s")
    output.result(f"series sha256: {staging.series_sha256}")
    return 0
