"""Verify an installed vllm: the locked version, RECORD-pristine apart from the overlay's files.

The same check the image runs as its last build step (python3 -m vllm_overlay_status verify), run
here against any site-packages: the installed vllm is the locked version; every file its RECORD lists
and the overlay did not replace matches RECORD; every replaced or added file matches the manifest;
any other file in the package is named. The manifest is --manifest, else the one installed beside
vllm (vllm_overlay_status/manifest.json), else none: then vllm must be pristine. Never imports vllm
or torch.

Exit codes: 0 verified; 1 differences found (listed on stderr); 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_overlay import atomicfile, lock, output, project, shadow
from vllm_overlay.image import verify


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--site-packages", type=Path, default=None, help="directory holding vllm/ and its dist-info")
    # No default in the parser: argparse lets an option that equals its default pass a mutually exclusive
    # group, so "--site-packages X --python python3" would be taken with --python ignored.
    where.add_argument("--python", default=None, help="use this interpreter's vllm (default: python3)")
    parser.add_argument("--manifest", type=Path, default=None, help="overlay manifest (default: the installed one)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the result as JSON")


def run(args: argparse.Namespace) -> int:
    proj = project.from_args(args)
    try:
        the_lock = lock.load(proj.lock_file)
        site = args.site_packages or shadow.installed_package_dir(args.python or "python3").parent
        manifest, origin = verify.choose_manifest(site, args.manifest, the_lock)
    except (lock.LockError, FileNotFoundError, OSError, ValueError) as exc:
        output.error(str(exc))
        return 2
    output.info(f"verifying {site} (manifest: {origin})")
    started = time.monotonic()
    problems = verify.verify_site_packages(site, manifest, proj.overlay)
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
        f"verified: vllm {manifest['upstream']['version']} in {site}: RECORD-pristine apart from {replaced} "
        f"replaced file(s), which match the manifest ({seconds:.1f} s)"
    )
    return 0
