"""The image check (scripts/ci-image): the real Dockerfile built FROM a local stand-in base, then tampered.

No registry is reachable on CI machines, so the vllm/vllm-openai base is replaced by a stand-in with
the pristine vllm .py files and dist-info of the locked release (vllm_overlay.image.standins says how each
stand-in is made). Then:

  1. scripts/build-image builds the real Dockerfile on the stand-in and verifies inside the image;
  2. a second --no-cache build must give the same layer digests (reproducible layers);
  3. a file tampered in a staged layer must make the build's verify step fail;
  4. the built image's SBOM (`python3 -m vllm_overlay_status sbom`) must pass cyclonedx-python-lib's
     schema validator and list exactly the patches of patches/series, and a file tampered in the
     built image (a replaced one and an untouched one) must make `python3 -m vllm_overlay_status
     verify` and the vLLM plugin fail;
  5. (--root-build) the project's own Dockerfile, as `docker build .` builds it: its first stage
     runs on a second stand-in (Debian --tool-suite with python3, venv and git, trusting this
     machine's CA bundle), installs this tool from the package index pip is configured with
     (passed as PIP_INDEX_URL / PIP_EXTRA_INDEX_URL; file:// indexes stay on the host), downloads
     the locked sdist and applies the series; the image must have the same added layer digests
     and the same labels as build-image's;
  6. (--root-build) the project's Dockerfile over a non-root base like vLLM's vllm-openai-nonroot
     target (the stand-in plus user vllm, uid 2000 gid 0, WORKDIR /home/vllm, and vLLM's own
     vllm-nonroot-entrypoint.sh from the locked release as entrypoint), built with
     IMAGE_USER=vllm: the image keeps that user, workdir and entrypoint, and the entrypoint
     wrapper, run as vllm, reaches a verify that passes.

  7. every other engine installed (docker, podman; --engines names those required, or none): checks
     1-4 (and with --root-build 5) with build-image --engine ENGINE on the same stand-ins. podman
     (buildah's library, run with --runtime runc and runc's ulimits: its default runtime fails on
     these machines) must give buildah's layer digests; Docker's classic builder stamps build times
     into its layers, so its digests are reported, not required. Docker runs as a daemon of the
     check's own (vllm_overlay.image.dockerd), the stand-ins loaded from archives (docker load).

Last, no build of the run (check 3's failing one included) may leave a working container behind.

buildah runs with its own storage under the store (CONTAINERS_STORAGE_CONF), driver --storage-driver
(overlay by default; vfs works everywhere but copies the ~1 GB base at every step).
The stand-ins' Debian root filesystems come from the machine's own apt sources unless --mirror names one.
Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap).

Exit codes (run_checks): 0 every check passed; 1 a check failed; 2 usage, input or environment error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import errors, output, project, series
from vllm_overlay.env import testenv
from vllm_overlay.errors import InputError
from vllm_overlay.image import build, build_context, dockerd, engine, sbom
from vllm_overlay.image.standins import (
    NONROOT_ENTRYPOINT,
    NONROOT_HOME,
    NONROOT_USER,
    STANDIN,
    STANDIN_SCOPE,
    TOOL_PACKAGES,
    TOOL_STANDIN,
    apt_mirror,
    machine_ca_bundle,
    make_nonroot_standin,
    make_standin,
    make_tool_standin,
    nonroot_entrypoint,
    rootfs_tar,
    sh,
)
from vllm_overlay.store import Store
from vllm_overlay.upstream import indexes, lock

TAG = "localhost/vllm-overlay-ci:latest"
OVERLAY_ENTRYPOINT = "/usr/local/bin/vllm-overlay-entrypoint"  # the Dockerfile's ENTRYPOINT (preflight.ENTRYPOINT)
ROOT_TAG = "localhost/vllm-overlay-ci:root-build"
NONROOT_TAG = "localhost/vllm-overlay-ci:nonroot"
TAMPER_LINE = "# tampered by ci-image\n"
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"


def use_storage(ci: Path, driver: str) -> None:
    """Point buildah at storage of its own in the cache's CI folder (``Store.ci``)."""
    conf = ci / f"storage-{driver}.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(
        f'[storage]\ndriver = "{driver}"\ngraphroot = "{ci / ("containers-" + driver)}"\n'
        f'runroot = "/run/vllm-overlay-ci-{driver}"\n'
    )
    os.environ["CONTAINERS_STORAGE_CONF"] = str(conf)
    os.environ.pop("STORAGE_DRIVER", None)
    os.environ.setdefault("BUILDAH_ISOLATION", "chroot")


