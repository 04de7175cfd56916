"""Build the image and verify it: what scripts/build-image does, as a function with typed options.

:func:`build_image` stages the build context (or takes one staged already), checks the project's
Dockerfile against it, finds the engine and the base (pulling it unless told not to), builds, runs
``python3 -m vllm_overlay_status verify`` in the image and measures what the layers add over the
base. It says its steps as it goes (``[n/6] ...``); :meth:`BuildResult.summary` holds the result
lines. Input, usage and engine errors raise (:class:`vllm_overlay.errors.InputError`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay import output, series
from vllm_overlay.image import build_context, dockerfile, engine
from vllm_overlay.image.build_context import BuildContext
from vllm_overlay.image.engine import Options as EngineOptions
from vllm_overlay.project import Project
from vllm_overlay.series import Patch
from vllm_overlay.upstream import lock
from vllm_overlay.upstream.lock import Lock

STEPS = 6  # staging, staged, engine, building, verifying, done


@dataclass(frozen=True)
class BuildOptions:
    engine: str = "auto"  # auto (the first that works) or one of engine.ENGINES
    engine_options: EngineOptions = field(default_factory=EngineOptions)
    base: str | None = None  # default: upstream.lock [base-image], by digest if locked
    tags: tuple[str, ...] = ()  # default: vllm-overlay:<version>-<series sha256[:12]>
    build_args: Mapping[str, str] = field(default_factory=dict)  # extra, over the staged ones
    source_url: str | None = None  # org.opencontainers.image.source (default: git remote origin)
    stage_only: bool = False
    pull: bool = True  # False: fail if the base is not present
    no_cache: bool = False
    sync_dockerfile: bool = False  # rewrite the project's Dockerfile's generated parts when stale
    check_dockerfile: bool = False  # a stale project Dockerfile fails the build (code 1)


@dataclass(frozen=True)
class BuildResult:
    code: int  # 0 built and verified (or staged); 1 the build or the verify failed, or the Dockerfile is stale
    context: BuildContext | None  # None: refused before staging ended
    tags: tuple[str, ...] = ()
    added_layers: int = 0
    added_bytes: int | None = None
    seconds: float = 0.0  # build time, the base present

    def summary(self) -> list[str]:
        """What build-image prints last: the staged directory, or the image, its added layers and build time."""
        if self.code != 0 or self.context is None:
            return []
        if not self.tags:
            return [str(self.context.root)]
        return [
            f"image: {', '.join(self.tags)}",
            f"layers added over the base: {self.added_layers}; {_mb(self.added_bytes)}",
            f"build time (base present): {self.seconds:.1f} s",
            f"series sha256: {self.context.series_sha256}",
        ]


class _Steps:
    def __init__(self, total: int, first: int = 1) -> None:
        self.total, self.next = total, first

    def say(self, text: str) -> None:
        output.info(f"[{self.next}/{self.total}] {text}")
        self.next += 1


def _mb(size: int | None) -> str:
    return "?" if size is None else f"{size:,} bytes ({size / 1e6:.3f} MB)"


def build_image(project: Project, options: BuildOptions, *, context: BuildContext | None = None) -> BuildResult:
    """Stage (unless ``context`` is one staged already with these options' base and source), build, verify."""
    the_lock = lock.load(project.lock_file)
    if context is None:
        steps = _Steps(2 if options.stage_only else STEPS)
        context = stage_context(project, the_lock, options, steps)
        if not check_dockerfile(project, context, options):
            return BuildResult(1, context)
    elif options.base is not None and context.build_args["BASE_IMAGE"] != options.base:
        raise build_context.ImageError(
            f"the build context was staged over {context.build_args['BASE_IMAGE']}, not {options.base}"
        )
    else:
        steps = _Steps(STEPS, first=3)
    if options.stage_only:
        return BuildResult(0, context)
    return build_and_verify(the_lock, context, options, steps)


def stage_context(project: Project, the_lock: lock.Lock, options: BuildOptions, steps: _Steps) -> BuildContext:
    """Steps 1 and 2: stage build/image from the patched tree and say what it holds."""
    patches = series.load_series(project.patches)
    steps.say(f"staging {len(patches)} patch(es) from {project.patched_tree}")
    context = build_context.stage(project, the_lock, patches, base_image=options.base, source_url=options.source_url)
    for layer in context.layers:
        output.info(f"      layer {layer.layer}: {len(layer.files)} file(s), {layer.bytes:,} bytes")
    for entry in context.unshipped:
        output.warn(
            f"{entry['path']} is outside the installed vllm package: not shipped ({', '.join(entry['patches'])})"
        )
    steps.say(f"staged {context.root} ({context.staged_bytes:,} bytes; series sha256 {context.series_sha256[:16]})")
    return context


def check_dockerfile(project: Project, context: BuildContext, options: BuildOptions) -> bool:
    """The project's Dockerfile against the context: synced, or said stale; False when stale and checked."""
    stale = dockerfile.stale_dockerfile_lines(project, context)
    if stale and options.sync_dockerfile:
        dockerfile.sync_dockerfile(project, context)
        output.info(f"      updated the generated parts of {project.root / 'Dockerfile'} ({len(stale)} line(s))")
    elif stale:
        shown = "\n".join(f"        {line}" for line in stale[:12])
        more = f"\n        ... and {len(stale) - 12} more" if len(stale) > 12 else ""
        message = (
            f"the generated parts of {project.root / 'Dockerfile'} (series block, provenance defaults) do not match "
            f"patches/series, so `docker build .` would be refused:\n{shown}{more}\n"
            "      run scripts/build-image --stage-only --sync-dockerfile and commit the Dockerfile"
        )
        if options.check_dockerfile:
            output.error(message)
            return False
        output.warn(message + " (the staged copy is right)")
    elif options.check_dockerfile:
        output.info(f"      {project.root / 'Dockerfile'}: generated parts match the series")
    return True


def build_and_verify(the_lock: lock.Lock, context: BuildContext, options: BuildOptions, steps: _Steps) -> BuildResult:
    """Steps 3 to 6: the engine and the base, the build, the in-image verify, the layers added."""
    eng = engine.find_engine(options.engine, options.engine_options)
    steps.say(f"engine: {eng.name} ({eng.exe})")
    base = context.build_args["BASE_IMAGE"]
    _ensure_base(eng, base, options.pull)
    build_args = dict(context.build_args)
    base_digest = eng.digest(base)
    if base_digest and not the_lock.base_digest:
        build_args["OVERLAY_BASE_DIGEST"] = base_digest
    build_args.update(options.build_args)
    tags = options.tags or (f"vllm-overlay:{the_lock.version}-{context.series_sha256[:12]}",)
    steps.say(f"building {tags[0]} FROM {base} (base present)")
    started = time.monotonic()
    code = eng.build(context.root, list(tags), build_args, context.source_date_epoch, no_cache=options.no_cache)
    seconds = time.monotonic() - started
    if code != 0:
        output.error(f"{eng.name} build failed (exit {code}) after {seconds:.1f} s; see its output above")
        return BuildResult(1, context, tags, seconds=seconds)
    steps.say(f"verifying inside {tags[0]}")
    if not _verify(eng, tags[0], build_args.get("VLLM_SITE_PACKAGES")):
        return BuildResult(1, context, tags, seconds=seconds)
    added, added_bytes = _added(eng, base, tags[0])
    steps.say("done")
    return BuildResult(0, context, tags, added, added_bytes, seconds)


def _ensure_base(eng: engine.Engine, base: str, pull: bool) -> None:
    if eng.image_exists(base):
        return
    if not pull:
        raise engine.EngineError(f"base image {base} is not present locally (--no-pull)")
    output.info(f"      pulling {base}")
    ok, message = eng.pull(base)
    if not ok:
        reason = message.splitlines()[-1] if message else "no reason given"
        raise engine.EngineError(
            f"base image {base} is not present and cannot be pulled: {reason}"
            "\n  pass --base with a local image, or make the registry reachable"
        )


def _verify(eng: engine.Engine, tag: str, site: str | None) -> bool:
    """``python3 -m vllm_overlay_status verify`` in the image, its output shown."""
    verify_argv = ["python3", "-m", "vllm_overlay_status", "verify"] + (["--site-packages", site] if site else [])
    code, text = eng.run(tag, verify_argv)
    output.info("      " + text.strip().replace("\n", "\n      "))
    if code != 0:
        output.error(f"in-image verify failed for {tag}")
        return False
    return True


def _added(eng: engine.Engine, base: str, tag: str) -> tuple[int, int | None]:
    """(layers the image adds over the base, their bytes; None if the engine cannot say)."""
    base_layers = len(eng.diff_ids(base))
    sizes = eng.layer_sizes(tag)
    added = sizes[base_layers:]
    added_total = None if None in added else sum(s for s in added if s is not None)
    if added_total is None:
        full, base_size = eng.image_size(tag), eng.image_size(base)
        added_total = full - base_size if full and base_size else None
    return len(added), added_total


def refresh_project_dockerfile(project: Project, the_lock: Lock, patches: list[Patch]) -> int:
    """Bring the project's Dockerfile in line with the series after patches/ changed (export, bump).

    Stages into a scratch directory at the series' own epoch (build/image is left as it was) and
    writes the generated parts. Returns the number of Dockerfile lines that changed.
    """
    project.build.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".dockerfile-sync-", dir=project.build) as scratch:
        context = build_context.stage(
            project, the_lock, patches, dest=Path(scratch) / "image", epoch=build_context.series_epoch(patches)
        )
        stale = dockerfile.stale_dockerfile_lines(project, context)
        if stale:
            dockerfile.sync_dockerfile(project, context)
    return len(stale)
