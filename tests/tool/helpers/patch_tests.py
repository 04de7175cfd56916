"""test-patches on a made-up series: a fake test environment, patches with Tests, the CLI run."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.tool.helpers.repos import replace_line
from vllm_overlay import cli
from vllm_overlay.env import record
from vllm_overlay.junit import Case


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
