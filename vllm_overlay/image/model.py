"""What a build context is: its directory, one layer per series with the files it ships, and the build's inputs.

Data alone, so that the modules that make a context (build_context), render its Dockerfile
(dockerfile) and name its labels (labels) share these types without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ShippedFile:
    path: str  # relative to site-packages: vllm/...
    sha256: str
    size: int
    change: str  # modified | added
    executable: bool = False

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size, "change": self.change}


@dataclass
class SeriesLayer:
    name: str
    layer: str  # directory under layers/, e.g. 01-loader-layouts
    patches: list[dict[str, str]] = field(default_factory=list)
    files: list[ShippedFile] = field(default_factory=list)
    end_commit: str = ""

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class BuildContext:
    """A staged build context: its directory, layers, manifest, and what the build gets (arguments, labels)."""

    root: Path
    layers: list[SeriesLayer]
    manifest: dict
    build_args: dict[str, str]
    labels: dict[str, str]
    unshipped: list[dict]
    source_date_epoch: int
    dockerfile_block: str
    # ROOT_DEFAULTS as the project's Dockerfile must carry them; None when staged at another epoch
    root_defaults: dict[str, str] | None

    @property
    def dockerfile(self) -> Path:
        return self.root / "Dockerfile"

    @property
    def series_sha256(self) -> str:
        return self.manifest["series_sha256"]

    @property
    def staged_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())