def index_build_args() -> dict[str, str]:
    """PIP_INDEX_URL / PIP_EXTRA_INDEX_URL for the first stage: the indexes the tool reads.

    file:// indexes are directories of this machine, which the build cannot see: left out.
    """
    reachable = [url for url in indexes.configured() if url.startswith(("http://", "https://"))]
    found = {}
    if reachable:
        found["PIP_INDEX_URL"] = reachable[0]
    if reachable[1:]:
        found["PIP_EXTRA_INDEX_URL"] = " ".join(reachable[1:])
    return found


def _config(eng: engine.Engine, ref: str) -> dict:
    return eng.inspect(ref)["OCIv1"]["config"]


def root_build_args(ctx: RootBuild) -> dict[str, str]:
    """The --build-args of `docker build .` on the stand-ins, with build-image's host-side label values."""
    return {
        "BASE_IMAGE": ctx.base,
        "TOOL_IMAGE": ctx.tool,
        "VLLM_SITE_PACKAGES": ctx.site,
        "VLLM_RECORD_SCOPE": STANDIN_SCOPE,
        **index_build_args(),
        # The labels build-image computes from the host (its git revision and remote, the base's digest).
        "OVERLAY_REVISION": ctx.labels.get("org.opencontainers.image.revision", ""),
        "OVERLAY_SOURCE": ctx.labels.get("org.opencontainers.image.source", ""),
        "OVERLAY_BASE_DIGEST": ctx.labels.get("org.opencontainers.image.base.digest", ""),
    }


def root_build_checks(
    proj: project.Project, eng: engine.Engine, ctx: RootBuild, failures: list[str], figures: list[str]
) -> None:
    """Check 5: the project's Dockerfile built as `docker build .` builds it, against build-image's image."""
    build_args = root_build_args(ctx)
    output.info(f"      index for the first stage: {build_args.get('PIP_INDEX_URL', 'pip default of the tool image')}")
    started = time.monotonic()
    # No layer cache: a layer cached from build-image's build would make the digests agree by construction.
    if eng.build(proj.root, [ROOT_TAG], build_args, ctx.epoch, no_cache=True) != 0:
        failures.append("the project's Dockerfile did not build (see the build output above)")
        return
    seconds = time.monotonic() - started
    added = eng.diff_ids(ROOT_TAG)[len(eng.diff_ids(ctx.base)) :]
    if added == ctx.layers:
        figures.append(
            f"root Dockerfile: built in {seconds:.0f} s (tool stage included); its {len(added)} added layer "
            "digests equal build-image's"
        )
    else:
        pairs = [
            f"{i}: {a[:19]} vs {b[:19]}" for i, (a, b) in enumerate(zip(added, ctx.layers, strict=False)) if a != b
        ]
        failures.append(
            f"root Dockerfile: {len(added)} added layers vs build-image's {len(ctx.layers)}; differ at "
            + ("; ".join(pairs) or "the count")
        )
    labels = eng.labels(ROOT_TAG)
    differing = sorted(k for k in set(labels) | set(ctx.labels) if labels.get(k) != ctx.labels.get(k))
    if differing:
        failures.append(
            "root Dockerfile: labels differ from build-image's: "
            + "; ".join(f"{k}: {labels.get(k)!r} vs {ctx.labels.get(k)!r}" for k in differing)
        )
    else:
        figures.append(f"root Dockerfile: the {len(labels)} labels equal build-image's")


def nonroot_checks(eng: engine.Engine, ref: str, failures: list[str], figures: list[str]) -> None:
    """Check 6 on an image built over the non-root stand-in with IMAGE_USER=vllm."""
    config = _config(eng, ref)
    wanted = {"User": NONROOT_USER, "WorkingDir": NONROOT_HOME, "Entrypoint": [OVERLAY_ENTRYPOINT]}
    got = {key: config.get(key) for key in wanted}
    if got != wanted:
        failures.append(f"non-root base: the image's config is {got}, wanted {wanted}")
    else:
        figures.append(f"non-root base: user {NONROOT_USER} and workdir kept; the overlay's entrypoint in front")
    code, text = eng.run(ref, [OVERLAY_ENTRYPOINT, "--model", "stand-in"])
    reached = f"user {NONROOT_USER} uid 2000" in text and "verified:" in text and "preflight: plugin selected" in text
    if code != 0 or not reached:
        failures.append(f"non-root base: the entrypoint run gave (exit {code}): {text.strip()[-400:]}")
    else:
        figures.append(
            "non-root base: the entrypoint, run as vllm (uid 2000), passed the preflight, then vLLM's wrapper "
            "reached a passing verify"
        )
    plugin = ["python3", "-c", "from vllm_overlay_status.plugin import register; register()"]
    code, text = eng.run(ref, plugin)
    if code != 0:
        failures.append(f"non-root base: the plugin fails as {NONROOT_USER}: {text.strip()[-300:]}")


