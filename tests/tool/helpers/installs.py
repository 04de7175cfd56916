"""A fake installed vllm: a site-packages with a RECORD, and the locked wheel's RECORD in the cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.tool.helpers.repos import UPSTREAM_FILES
from vllm_overlay.env import record
from vllm_overlay.upstream import lock


def make_installed(root: Path) -> Path:
    pkg = root / "vllm"
    (pkg / "sub" / "deep").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("A = 'installed'\n")
    (pkg / "gone.py").write_text("G = 1\n")
    (pkg / "lib.so").write_bytes(b"\0binary")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("B = 'installed'\n")
    (pkg / "sub" / "c.py").write_text("C = 'installed'\n")
    (pkg / "sub" / "deep" / "__init__.py").write_text("")
    for directory in (pkg, pkg / "sub"):
        (directory / "__pycache__").mkdir()
        for module in ("a", "b", "c", "gone", "__init__"):
            (directory / "__pycache__" / f"{module}.cpython-311.pyc").write_bytes(b"pyc")
    return pkg


def _metadata(version: str) -> bytes:
    return f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()


def fake_wheel_record(version: str = "0.33.0") -> str:
    """The RECORD of the fake vllm wheel :func:`make_site` installs (the expectation its checks get)."""
    rows = [f"{rel},{record.record_hash(sha(data))},{len(data)}" for rel, data in UPSTREAM_FILES.items()]
    info, metadata = f"vllm-{version}.dist-info", _metadata(version)
    rows += [f"{info}/METADATA,{record.record_hash(sha(metadata))},{len(metadata)}", f"{info}/RECORD,,"]
    return "\n".join(rows) + "\n"


def make_site(root: Path, version: str = "0.33.0") -> Path:
    """A site-packages with a vllm 'wheel install': files plus a dist-info whose RECORD lists them."""
    for rel, data in UPSTREAM_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    dist = root / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_bytes(_metadata(version))
    (dist / "RECORD").write_text(fake_wheel_record(version))
    return root


def site_record(site: Path) -> str:
    """The RECORD :func:`make_site` wrote, read before a test tampers: the wheel's, the expectation."""
    return next(site.glob("vllm-*.dist-info")).joinpath("RECORD").read_text()


def seed_wheel_record(store_root: Path, the_lock: lock.Lock, text: str, arch: str | None = None) -> None:
    """Put ``text`` in the cache as the locked wheel's RECORD (as if downloaded and checked): no download."""
    from vllm_overlay.env import wheel_record

    filename, sha256 = wheel_record.wheel_for(the_lock, arch)
    downloads = store_root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    (downloads / (filename + wheel_record.SUFFIX)).write_text(text, encoding="utf-8")
    (downloads / (filename + wheel_record.SUFFIX + ".sha256")).write_text(f"{sha256} {record.text_sha256(text)}\n")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


LOCKED = "__version__ = version = '0.33.0'\n__commit_id__ = commit_id = 'g4ba787ec9'\n"
