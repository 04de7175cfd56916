"""What no vLLM plugin can check, run by the image's entrypoint before the base image's own.

vLLM runs this overlay's check itself, in every process it starts, through its general-plugin
loader (vllm.plugins.load_plugins_by_group). But the loader calls only the entry points it finds,
and when ``VLLM_PLUGINS`` is set, only those it names (``os.environ["VLLM_PLUGINS"].split(",")``
compared by exact name). A process started with ``VLLM_PLUGINS`` leaving this plugin out, or with
its entry point or gate module gone from the image, serves without any check and logs nothing
about it. The image's entrypoint therefore runs :func:`problems` first and refuses to start
(exit 2) on any of them, then the full ``verify`` (exit 1 on any difference), then execs the base
image's entrypoint. ``VLLM_OVERLAY_ALLOW_MISMATCH=1`` turns both refusals into warnings, as it
does for the plugin.

What still bypasses it: ``--entrypoint`` given to ``docker run`` (the container then runs what its
user chose), and a process started inside a running container by hand.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "vllm_overlay_status"
GATE_MODULE = "vllm_overlay_status_gate"
GATE_TARGET = f"{GATE_MODULE}:register"
ENTRYPOINT = "/usr/local/bin/vllm-overlay-entrypoint"


def problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """Why vLLM would start a process without the overlay's check ([] if it would run it)."""
    environ = os.environ if environ is None else environ
    found: list[str] = []
    chosen = environ.get("VLLM_PLUGINS")
    if chosen is not None and PLUGIN_NAME not in chosen.split(","):
        wanted = f"{chosen},{PLUGIN_NAME}" if chosen else PLUGIN_NAME
        found.append(
            f"plugins-excluded: VLLM_PLUGINS={chosen!r} leaves out {PLUGIN_NAME}, so vLLM would start without "
            f"the overlay's check; name it too (VLLM_PLUGINS={wanted}) or unset VLLM_PLUGINS"
        )
    points = [ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if not points:
        found.append(
            f"plugin-missing: no {PLUGIN_GROUP} entry point named {PLUGIN_NAME} (its dist-info's "
            "entry_points.txt is gone), so vLLM would never call the check"
        )
    elif {ep.value for ep in points} != {GATE_TARGET}:
        values = ", ".join(sorted(ep.value for ep in points))
        found.append(f"plugin-changed: the {PLUGIN_NAME} entry point names {values}, not {GATE_TARGET}")
    if importlib.util.find_spec(GATE_MODULE) is None:
        found.append(f"gate-missing: {GATE_MODULE} cannot be found, so vLLM would skip the plugin")
    return found


def script(python: str, then: str, manifest_sha256: str = "") -> str:
    """The entrypoint: preflight in ``python``, then ``then`` (the base's entrypoint) with the arguments.

    ``manifest_sha256``: the manifest's sha256 as the build proved it against the image's label; the
    preflight then refuses a manifest edited since (its RECORD and file hashes are what it trusts).
    """
    run = f'exec {" ".join(shlex.quote(word) for word in shlex.split(then))} "$@"' if then.strip() else 'exec "$@"'
    expect = f" --expect manifest_sha256={shlex.quote(manifest_sha256)}" if manifest_sha256 else ""
    return (
        "#!/bin/sh\n"
        "# The overlay image's entrypoint (python3 -m vllm_overlay_status entrypoint wrote it at build):\n"
        "# the checks no vLLM plugin can make, then the base image's own entrypoint with these arguments.\n"
        f"{shlex.quote(python)} -m vllm_overlay_status preflight{expect} || exit $?\n"
        f"{run}\n"
    )


def write_script(path: Path, python: str, then: str, manifest_sha256: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script(python, then, manifest_sha256), encoding="utf-8")
    path.chmod(0o755)