@dataclass
class RootBuild:
    """What check 5 compares against: build-image's image on the stand-in."""

    base: str
    tool: str
    site: str
    epoch: int
    layers: list[str]
    labels: dict[str, str]


@dataclass
class BuildahResult:
    """What check 7 compares each other engine with: buildah's build of the same inputs."""

    base: str
    site: str
    layers: list[str]  # added layer digests of build-image's image
    labels: dict[str, str]
    root: RootBuild | None  # check 5's context, with --root-build


def standin_archive(buildah: engine.Engine, ref: str, ci: Path) -> Path:
    """``ref`` from buildah's storage as a docker-archive, made once per image id (pushing straight to
    the daemon fails: "writing blob: io: read/write on closed pipe"). ``ci``: the cache's CI folder."""
    image_id = buildah.inspect(ref)["FromImageID"]
    archive = ci / "archives" / f"{image_id[:24]}.tar"
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        partial = archive.with_suffix(f".partial-{os.getpid()}")
        try:
            sh(buildah.exe, "push", "-q", ref, f"docker-archive:{partial}:{ref}")
            os.replace(partial, archive)
        finally:
            partial.unlink(missing_ok=True)
        output.info(f"      {ref} exported for docker load in {time.monotonic() - started:.0f} s: {archive}")
    return archive


def load_into(docker: engine.Engine, buildah: engine.Engine, ref: str, ci: Path) -> str:
    """Make ``ref`` present in the daemon with buildah's layers (docker load of its archive); what was done."""
    if docker.image_exists(ref) and docker.diff_ids(ref) == buildah.diff_ids(ref):
        return "present"
    archive = standin_archive(buildah, ref, ci)
    started = time.monotonic()
    sh(docker.exe, "load", "-q", "-i", str(archive))
    if docker.diff_ids(ref) != buildah.diff_ids(ref):
        raise engine.EngineError(f"docker load of {archive}: {ref} has other layers than buildah's")
    return f"loaded in {time.monotonic() - started:.0f} s"


def _docker_containers(eng: engine.Engine) -> set[str]:
    return set(sh(eng.exe, "ps", "-aq", "--no-trunc").split())


def _changed(first: list[str], second: list[str]) -> int:
    return sum(a != b for a, b in zip(first, second, strict=False)) + abs(len(first) - len(second))


def engine_checks(run: Run, eng: engine.Engine, buildah: BuildahResult) -> None:
    """Check 7 with docker or podman: the checks 1-5 make with buildah, on this engine.

    podman builds with buildah's own library: its layers must be buildah's, digest for digest.
    Docker's builder stamps build times into its layers (no SOURCE_DATE_EPOCH): its digests are
    reported, compared with buildah's and with its own rebuild, and must give a verified image.
    """
    name = eng.name
    tag = f"localhost/vllm-overlay-ci:{name}"
    bh = engine.find_engine("buildah")
    made: list[str] = [tag]
    before = _docker_containers(eng) if name == "docker" else set()
    try:
        if name == "docker":
            version = sh(eng.exe, "version", "--format", "{{.Client.Version}} / daemon {{.Server.Version}}")
            run.figures.append(f"docker: CLI {version}, the check's own daemon (loopback only)")
            for ref in [buildah.base, *([buildah.root.tool] if buildah.root else [])]:
                run.figures.append(f"docker: stand-in {ref} {load_into(eng, bh, ref, run.store.ci)}")
        built = _engine_builds(run, eng, tag, buildah)
        if built is None:
            return
        first, base_layers = built
        _engine_labels(run, eng, tag, buildah)
        _engine_runs(run, eng, tag)
        made.append(f"{tag}-tampered-layer")
        _engine_tampered_layer(run, eng, made[-1], buildah)
        if buildah.root is not None:
            made.append(f"{tag}-root-build")
            _engine_root_build(run, eng, made[-1], buildah.root, first, base_layers)
    finally:
        for ref in made:
            subprocess.run([eng.exe, "rmi", "-f", ref], capture_output=True, check=False)
        if name == "docker":
            _remove_left_containers(run, eng, before)


