"""Shared helpers of the tool tests: a tiny upstream tree, git with a fixed identity, patch text.

Imported by the tests and by conftest.py's fixtures; nothing here imports vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from vllm_overlay import apply, cli, lock, record, series, upstream_trees
from vllm_overlay.image import build_context
from vllm_overlay.image.model import BuildContext
from vllm_overlay.junit import Case
from vllm_overlay.project import Project
from vllm_overlay.store import Store

REPO_ROOT = Path(__file__).resolve().parents[2]

IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_AUTHOR_DATE": "2026-11-29T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-11-29T00:00:00+0000",
}

# vLLM's two SPDX lines, which every file under tests/patches/ carries (lint-patches checks them).
SPDX_HEADER = (
    "# SPDX-License-Identifier: Apache-2.0\n# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)

# The message body lint-patches asks for: five headings, each with its text.
BODY = """Why

Why and how.

How

The change.

Configurations covered

Every configuration.

Tests

The demo test.

Upstream status

Not forwarded.

"""

TRAILERS = """Description: {subject}
Origin: vendor
Forwarded: no (reason: a test patch; drop when: the test ends)
Last-Update: 2026-11-29
Series: {series}
Tests: tests/patches/{series}/test_demo.py
Upstream-Tests: tests/test_demo_upstream.py
Targets: vllm.core:value
"""

FORWARDED = next(line for line in TRAILERS.splitlines() if line.startswith("Forwarded:"))


UPSTREAM_FILES = {
    "vllm/__init__.py": b"",
    "vllm/core.py": b"value = 1\n",
    "vllm/utils/math.py": b"def cdiv(a, b):\n    return -(-a // b)\n",
}


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    import os

    full_env = dict(os.environ, **IDENTITY, **(env or {}))
    return subprocess.run(["git", *args], cwd=cwd, env=full_env, check=True, capture_output=True, text=True).stdout


def write_upstream(root: Path, lines: int = 40, extra: dict[str, str] | None = None) -> Path:
    """A minimal vLLM-shaped tree: vllm/core.py with numbered lines, vllm/_version.py."""
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(
        "__version__ = version = '9.9.9'\n__commit_id__ = commit_id = 'gdeadbeef'\n"
    )
    (root / "vllm" / "core.py").write_text("".join(f"line_{i} = {i}\n" for i in range(1, lines + 1)))
    for name, text in (extra or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PatchMaker = Callable[..., Path]


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def retarget(path, target):
    path.write_text(path.read_text().replace("Targets: vllm.core:value", f"Targets: {target}"))


class Forked:
    """``cli.main(argv)`` (or ``run()``) in a forked child: a real process to kill or signal, without an
    interpreter's start-up. What the child writes to stderr comes back through a pipe."""

    def __init__(
        self, argv: list[str] | None = None, env: dict[str, str] | None = None, run: Callable[[], int] | None = None
    ) -> None:
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                # Ctrl-C as a terminal delivers it: a run started in the background by a shell without
                # job control (`cmd &` in a script) inherits SIGINT ignored, and Python then keeps it so.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.dup2(write, 2)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                sys.stdout = open(os.devnull, "w")
                os.environ.update(env or {})
                code = run() if run is not None else cli.main(argv or [])
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        self.stderr = os.fdopen(read, "r")

    def wait(self) -> tuple[int, str]:
        """Exit code (negative: killed by that signal) and everything it wrote to stderr."""
        err = self.stderr.read()
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1]), err

    def running(self) -> bool:
        return os.waitpid(self.pid, os.WNOHANG)[0] == 0


def wait_for(path: Path, process: Forked) -> int:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text().strip():
        assert process.running(), "the run ended before it reached git am"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return int(path.read_text())


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat[stat.rindex(")") + 2 :].startswith("Z")


