"""Container engines behind build-image: docker, podman or buildah, one small interface.

buildah and podman honour their usual environment (STORAGE_DRIVER, BUILDAH_ISOLATION, ...);
buildah builds with ``--isolation chroot`` unless BUILDAH_ISOLATION says otherwise (it works as root
on machines without a container runtime). docker talks to the daemon DOCKER_HOST names.

Some machines need engine flags to run a container at all: Debian's podman 4.3 fails with its
default runtime ("cgroups in hybrid mode not supported") and needs ``--runtime runc`` and ulimits
runc accepts (``--ulimit nofile=1024:1024 --ulimit nproc=4096:4096``). :class:`Options` carries
them, and each engine gets them where its command line takes them (podman's ``--runtime`` is a
global flag, docker's a ``run`` flag; docker's builder picks no runtime).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay.errors import InputError

ENGINES = ("docker", "podman", "buildah")


class EngineError(InputError, RuntimeError):
    """No usable engine, or the engine failed."""


def _run(argv: list[str], *, stream: bool = False) -> subprocess.CompletedProcess:
    if stream:  # the engine's own progress goes to our stderr as it happens
        return subprocess.run(argv, stdout=2, stderr=2, check=False)
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@dataclass(frozen=True)
class Options:
    """Engine flags for builds and runs (build-image's --runtime, --ulimit, --network)."""

    runtime: str | None = None  # OCI runtime: podman (global flag) and docker run; buildah: its --runtime
    ulimits: tuple[str, ...] = ()  # TYPE=SOFT:HARD, to every build and run
    network: str | None = None  # network mode of builds' RUN steps and of runs (e.g. none, host)


@dataclass
class Engine:
    name: str
    exe: str
    options: Options = field(default_factory=Options)

    @property
    def is_buildah(self) -> bool:
        return self.name == "buildah"

    def _cmd(self, *args: str) -> list[str]:
        if self.name == "podman" and self.options.runtime:
            return [self.exe, "--runtime", self.options.runtime, *args]
        return [self.exe, *args]

    def _flags(self, verb: str) -> list[str]:
        """The options' flags for ``verb`` (build or run) of this engine."""
        flags = []
        if self.options.runtime and ((verb == "run" and self.name == "docker") or self.name == "buildah"):
            flags += ["--runtime", self.options.runtime]
        for limit in self.options.ulimits:
            if verb == "build" or not self.is_buildah:  # buildah run takes no --ulimit
                flags += ["--ulimit", limit]
        if self.options.network:
            flags += ["--network", self.options.network]
        return flags

    def image_exists(self, ref: str) -> bool:
        if self.is_buildah:
            return _run(self._cmd("inspect", "--type", "image", ref)).returncode == 0
        return _run(self._cmd("image", "inspect", ref)).returncode == 0

    def pull(self, ref: str) -> tuple[bool, str]:
        result = _run(self._cmd("pull", ref))
        return result.returncode == 0, (result.stderr or result.stdout).strip()

    def build(
        self, context: Path, tags: list[str], build_args: dict[str, str], epoch: int, *, no_cache: bool = False
    ) -> int:
        argv = self._cmd("build", "-f", str(context / "Dockerfile"), *self._flags("build"))
        if no_cache:
            argv.append("--no-cache")
        for tag in tags:
            argv += ["-t", tag]
        for key, value in build_args.items():
            argv += ["--build-arg", f"{key}={value}"]
        # --force-rm: a failed build's working container is removed too (it would hold a mounted
        # copy of the base in the storage until someone runs `buildah rm`).
        if self.is_buildah:
            argv += [
                "--layers",
                "--force-rm",
                "--isolation",
                os.environ.get("BUILDAH_ISOLATION", "chroot"),
                "--timestamp",
                str(epoch),
            ]
        elif self.name == "podman":
            argv += ["--layers", "--force-rm", "--timestamp", str(epoch)]
        else:  # docker's builder takes no timestamp: its layers carry build times (README, Container image)
            argv.append("--force-rm")
        argv.append(str(context))
        return _run(argv, stream=True).returncode

    def run(self, ref: str, argv: list[str]) -> tuple[int, str]:
        """Run ``argv`` (entrypoint overridden) in a throwaway container of ``ref``; (exit code, output)."""
        if not self.is_buildah:
            result = _run(self._cmd("run", "--rm", *self._flags("run"), "--entrypoint", argv[0], ref, *argv[1:]))
            return result.returncode, result.stdout + result.stderr
        made = _run(self._cmd("from", "--pull=never", ref))
        if made.returncode != 0:
            raise EngineError(f"buildah from {ref}: {made.stderr.strip()}")
        container = made.stdout.strip().splitlines()[-1]
        try:
            isolation = os.environ.get("BUILDAH_ISOLATION", "chroot")
            result = _run(self._cmd("run", "--isolation", isolation, *self._flags("run"), container, "--", *argv))
            return result.returncode, result.stdout + result.stderr
        finally:
            _run(self._cmd("rm", container))

    def inspect(self, ref: str) -> dict:
        result = _run(
            self._cmd("inspect", "--type", "image", ref) if self.is_buildah else self._cmd("image", "inspect", ref)
        )
        if result.returncode != 0:
            raise EngineError(f"{self.name} inspect {ref}: {result.stderr.strip()}")
        data = json.loads(result.stdout)
        return data[0] if isinstance(data, list) else data

    def diff_ids(self, ref: str) -> list[str]:
        data = self.inspect(ref)
        if self.is_buildah:
            return list(data["OCIv1"]["rootfs"]["diff_ids"])
        return list(data["RootFS"]["Layers"])

    def labels(self, ref: str) -> dict[str, str]:
        data = self.inspect(ref)
        if self.is_buildah:
            return dict(data["OCIv1"]["config"].get("Labels") or {})
        return dict(data["Config"].get("Labels") or {})

    def digest(self, ref: str) -> str:
        """The manifest digest the engine knows for ``ref`` ('' if none)."""
        data = self.inspect(ref)
        if self.is_buildah:
            return data.get("FromImageDigest", "") or ""
        for repo_digest in data.get("RepoDigests") or []:
            return repo_digest.split("@", 1)[1]
        return ""

    def layer_sizes(self, ref: str) -> list[int | None]:
        """Uncompressed size of each layer, in order (None where the engine does not say)."""
        ids = self.diff_ids(ref)
        if self.name == "docker":
            return [None] * len(ids)
        info = _run(self._cmd("info") if self.is_buildah else self._cmd("info", "--format", "json"))
        try:
            store = json.loads(info.stdout)["store"]
            root, driver = (
                store.get("GraphRoot") or store["graphRoot"],
                store.get("GraphDriverName") or store["graphDriverName"],
            )
            layers = json.loads((Path(root) / f"{driver}-layers" / "layers.json").read_text())
        except (ValueError, KeyError, OSError):
            return [None] * len(ids)
        sizes = {entry.get("diff-digest"): entry.get("diff-size") for entry in layers}
        return [sizes.get(i) for i in ids]

    def image_size(self, ref: str) -> int | None:
        if self.name == "docker":
            return int(self.inspect(ref).get("Size") or 0) or None
        sizes = self.layer_sizes(ref)
        return None if None in sizes else sum(s for s in sizes if s is not None)


def _docker_usable(exe: str) -> bool:
    return _run([exe, "version", "--format", "{{.Server.Version}}"]).returncode == 0


def find_engine(choice: str = "auto", options: Options | None = None) -> Engine:
    """The engine to build with: ``choice`` if given, else the first of docker, podman, buildah that works."""
    names = ENGINES if choice == "auto" else (choice,)
    missing = []
    for name in names:
        exe = shutil.which(name)
        if exe is None:
            missing.append(f"{name}: not installed")
            continue
        if name == "docker" and not _docker_usable(exe):
            missing.append("docker: installed, but no Docker daemon answers")
            continue
        return Engine(name, exe, options or Options())
    hint = "install one (Debian: apt-get install buildah) or pick one with --engine"
    raise EngineError("no container engine to build with (" + "; ".join(missing) + f"); {hint}")