def _engine_builds(run: Run, eng: engine.Engine, tag: str, buildah: BuildahResult) -> tuple[list[str], int] | None:
    """build-image --engine NAME twice, no cache: (the added layers, the base's layer count); None if one failed."""
    name = eng.name
    started = time.monotonic()
    if build_on_standin(run, tag=tag, engine_name=name) != 0:
        run.failures.append(f"{name}: build-image {' '.join(engine_argv(name))} (build and in-image verify) failed")
        return None
    seconds = time.monotonic() - started
    base_layers = len(eng.diff_ids(buildah.base))
    first = eng.diff_ids(tag)[base_layers:]
    if build_on_standin(run, tag=tag, engine_name=name) != 0:
        run.failures.append(f"{name}: the --no-cache rebuild failed")
        return None
    second = eng.diff_ids(tag)[base_layers:]
    equal = sum(a == b for a, b in zip(first, buildah.layers, strict=False))
    line = (
        f"{name}: build-image --engine {name} built and verified in {seconds:.0f} s; {len(first)} added layers "
        f"({equal} of them equal to buildah's {len(buildah.layers)}); a --no-cache rebuild changed "
        f"{_changed(first, second)}"
    )
    if name == "podman" and (first != buildah.layers or second != first):
        run.failures.append(line + ": podman must give buildah's layers, reproducibly")
    else:
        run.figures.append(line)
    return first, base_layers


def _engine_labels(run: Run, eng: engine.Engine, tag: str, buildah: BuildahResult) -> None:
    name = eng.name
    labels = eng.labels(tag)
    differing = sorted(k for k in set(labels) | set(buildah.labels) if labels.get(k) != buildah.labels.get(k))
    # The base's manifest digest is what the engine knows of it: Docker keeps none for a loaded
    # image (no RepoDigests), so build-image leaves the label as the lock has it (empty here).
    unknown_digest = name == "docker" and not eng.digest(buildah.base)
    if unknown_digest and differing == [BASE_DIGEST_LABEL]:
        run.figures.append(
            f"{name}: the {len(labels)} labels equal buildah's image's, but {BASE_DIGEST_LABEL} "
            f"({labels.get(BASE_DIGEST_LABEL)!r}: docker keeps no manifest digest of a loaded image)"
        )
    elif differing:
        run.failures.append(f"{name}: labels differ from buildah's image: {', '.join(differing)}")
    else:
        run.figures.append(f"{name}: the {len(labels)} labels equal buildah's image's")


def _engine_runs(run: Run, eng: engine.Engine, tag: str) -> None:
    """status, verify, the plugin and the SBOM, run in the image this engine built."""
    name = eng.name
    runs = {"status": ["python3", "-m", "vllm_overlay_status", "status"]}
    runs["verify"] = ["python3", "-m", "vllm_overlay_status", "verify"]
    runs["plugin"] = ["python3", "-c", "from vllm_overlay_status.plugin import register; register()"]
    ran = []
    for what, argv in runs.items():
        code, text = eng.run(tag, argv)
        if code != 0:
            run.failures.append(f"{name} run {what} in the image (exit {code}): {text.strip()[-300:]}")
        else:
            ran.append(what)
    code, text = eng.run(tag, ["python3", "-m", "vllm_overlay_status", "sbom"])
    sbom_problems = [f"exit {code}"] if code != 0 else sbom.problems(text, [p.name for p in run.patches])
    if sbom_problems:
        run.failures.append(f"{name} run sbom: " + "; ".join(sbom_problems))
    else:
        ran.append("sbom (valid, the series' patches)")
    run.figures.append(f"{name} run in the built image: {', '.join(ran) or 'nothing passed'}")


def _engine_tampered_layer(run: Run, eng: engine.Engine, tag: str, buildah: BuildahResult) -> None:
    with tampered_copy(run.proj, run.built_context) as (root, victim):
        args_build = {
            **run.built_context.build_args,
            "VLLM_SITE_PACKAGES": buildah.site,
            "VLLM_RECORD_SCOPE": STANDIN_SCOPE,
        }
        if eng.build(root, [tag], args_build, run.built_context.source_date_epoch) == 0:
            run.failures.append(f"{eng.name}: tampered {victim.relative_to(root)} but the build passed")
        else:
            run.figures.append(f"{eng.name}: a tampered layer file failed the build")


