"""python3 -m vllm_overlay_status {status,verify,compile}: what this image carries, and proof of it.

status   the upstream release, the applied series and patches (with sha256s) and the replaced files,
         with a quick check of the replaced files as installed (--json: the manifest itself)
verify   the full check (exit 1 on any difference): the installed vllm is the manifest's version,
         every file not replaced matches the locked wheel's RECORD (the copy wheel.RECORD beside
         this package, whose sha256 the manifest states; the installed RECORD must agree with it),
         every replaced file matches the manifest, nothing else was added (files, directories,
         symlinks), this package's own files match the manifest; never imports vllm or torch.
         $VLLM_OVERLAY_RECORD_SCOPE=.py checks the .py files only (stand-in bases; said in the verdict).
         --expect NAME=VALUE
         (repeatable) also checks what a label states: upstream_version, upstream_commit,
         series_sha256, series, manifest_sha256, sbom_sha256 (the image build passes its labels)
compile  byte-compile the replaced files (checked-hash pycs); the image build runs it
sbom     print the image's CycloneDX SBOM (JSON; sbom.cdx.json beside this package): the vllm
         release with every carried patch as its pedigree
preflight  what the image's entrypoint runs before the base's own: refuses (exit 2) what no vLLM
         plugin can catch (VLLM_PLUGINS leaving this plugin out, its entry point or gate gone),
         then verify's full check (exit 1); VLLM_OVERLAY_ALLOW_MISMATCH=1 warns instead
entrypoint --write PATH --then CMD   write that entrypoint script (the image build runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import SBOM_NAME, ManifestError, load_manifest, manifest_path, vllm_site_packages
from .checks import SCOPE_ENV, carried_facts, compile_replaced, label_problems, record_scope, running, verify


def _scope_note() -> str:
    """What the verdict says of a reduced check (empty for the full one)."""
    scope = record_scope()
    return f"; only the wheel's {', '.join(scope)} files and dist-info were checked (${SCOPE_ENV})" if scope else ""


def _site(args: argparse.Namespace) -> Path:
    if args.site_packages is not None:
        return args.site_packages
    found = vllm_site_packages()
    if found is None:
        sys.exit("error: no vllm package on this interpreter's path; pass --site-packages")
    return found


def _expectation(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def cmd_status(args: argparse.Namespace, manifest: dict) -> int:
    if args.json:
        print(json.dumps(manifest, indent=2, sort_keys=True))
        return 0
    upstream = manifest["upstream"]
    site = _site(args)
    problems = running(site, manifest)
    print(f"upstream:      {upstream['project']} {upstream['version']} (release commit {upstream['commit']})")
    print(f"series sha256: {manifest['series_sha256']}")
    print(f"manifest:      {manifest_path()}")
    print(f"site-packages: {site}")
    for number, series in enumerate(manifest["series"], start=1):
        print(f"series {number}: {series['name']}  (layer {series['layer']})")
        for patch in series["patches"]:
            print(f"  patch  {patch['name']}  sha256 {patch['sha256']}")
            print(f"         {patch['subject']}")
        for entry in series["files"]:
            print(f"  ships  {entry['path']}  sha256 {entry['sha256']}  ({entry['change']})")
    for entry in manifest.get("unshipped", []):
        print(f"not shipped (outside the installed package): {entry['path']}  ({', '.join(entry['patches'])})")
    if not manifest["series"]:
        print("no patches: the image carries pristine upstream vllm")
    print("replaced files as installed: " + ("match the manifest" if not problems else "DO NOT MATCH"))
    for problem in problems:
        print(f"  {problem}")
    return 1 if problems else 0


def cmd_verify(args: argparse.Namespace, manifest: dict) -> int:
    site = _site(args)
    started = time.monotonic()
    problems = verify(site, manifest, suffixes=record_scope())
    if args.expect:
        source = args.manifest or manifest_path()
        problems += label_problems(dict(args.expect), carried_facts(manifest, source, source.parent / SBOM_NAME))
    seconds = time.monotonic() - started
    if args.json:
        print(json.dumps({"site_packages": str(site), "ok": not problems, "problems": problems}, indent=2))
    else:
        for problem in problems:
            print(problem, file=sys.stderr)
        count = len(manifest.get("files", {}))
        verdict = (
            f"verified: vllm {manifest['upstream']['version']} in {site} is the locked wheel's RECORD (sha256 "
            f"{str(manifest.get('expected_record', {}).get('sha256', '?'))[:16]}, as the manifest states) apart from "
            f"{count} replaced file(s), which match the manifest"
            + (f"; the {len(args.expect)} label fact(s) given match it" if args.expect else "")
            + _scope_note()
            + f" ({seconds:.1f} s)"
            if not problems
            else f"FAILED: {len(problems)} difference(s) from the manifest and the wheel's RECORD"
            + (" and the labels given" if args.expect else "")
            + f" in {site}"
        )
        print(verdict)
    return 1 if problems else 0


def cmd_compile(args: argparse.Namespace, manifest: dict) -> int:
    written = compile_replaced(_site(args), manifest)
    print(f"byte-compiled {len(written)} file(s) (checked-hash)")
    return 0


def cmd_sbom(args: argparse.Namespace, manifest: dict) -> int:
    path = manifest_path().parent / SBOM_NAME
    try:
        sys.stdout.write(path.read_text(encoding="utf-8"))
    except OSError as exc:
        print(
            f"error: {path}: no SBOM ({exc.strerror}; was this package staged by scripts/build-image?)", file=sys.stderr
        )
        return 2
    return 0


def cmd_preflight(args: argparse.Namespace, manifest: dict) -> int:
    from .plugin import ALLOW_ENV
    from .preflight import problems

    allowed = os.environ.get(ALLOW_ENV) == "1"
    refused = problems()
    for problem in refused:
        print(f"vllm overlay preflight: {problem}", file=sys.stderr)
    if refused and not allowed:
        print(
            f"vllm overlay preflight: refusing to start ({ALLOW_ENV}=1 overrides, for debugging only)", file=sys.stderr
        )
        return 2
    site = _site(args)
    started = time.monotonic()
    differences = verify(site, manifest, suffixes=record_scope())
    if args.expect:  # the manifest the build verified against the label (the entrypoint script states it)
        source = args.manifest or manifest_path()
        differences += label_problems(dict(args.expect), carried_facts(manifest, source, source.parent / SBOM_NAME))
    for problem in differences:
        print(f"vllm overlay preflight: {problem}", file=sys.stderr)
    if differences and not allowed:
        print(
            f"vllm overlay preflight: {len(differences)} difference(s) from the manifest and the wheel's RECORD "
            f"in {site}; "
            f"refusing to start ({ALLOW_ENV}=1 overrides, for debugging only)",
            file=sys.stderr,
        )
        return 1
    print(
        f"vllm overlay preflight: plugin {'NOT ' if refused else ''}selected and present; vllm in {site} "
        f"{'DIFFERS from' if differences else 'verified against'} the manifest and the locked wheel's RECORD"
        f"{_scope_note()} ({time.monotonic() - started:.1f} s)",
        file=sys.stderr,
    )
    return 0


def cmd_entrypoint(args: argparse.Namespace, manifest: dict) -> int:
    from .checks import sha256_file
    from .preflight import write_script

    # The manifest as the build's verify step proved it against the image's label: the preflight holds it to that.
    write_script(args.write, args.python or sys.executable, args.then, sha256_file(args.manifest or manifest_path()))
    print(f"wrote {args.write}: preflight, then {args.then or 'the command given'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m vllm_overlay_status", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--manifest", type=Path, default=None, help="manifest to use (default: the one shipped here)")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers = (
        ("status", cmd_status),
        ("verify", cmd_verify),
        ("compile", cmd_compile),
        ("sbom", cmd_sbom),
        ("preflight", cmd_preflight),
        ("entrypoint", cmd_entrypoint),
    )
    for name, handler in handlers:
        command = sub.add_parser(name)
        if name == "sbom":
            command.set_defaults(handler=handler)
            continue
        if name == "entrypoint":
            command.add_argument("--write", type=Path, required=True, help="where to write the script")
            command.add_argument("--then", default="", help="the base image's entrypoint, run after the checks")
            command.add_argument("--python", default=None, help="the interpreter the script runs (default: this one)")
            command.set_defaults(handler=handler)
            continue
        command.add_argument("--site-packages", type=Path, default=None, help="default: where vllm is found")
        if name not in ("compile", "preflight"):
            command.add_argument("--json", action="store_true", help="machine-readable output")
        if name in ("verify", "preflight"):
            command.add_argument(
                "--expect",
                action="append",
                default=[],
                type=_expectation,
                metavar="NAME=VALUE",
                help="also check what a label states (repeatable; names: see above)",
            )
        command.set_defaults(handler=handler)
    args = parser.parse_args(argv)
    try:
        manifest = load_manifest(args.manifest)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return args.handler(args, manifest)


if __name__ == "__main__":
    sys.exit(main())