def change_line_20(tree: Path) -> None:
    replace_line(tree / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 200\n")


def run_apply(project: Path, upstream: Path, *extra: str, base: Path | None = None) -> tuple[int, dict]:
    """apply-patches onto ``upstream``; ``base`` is the tree the patches were made on (default: the same)."""
    report = project / "report.json"
    code = cli.main(
        [
            "apply-patches",
            "--project",
            str(project),
            "--upstream",
            str(upstream),
            "--base-upstream",
            str(base or upstream),
            "--json",
            str(report),
            *extra,
        ]
    )
    return code, json.loads(report.read_text())


def statuses(report: dict) -> list[str]:
    return [p["status"] for p in report["patches"]]


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


def snapshot(patches_dir):
    return {
        p.relative_to(patches_dir).as_posix(): p.read_bytes() for p in sorted(patches_dir.rglob("*")) if p.is_file()
    }


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
    from vllm_overlay import wheel_record

    filename, sha256 = wheel_record.wheel_for(the_lock, arch)
    downloads = store_root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    (downloads / (filename + wheel_record.SUFFIX)).write_text(text, encoding="utf-8")
    (downloads / (filename + wheel_record.SUFFIX + ".sha256")).write_text(f"{sha256} {record.text_sha256(text)}\n")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


LOCKED = "__version__ = version = '0.33.0'\n__commit_id__ = commit_id = 'g4ba787ec9'\n"


def apply_no_patches(project: Path, upstream: Path) -> None:
    """build/patched as the pristine upstream: apply-patches refuses an empty series, the engine does not."""
    store = Store()
    up = upstream_trees.obtain(str(upstream), lock.load(project / "upstream.lock"), store)
    result = apply.apply_series(
        [], up, lambda d, only: upstream_trees.checkout(store, up, d, only), project / "build/patched", apply.Options()
    )
    assert result.ok


def do_stage(project: Path, epoch: int = 1_700_000_000) -> build_context.BuildContext:
    proj = Project(project)
    return build_context.stage(proj, lock.load(proj.lock_file), series.load_series(proj.patches), epoch=epoch)


def users_files(directory: Path) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "notes.txt").write_text("the user's notes\n")
    (directory / "sub").mkdir(exist_ok=True)
    (directory / "sub" / "data.bin").write_bytes(b"\0\1\2")
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def symlinked_upstream(tmp_path: Path, make_patch: PatchMaker) -> tuple[Path, Path]:
    """A patch of vllm/plugins/hook.py made where vllm/plugins is a directory (the base), and an
    upstream where vllm/plugins is a symlink to vllm/real (where it is applied): (base, upstream)."""
    base = write_upstream(tmp_path / "base", extra={"vllm/plugins/hook.py": "hook = 1\n", "vllm/real/hook.py": "x\n"})
    make_patch(base, lambda t: replace_line(t / "vllm" / "plugins" / "hook.py", "hook = 1\n", "hook = 2\n"), "hook")
    linked = write_upstream(tmp_path / "linked", extra={"vllm/real/hook.py": "hook = 1\n"})
    os.symlink("real", linked / "vllm" / "plugins")
    return base, linked


def tree_files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def add_module_and_doc(tree: Path) -> None:
    (tree / "vllm" / "added.py").write_text("ADDED = 1\n")
    (tree / "docs.md").write_text("x\n")


def two_series(make_patch, upstream_dir):
    make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1", "alpha"
    )
    make_patch(upstream_dir, add_module_and_doc, "a2", "alpha")
    make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_9 = 9\n", "line_9 = 90\n"), "b1", "beta"
    )


def case(test_id: str, outcome: str) -> Case:
    return Case(test_id, test_id.split("::", 1)[0], outcome)


def cases(*pairs: tuple[str, str]) -> dict[str, Case]:
    return {i: case(i, o) for i, o in pairs}


UPSTREAM_TEST = """\
from vllm.core import line_2


def test_line_two():
    assert line_2 == 2


def test_always():
    pass
"""


RED_GREEN_TEST = """\
from vllm.core import line_1


def test_line_one_is_fixed():
    assert line_1 == 100
"""