def _engine_root_build(
    run: Run, eng: engine.Engine, tag: str, root: RootBuild, first: list[str], base_layers: int
) -> None:
    """The project's Dockerfile (docker build .) on this engine, against build-image's and buildah's."""
    name = eng.name
    host = dataclasses.replace(eng, options=dataclasses.replace(eng.options, network="host"))
    started = time.monotonic()
    if host.build(run.proj.root, [tag], root_build_args(root), root.epoch, no_cache=True) != 0:
        run.failures.append(f"{name}: the project's Dockerfile (docker build .) did not build")
        return
    seconds = time.monotonic() - started
    added = eng.diff_ids(tag)[base_layers:]
    same_labels = eng.labels(tag) == root.labels
    line = (
        f"{name}: docker build . built in {seconds:.0f} s (in-image verify included); {len(added)} added "
        f"layers, {_changed(added, first)} differ from build-image's on {name}, "
        f"{_changed(added, root.layers)} from buildah's"
    )
    if not same_labels:
        run.failures.append(f"{name}: docker build . labels differ from buildah's build-image image")
    if name == "podman" and added != root.layers:
        run.failures.append(line + ": podman must give buildah's layers")
    else:
        run.figures.append(line + ("; labels equal" if same_labels else ""))


def _remove_left_containers(run: Run, eng: engine.Engine, before: set[str]) -> None:
    left = sorted(_docker_containers(eng) - before)
    for container in left:
        subprocess.run([eng.exe, "rm", "-f", container], capture_output=True, check=False)
    if left:
        run.failures.append(f"docker: {len(left)} container(s) left by the checks (removed): {', '.join(left)}")
    subprocess.run([eng.exe, "image", "prune", "-f"], capture_output=True, check=False)


@dataclass
class Options:
    python: str | None = None  # interpreter whose installed vllm is the pristine source
    storage_driver: str = "overlay"
    suite: str = "bookworm"
    tool_suite: str = "bookworm"  # the first stage's stand-in (check 5): python3 3.11.2
    mirror: str | None = None  # None: the machine's own apt sources
    rebuild_base: bool = False
    root_build: bool = False  # checks 5 and 6: the project's Dockerfile, and a non-root base
    engines: str = "auto"  # check 7: docker, podman (comma-separated, each required), none, or auto


# Check 7's engines and the flags they need here (engine.Options says why podman needs them).
# Containers get loopback only; the root build's first stage reaches the package index on the host's network.
OTHER_ENGINES = ("docker", "podman")
ENGINE_OPTIONS = {
    "docker": engine.Options(network="none"),
    "podman": engine.Options(runtime="runc", ulimits=("nofile=1024:1024", "nproc=4096:4096"), network="none"),
}
INSTALL_HINT = {"docker": "apt-get install docker.io", "podman": "apt-get install podman"}


def engine_argv(name: str) -> tuple[str, ...]:
    """build-image's arguments for ``name`` with ENGINE_OPTIONS."""
    options = ENGINE_OPTIONS[name]
    argv = ["--engine", name]
    if options.runtime:
        argv += ["--runtime", options.runtime]
    for limit in options.ulimits:
        argv += ["--ulimit", limit]
    if options.network:
        argv += ["--network", options.network]
    return tuple(argv)


def other_engines(choice: str) -> tuple[list[str], list[str]]:
    """(engines to check beside buildah, lines naming those not checked and why)."""
    if choice == "none":
        return [], [f"{name}: not checked (--engines none)" for name in OTHER_ENGINES]
    if choice != "auto":
        wanted = [name.strip() for name in choice.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in OTHER_ENGINES]
        if unknown:
            known = ", ".join(OTHER_ENGINES)
            raise engine.EngineError(f"--engines: unknown {', '.join(unknown)} (choose from {known})")
        missing = [name for name in wanted if not _installed(name)]
        if missing:
            raise engine.EngineError(
                "--engines asks for "
                + ", ".join(f"{name} (not installed; Debian: {INSTALL_HINT[name]})" for name in missing)
            )
        return wanted, []
    present = [name for name in OTHER_ENGINES if _installed(name)]
    absent = [
        f"{name}: not installed here, not checked (Debian: {INSTALL_HINT[name]})"
        for name in OTHER_ENGINES
        if name not in present
    ]
    return present, absent


def _installed(name: str) -> bool:
    return shutil.which(name) is not None and (name != "docker" or shutil.which("dockerd") is not None)


@dataclass
class Run:
    """One ci-image run: its inputs, buildah on the check's storage, the stand-in, what the checks found.

    ``context`` is the build context check 1's build stages (build/image, over the stand-in): every
    other build and both tamper tests take it as it is, so it is staged once per run.
    """

    proj: project.Project
    options: Options
    the_lock: lock.Lock
    patches: list
    store: Store
    eng: engine.Engine  # buildah
    failures: list[str]
    figures: list[str]
    ref: str = ""  # the stand-in base
    site: str = ""  # its site-packages
    context: build_context.BuildContext | None = None

    @property
    def built_context(self) -> build_context.BuildContext:
        if self.context is None:
            raise engine.EngineError("no build context: check 1 did not stage one")
        return self.context


