"""JUnit XML: read pytest's per-test outcomes, and write the runner's own report for CI to display.

pytest writes ``--junitxml`` with ``junit_family=xunit1`` so every testcase carries its ``file``;
:func:`read_cases` turns that into ``{test id: Case}``. :func:`write_report` renders the runner's
verdicts (one testsuite per patch: red, green, upstream-tests; one for the full series) in the
JUnit dialect GitHub, GitLab and Jenkins all display.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay import atomicfile

PASSED, FAILED, ERROR, SKIPPED, TIMEOUT = "passed", "failed", "error", "skipped", "timeout"
# Worst wins when one test id appears twice (a failure in the call and an error in teardown).
SEVERITY = {PASSED: 0, SKIPPED: 1, FAILED: 2, TIMEOUT: 3, ERROR: 4}
COLLECTION = "<collection>"


@dataclass
class Case:
    id: str  # file::Class::name[param]
    file: str  # path as pytest reported it, relative to its rootdir
    outcome: str
    message: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "file": self.file, "outcome": self.outcome, "message": self.message}


def _module_of(file: str) -> str:
    return file.removesuffix(".py").replace("/", ".")


def _case_id(file: str, classname: str, name: str) -> str:
    module = _module_of(file)
    rest = classname[len(module) :].lstrip(".") if classname.startswith(module) else ""
    parts = [file, *(p for p in rest.split(".") if p), name]
    return "::".join(parts)


def _file_from_classname(classname: str, name: str, files: list[str]) -> str:
    """Without a ``file`` attribute: the requested file whose module is the longest prefix."""
    dotted = classname or name
    best = ""
    for file in files:
        module = _module_of(file.split("::", 1)[0])
        if (dotted == module or dotted.startswith(module + ".")) and len(module) > len(best):
            best = file.split("::", 1)[0]
    return best or dotted.replace(".", "/") + ".py"


def read_cases(path: Path, files: list[str] | None = None) -> dict[str, Case]:
    """``{test id: Case}`` from a pytest junit file (empty when the file is missing or torn)."""
    try:
        root = ET.parse(path).getroot()
    except (FileNotFoundError, ET.ParseError):
        return {}
    cases: dict[str, Case] = {}
    for element in root.iter("testcase"):
        classname = element.get("classname", "")
        name = element.get("name", "")
        file = element.get("file") or _file_from_classname(classname, name, files or [])
        outcome, message = PASSED, ""
        for child in element:
            if child.tag == "failure":
                message = child.get("message", "")
                outcome = TIMEOUT if "Timeout" in message and "pytest-timeout" in message else FAILED
            elif child.tag == "error":
                message = child.get("message", "")
                outcome = ERROR
            elif child.tag == "skipped":
                message = child.get("message", "")
                outcome = SKIPPED
        if not classname and any(c.tag == "error" and c.get("message") == "collection failure" for c in element):
            case_id = f"{file}::{COLLECTION}"
        else:
            case_id = _case_id(file, classname, name)
        seconds = float(element.get("time") or 0.0)
        previous = cases.get(case_id)
        if previous is None or SEVERITY[outcome] > SEVERITY[previous.outcome]:
            cases[case_id] = Case(case_id, file, outcome, message[:500], seconds)
    return cases


@dataclass
class ReportCase:
    """One line of the runner's own JUnit report."""

    suite: str
    name: str
    seconds: float
    failure: str | None = None  # message when it failed
    error: str | None = None  # message when it could not run
    skipped: str | None = None
    output: str = ""


def write_report(cases: list[ReportCase], path: Path, name: str = "test-patches") -> None:
    """Write ``cases`` grouped into testsuites (atomically)."""
    root = ET.Element("testsuites", name=name)
    suites: dict[str, list[ReportCase]] = {}
    for case in cases:
        suites.setdefault(case.suite, []).append(case)
    for suite_name, members in suites.items():
        suite = ET.SubElement(
            root,
            "testsuite",
            name=suite_name,
            tests=str(len(members)),
            failures=str(sum(c.failure is not None for c in members)),
            errors=str(sum(c.error is not None for c in members)),
            skipped=str(sum(c.skipped is not None for c in members)),
            time=f"{sum(c.seconds for c in members):.3f}",
        )
        for case in members:
            element = ET.SubElement(suite, "testcase", classname=suite_name, name=case.name, time=f"{case.seconds:.3f}")
            if case.failure is not None:
                ET.SubElement(element, "failure", message=case.failure.splitlines()[0][:200] if case.failure else "")
                element[-1].text = case.failure
            elif case.error is not None:
                ET.SubElement(element, "error", message=case.error.splitlines()[0][:200] if case.error else "")
                element[-1].text = case.error
            elif case.skipped is not None:
                ET.SubElement(element, "skipped", message=case.skipped)
            if case.output:
                ET.SubElement(element, "system-out").text = case.output
    root.set("tests", str(len(cases)))
    root.set("failures", str(sum(c.failure is not None for c in cases)))
    root.set("errors", str(sum(c.error is not None for c in cases)))
    ET.indent(root)
    atomicfile.write_bytes(Path(path), ET.tostring(root, encoding="utf-8", xml_declaration=True))