def fake_env(root: Path, upstream: Path, version: str) -> Path:
    """A venv seeing this interpreter's site-packages (pytest), holding a fake vllm with a RECORD.

    Through a .pth file, not --system-site-packages: when the tests run in a virtual environment
    (scripts/check runs them in .venv), the system site-packages are the base interpreter's, which
    need not have pytest (Debian's python3 has none).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(
        subprocess.run(
            [str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    paths = sysconfig.get_paths()
    (site / "running-interpreter.pth").write_text(f"{paths['purelib']}\n{paths['platlib']}\n")
    shutil.copytree(upstream / "vllm", site / "vllm")
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    lines = [
        f"{p.relative_to(site).as_posix()},{record.record_hash(hashlib.sha256(p.read_bytes()).hexdigest())},"
        f"{p.stat().st_size}"
        for p in [*sorted((site / "vllm").rglob("*")), info / "METADATA"]  # a wheel's RECORD lists its METADATA
        if p.is_file()
    ]
    (info / "RECORD").write_text("\n".join([*lines, f"{info.name}/RECORD,,"]) + "\n")
    return root


def add_patch(fx: dict, subject: str, series: str, edit, test_text: str, upstream_tests: str) -> None:
    path = fx["make_patch"](fx["upstream"], edit, subject, series)
    text = path.read_text().replace("Upstream-Tests: tests/test_demo_upstream.py", f"Upstream-Tests: {upstream_tests}")
    path.write_text(text)
    (fx["project"] / "tests" / "patches" / series / "test_demo.py").write_text(test_text)


def run_cli(fx: dict, tmp_path: Path, *extra: str, tool_tests: bool = False) -> tuple[int, dict, ET.Element]:
    json_out, junit_out = tmp_path / "report.json", tmp_path / "report.xml"
    code = cli.main(
        ["test-patches", "--project", str(fx["project"]), "--upstream", str(fx["upstream"]),
         "--env", str(fx["env"]), "--json", str(json_out), "--junit", str(junit_out),
         *([] if tool_tests else ["--no-tool-tests"]), "--jobs", "2", *extra]
    )  # fmt: skip
    return code, json.loads(json_out.read_text()), ET.parse(junit_out).getroot()


def fix_line_one(root: Path) -> None:
    replace_line(root / "vllm" / "core.py", "line_1 = 1\n", "line_1 = 100\n")


def add_line_41(root: Path) -> None:
    replace_line(root / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 20  # twenty\nline_41 = 41\n")


def verb_help(verb: str, capsys) -> str:
    """``--help`` of ``verb`` as the user sees it (argparse exits 0 after printing it)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([verb, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def bare_build_context(root: Path, manifest: dict | None = None) -> BuildContext:
    """A build context of no layers, built directly (no staging): for code that reads one."""
    return BuildContext(
        root=root,
        layers=[],
        manifest={"series_sha256": "ab" * 32, **(manifest or {})},
        build_args={},
        labels={},
        unshipped=[],
        source_date_epoch=0,
        dockerfile_block="",
        root_defaults=None,
    )


def release_archive(tmp_path: Path, version: str) -> Path:
    """An sdist of ``write_upstream``'s tree (its vllm/_version.py says 9.9.9, gdeadbeef)."""
    tree = write_upstream(tmp_path / "src" / f"vllm-{version}")
    archive = tmp_path / f"vllm-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=f"vllm-{version}")
    return archive


def file_index(root: Path, archive: Path) -> str:
    """A PEP 503 index in a directory, as `pip download -d` plus a static page generator make."""
    (root / "files").mkdir(parents=True)
    target = root / "files" / archive.name
    target.write_bytes(archive.read_bytes())
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    page = root / "simple" / "vllm" / "index.html"
    page.parent.mkdir(parents=True)
    link = f'<a href="../../files/{archive.name}#sha256={digest}">{archive.name}</a>'
    page.write_text(f"<html><body>{link}</body></html>")
    return (root / "simple").as_uri()


def lock_text_for(archive: Path, version: str, commit: str) -> str:
    """The project's upstream.lock, saying ``archive`` is release ``version`` at ``commit``."""
    text = (REPO_ROOT / "upstream.lock").read_text()
    text = text.replace('version = "0.33.0"', f'version = "{version}"').replace("vllm-0.33.0.tar.gz", archive.name)
    text = text.replace("vllm-0.33.0-cp38", f"vllm-{version}-cp38")  # the wheels of that release (lock.parse checks)
    text = text.replace('commit = "g4ba787ec9"', f'commit = "{commit}"')
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    return re.sub(r'(\[artifacts\.sdist\]\nfilename = "[^"]+"\nsha256 = ")[0-9a-f]{64}', rf"\g<1>{digest}", text)


def lock_for(archive: Path, version: str, commit: str) -> lock.Lock:
    return lock.parse(lock_text_for(archive, version, commit))


def lock_a_local_release(project: Path, tmp_path: Path) -> str:
    """Make ``project`` lock release 9.9.9, served by a file index; return the index's URL (--index-url)."""
    archive = release_archive(tmp_path / "release", "9.9.9")
    (project / "upstream.lock").write_text(lock_text_for(archive, "9.9.9", "gdeadbeef"))
    return file_index(tmp_path / "index", archive)


def change_core_line(line: int, to: int) -> Callable[[Path], None]:
    """An edit of an upstream tree (``write_upstream``): vllm/core.py's line ``line`` set to ``to``."""
    return lambda tree: replace_line(tree / "vllm" / "core.py", f"line_{line} = {line}\n", f"line_{line} = {to}\n")


def apply_json(project: Path, upstream: Path, output: Path, *extra: str) -> dict:
    """apply-patches of ``upstream`` into ``output``: its JSON report, with the exit code as ``code``."""
    report = project / "report.json"
    where = ["--project", str(project), "--upstream", str(upstream), "-o", str(output)]
    code = cli.main(["apply-patches", *where, "--json", str(report), *extra])
    data = json.loads(report.read_text())
    data["code"] = code
    return data


def stacked_patches(make_patch, upstream: Path, count: int = 3) -> list[Path]:
    """``count`` stacked patches: patch i sets line 5(i+1) to 100+i."""
    return [
        make_patch(upstream, change_core_line(5 * (i + 1), 100 + i), f"core: change line {5 * (i + 1)}")
        for i in range(count)
    ]


def reword(patch: Path, words: str) -> None:
    """Add ``words`` to the patch's message (its diff unchanged)."""
    patch.write_bytes(patch.read_bytes().replace(b"\n---\n", f"\n{words}\n---\n".encode(), 1))