def build_on_standin(run: Run, *, tag: str = TAG, engine_name: str = "buildah") -> int:
    """build-image's build and in-image verify on the stand-in, without the layer cache; its exit code.

    The first call stages the build context, the others build the one staged. No layer cache: it keys
    on content, not on the timestamps, so a cached layer of an earlier epoch could make two builds agree
    (or differ) by accident.
    """
    options = build.BuildOptions(
        engine=engine_name,
        engine_options=ENGINE_OPTIONS.get(engine_name, engine.Options()),
        base=run.ref,
        tags=(tag,),
        build_args={"VLLM_SITE_PACKAGES": run.site, "VLLM_RECORD_SCOPE": STANDIN_SCOPE},
        pull=False,
        no_cache=True,
    )
    try:
        result = build.build_image(run.proj, options, context=run.context)
    except InputError as exc:  # as cli.main would answer it: the checks read the exit code
        return errors.report(exc)
    run.context = run.context or result.context
    for line in result.summary():
        output.result(line)
    return result.code


@contextlib.contextmanager
def tampered_copy(proj: project.Project, context: build_context.BuildContext) -> Iterator[tuple[Path, Path]]:
    """A scratch copy of the staged context, one file tampered: (the copy's root, the file).

    The file is one of the last layer (no later layer masks the change), else the status package's plugin.
    """
    with tempfile.TemporaryDirectory(prefix=".ci-image-tamper-", dir=proj.build) as scratch:
        root = Path(scratch) / "image"
        shutil.copytree(context.root, root, symlinks=True)
        victim = next(
            (root / "layers" / layer.layer / f.path for layer in context.layers[::-1] for f in layer.files),
            root / "overlay" / "vllm_overlay_status" / "plugin.py",
        )
        with open(victim, "a") as handle:
            handle.write(TAMPER_LINE)
        yield root, victim


def standin_base(run: Run) -> None:
    """The stand-in base (made if missing, or again with --rebuild-base) and the site-packages of its vllm."""
    eng, args = run.eng, run.options
    ref = STANDIN.format(version=run.the_lock.version)
    output.info(f"== stand-in base {ref} (storage: {args.storage_driver})")
    if args.rebuild_base and eng.image_exists(ref):
        sh(eng.exe, "rmi", "-f", ref)
    if eng.image_exists(ref):
        site = eng.inspect(ref)["OCIv1"]["config"]["Env"]
        site = next(e.split("=", 1)[1] for e in site if e.startswith("VLLM_STANDIN_SITE="))
        run.figures.append("stand-in base: present (cached)")
    else:
        started = time.monotonic()
        tar = rootfs_tar(run.store.ci, args.suite, args.mirror or apt_mirror())
        after_rootfs = time.monotonic()
        python = args.python or str(testenv.ensure(run.the_lock, run.store).python)
        site = make_standin(eng, ref, run.the_lock, python, tar)
        run.figures.append(
            f"stand-in base created in {time.monotonic() - started:.0f} s "
            f"(rootfs {after_rootfs - started:.0f} s, vllm copy + commit {time.monotonic() - after_rootfs:.0f} s)"
        )
    output.info(f"      vllm in the stand-in: {site}/vllm")
    run.ref, run.site = ref, site


def check_build(run: Run) -> list[str]:
    """Check 1: build-image builds the real Dockerfile on the stand-in and verifies inside; the added layers."""
    output.info("== 1. build the real Dockerfile on the stand-in, verify inside")
    if build_on_standin(run) != 0:
        run.failures.append("the build or its in-image verify failed")
        raise engine.EngineError("stopping: the image did not build")
    return run.eng.diff_ids(TAG)[len(run.eng.diff_ids(run.ref)) :]


def check_rebuild(run: Run, first: list[str]) -> list[str]:
    """Check 2: a second build without cache gives the same layer digests; its added layers."""
    output.info("== 2. rebuild without cache: same layer digests")
    if build_on_standin(run) != 0:
        run.failures.append("the --no-cache rebuild failed")
    second = run.eng.diff_ids(TAG)[len(run.eng.diff_ids(run.ref)) :]
    if first == second:
        run.figures.append(f"reproducible: {len(first)} added layer digests identical across a --no-cache rebuild")
    else:
        run.failures.append(f"layer digests differ across rebuilds: {first} vs {second}")
    return second


def check_tampered_layer(run: Run) -> None:
    """Check 3: a file tampered in a staged layer (of a copy of the context) fails the build's verify step."""
    output.info("== 3. a tampered file in a staged layer fails the build")
    context = run.built_context
    with tampered_copy(run.proj, context) as (root, victim):
        args_build = {**context.build_args, "VLLM_SITE_PACKAGES": run.site, "VLLM_RECORD_SCOPE": STANDIN_SCOPE}
        code = run.eng.build(root, ["localhost/vllm-overlay-ci:tampered-layer"], args_build, context.source_date_epoch)
        if code == 0:
            run.failures.append(f"tampered {victim.relative_to(root)} but the build passed")
        else:
            run.figures.append(f"tampered layer file {victim.relative_to(root)}: build failed as it must")


PLUGIN_ARGV = ["python3", "-c", "from vllm_overlay_status.plugin import register; register()"]
TAMPERED = "localhost/vllm-overlay-ci:tampered"


def check_tampered_image(run: Run) -> None:
    """Check 4: the plugin's entry point and the SBOM of the built image; files tampered in it fail verify."""
    output.info("== 4. tampered files in the built image fail verify and the plugin")
    eng = run.eng
    entry_points = "print([p.value for p in e(group='vllm.general_plugins')])"
    entry = eng.run(TAG, ["python3", "-c", "from importlib.metadata import entry_points as e; " + entry_points])
    if "vllm_overlay_status_gate:register" not in entry[1]:
        run.failures.append(f"plugin entry point not registered: {entry[1].strip()}")
    code, text = eng.run(TAG, ["python3", "-m", "vllm_overlay_status", "sbom"])
    sbom_problems = [f"exit {code}"] if code != 0 else sbom.problems(text, [p.name for p in run.patches])
    if sbom_problems:
        run.failures.append("the image's SBOM: " + "; ".join(sbom_problems))
    else:
        run.figures.append(
            f"SBOM: valid CycloneDX {sbom.SCHEMA.to_version()}, pedigree = the {len(run.patches)} patches"
        )
    if eng.run(TAG, PLUGIN_ARGV)[0] != 0:
        run.failures.append("the plugin fails on the untampered image")
    replaced = sorted(run.built_context.manifest["files"])
    for rel in ([replaced[0]] if replaced else []) + ["vllm/envs.py"]:
        _tamper_in_image(run, rel, rel in replaced)
    for ref_ in (TAMPERED, "localhost/vllm-overlay-ci:tampered-layer"):
        subprocess.run([eng.exe, "rmi", "-f", ref_], capture_output=True, check=False)


def _tamper_in_image(run: Run, rel: str, replaced: bool) -> None:
    """``rel`` tampered in a copy of the built image: verify must fail naming it, the plugin too if it is replaced."""
    eng = run.eng
    container = sh(eng.exe, "from", "--pull=never", TAG).splitlines()[-1]
    try:
        sh(eng.exe, "run", container, "--", "sh", "-c", f"echo '{TAMPER_LINE.strip()}' >> {run.site}/{rel}")
        sh(eng.exe, "commit", "-q", container, TAMPERED)
    finally:
        subprocess.run([eng.exe, "rm", container], capture_output=True, check=False)
    code, text = eng.run(TAMPERED, ["python3", "-m", "vllm_overlay_status", "verify"])
    if code == 0 or rel not in text:
        run.failures.append(f"tampered {rel} in the image, but verify said (exit {code}): {text.strip()[-300:]}")
    else:
        run.figures.append(f"tampered {rel} in the image: verify failed naming it")
    if replaced:
        code, text = eng.run(TAMPERED, PLUGIN_ARGV)
        if code == 0 or "OverlayMismatch" not in text:
            run.failures.append(f"tampered {rel}, but the plugin did not fail: {text.strip()[-300:]}")
        else:
            run.figures.append(f"tampered {rel} in the image: the plugin raised OverlayMismatch")


def check_root_build(run: Run, layers: list[str]) -> RootBuild:
    """Check 5: the project's Dockerfile as `docker build .` builds it, on the tool stand-in; what it compared with."""
    output.info("== 5. the project's Dockerfile, as `docker build .` builds it: same layers, same labels")
    eng, args, context = run.eng, run.options, run.built_context
    if context.root_defaults is None:
        raise engine.EngineError("--root-build compares at the series' own epoch: unset SOURCE_DATE_EPOCH")
    tool = TOOL_STANDIN.format(suite=args.tool_suite)
    if args.rebuild_base and eng.image_exists(tool):
        sh(eng.exe, "rmi", "-f", tool)
    if not eng.image_exists(tool):
        started = time.monotonic()
        rootfs = rootfs_tar(run.store.ci, args.tool_suite, args.mirror or apt_mirror(), TOOL_PACKAGES)
        make_tool_standin(eng, tool, rootfs, machine_ca_bundle())
        run.figures.append(f"tool stand-in {tool} created in {time.monotonic() - started:.0f} s")
    root = RootBuild(run.ref, tool, run.site, context.source_date_epoch, layers, eng.labels(TAG))
    root_build_checks(run.proj, eng, root, run.failures, run.figures)
    return root


def check_nonroot(run: Run, root: RootBuild) -> None:
    """Check 6: the project's Dockerfile over a non-root base (vLLM's vllm-openai-nonroot target), IMAGE_USER=vllm."""
    output.info("== 6. over a non-root base (vLLM's vllm-openai-nonroot target) with IMAGE_USER=vllm")
    eng = run.eng
    nonroot = f"{run.ref}-nonroot"
    make_nonroot_standin(eng, run.ref, nonroot, nonroot_entrypoint(run.the_lock, run.store))
    # As the README says to build it: docker build . with BASE_IMAGE and IMAGE_USER (the tool
    # stage comes from check 5's layer cache; check 5 proved what it makes).
    nonroot_args = {
        **root_build_args(root),
        "BASE_IMAGE": nonroot,
        "IMAGE_USER": NONROOT_USER,
        "BASE_ENTRYPOINT": NONROOT_ENTRYPOINT,
    }
    if eng.build(run.proj.root, [NONROOT_TAG], nonroot_args, run.built_context.source_date_epoch) != 0:
        run.failures.append("docker build . over the non-root stand-in failed (see the build output above)")
    else:
        nonroot_checks(eng, NONROOT_TAG, run.failures, run.figures)


def check_engine(run: Run, name: str, first: list[str], root: RootBuild | None) -> None:
    """Check 7 on ``name`` (docker through a daemon of the check's own, podman with its OCI runtime)."""
    output.info(f"== 7. {name}: build-image --engine {name}, runs in the image, tamper test, docker build .")
    buildah = BuildahResult(run.ref, run.site, first, run.eng.labels(TAG), root)
    started = time.monotonic()
    other = engine.Engine(name, shutil.which(name) or name, ENGINE_OPTIONS[name])
    if name == "docker":
        with dockerd.running(run.store, shutil.which("dockerd") or "dockerd", other.exe):
            engine_checks(run, other, buildah)
    else:
        # buildah's chroot isolation (BUILDAH_ISOLATION, for check 1-6) is not podman's: it runs containers
        # with its OCI runtime.
        isolation = os.environ.pop("BUILDAH_ISOLATION", None)
        try:
            engine_checks(run, other, buildah)
        finally:
            if isolation is not None:
                os.environ["BUILDAH_ISOLATION"] = isolation
    run.figures.append(f"{name}: its checks took {time.monotonic() - started:.0f} s")


def check_no_container_left(run: Run, before: set[str]) -> None:
    """A build that fails (check 3's, by design) must not leave its working container, which holds a
    mounted copy of the base in the store, behind: every CI run would add one."""
    left = sorted(set(sh(run.eng.exe, "containers", "-q").split()) - before)
    if left:
        run.failures.append(f"{len(left)} working container(s) left in the store: {', '.join(left)}")
    else:
        run.figures.append("no working container left in the store (failed builds included)")


def run_checks(proj: project.Project, options: Options) -> int:
    """Every check in order (the stand-in, checks 1-4, with --root-build 5 and 6, then 7 per other engine)."""
    failures: list[str] = []
    figures: list[str] = []
    try:
        the_lock = lock.load(proj.lock_file)
        patches = series.load_series(proj.patches)
        if os.geteuid() != 0:
            raise engine.EngineError("ci-image needs root (buildah with chroot isolation)")
        store = Store()
        use_storage(store.ci, options.storage_driver)
        eng = engine.find_engine("buildah")
        engines, not_checked = other_engines(options.engines)
        figures += not_checked
        run = Run(proj, options, the_lock, patches, store, eng, failures, figures)
        containers_before = set(sh(eng.exe, "containers", "-q").split())
        standin_base(run)
        first = check_build(run)
        second = check_rebuild(run, first)
        check_tampered_layer(run)
        check_tampered_image(run)
        root = None
        if options.root_build:
            root = check_root_build(run, second)
            check_nonroot(run, root)
        for name in engines:
            check_engine(run, name, first, root)
        check_no_container_left(run, containers_before)
    except (lock.LockError, series.SeriesError, build_context.ImageError, engine.EngineError, FileNotFoundError) as exc:
        output.error(str(exc))
        for line in figures:
            output.result(line)
        return 1 if failures else 2
    for line in figures:
        output.result(line)
    for failure in failures:
        output.error(failure)
    output.result("ci-image: " + ("all checks passed" if not failures else f"{len(failures)} check(s) failed"))
    return 1 if failures else 0
