"""errors: an input error is one line on stderr and exit 2; a failure of the work itself exits 1; Ctrl-C 130.

The module promises that every error a user can fix derives from InputError and that cli.main is
its one error path, replacing the commands' own ``except ...: return 2`` blocks. The last test
holds the code to that: a command may not turn one of the project's own exception classes into
exit 2 unless that class is an InputError.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path

import pytest

import vllm_overlay
from tests.tool.helpers.apply_runs import run_apply
from tests.tool.helpers.repos import PatchMaker, change_line_20, replace_line, write_upstream
from vllm_overlay import cli, errors


def test_input_error_exits_2_and_is_an_exception() -> None:
    assert errors.InputError.exit_code == 2
    assert issubclass(errors.InputError, Exception) and not issubclass(errors.InputError, KeyboardInterrupt)
    assert str(errors.InputError("the lock is torn")) == "the lock is torn"


def test_a_work_failure_exits_1_and_an_interrupt_130() -> None:
    assert errors.WorkFailure.exit_code == 1 and not issubclass(errors.WorkFailure, errors.InputError)
    assert errors.Interrupted.exit_code == 130 and issubclass(errors.Interrupted, KeyboardInterrupt)


@pytest.mark.parametrize(
    ("raised", "code", "said"),
    [
        (errors.InputError("the lock is torn"), 2, "error: the lock is torn\n"),
        (errors.WorkFailure("2 problem(s) in patches/"), 1, "error: 2 problem(s) in patches/\n"),
        (
            errors.Interrupted("interrupted; build/patched unchanged"),
            130,
            "error: interrupted; build/patched unchanged\n",
        ),
        (KeyboardInterrupt(), 130, "error: interrupted\n"),  # a verb that has nothing to say about it
        (KeyboardInterrupt("SIGTERM"), 130, "error: interrupted\n"),  # interrupts.terminate_as_interrupt's
    ],
)
def test_cli_main_is_the_one_error_path_of_every_verb(
    tmp_path: Path, capsys, monkeypatch, raised: BaseException, code: int, said: str
) -> None:
    """Whatever verb raises it: one line on stderr, nothing on stdout, the class's exit code."""
    from vllm_overlay.commands import cache

    def fail(args: object) -> int:
        raise raised

    monkeypatch.setattr(cache, "run", fail)
    assert cli.main(["cache", "--project", str(tmp_path)]) == code
    assert capsys.readouterr() == ("", said)


def test_errors_report_says_it_as_cli_main_does(capsys) -> None:
    """For a caller that runs a verb's work inside its own (bump's test-patches run) and goes on."""
    assert errors.report(errors.WorkFailure("patches/ is stale")) == 1
    assert capsys.readouterr().err == "error: patches/ is stale\n"


def _exit_codes_returned_by_hand(path: Path) -> list[str]:
    """``except ...: return N`` in ``path``: an exit code (1, 2, 130, a caught error's ``exit_code``, or a
    result made of one) returned from an exception handler instead of raised through cli.main."""
    found = []
    for handler in (
        n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ExceptHandler)
    ):
        for node in (inner for statement in handler.body for inner in ast.walk(statement)):
            if not isinstance(node, ast.Return) or node.value is None:
                continue
            value = node.value
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]  # PatchTestResult(2)
            code = isinstance(value, ast.Constant) and type(value.value) is int and value.value in (1, 2, 130)
            if code or (isinstance(value, ast.Attribute) and value.attr == "exit_code"):
                found.append(
                    f"{path.relative_to(Path(vllm_overlay.__file__).parent)}:{node.lineno}: {ast.unparse(node)}"
                )
    return found


def test_no_module_turns_an_error_into_an_exit_code_by_hand() -> None:
    """Errors are raised to cli.main (or said by errors.report), never caught and answered with a number."""
    package = Path(vllm_overlay.__file__).parent
    one_path = {package / "cli.py", package / "errors.py"}
    offenders = [
        hit
        for path in sorted(package.rglob("*.py"))
        if path not in one_path
        for hit in _exit_codes_returned_by_hand(path)
    ]
    assert offenders == []


def test_cli_reports_an_input_error_in_one_line_and_exits_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series").write_text("")
    assert cli.main(["apply-patches", "--project", str(tmp_path)]) == 2  # no upstream.lock
    captured = capsys.readouterr()
    assert captured.err == f"error: {tmp_path / 'upstream.lock'}: not found\n"
    assert captured.out == ""


def test_a_report_path_error_is_found_before_the_work_and_exits_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "patches").mkdir()
    code = cli.main(["apply-patches", "--project", str(tmp_path), "--json", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: --json {tmp_path}: is a directory; name a file"]


def test_a_patch_that_does_not_apply_is_not_an_input_error(
    tmp_path: Path, project: Path, upstream_dir: Path, make_patch: PatchMaker
) -> None:
    make_patch(upstream_dir, change_line_20, "Change line 20")
    moved = write_upstream(tmp_path / "upstream-b")
    replace_line(moved / "vllm" / "core.py", "line_20 = 20\n", "line_20 = -20\n")
    code, report = run_apply(project, moved, base=upstream_dir)
    assert code == 1
    assert [p["status"] for p in report["patches"]] == ["conflict"]


@functools.cache
def _project_error_classes() -> dict[str, type]:
    """Every exception class of vllm_overlay whose name ends in Error, by its qualified name."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(vllm_overlay.__path__, "vllm_overlay."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and name.endswith("Error")
                and value.__module__.startswith("vllm_overlay")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def _returns_2(handler: ast.ExceptHandler) -> bool:
    return any(
        isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value == 2
        for statement in handler.body
        for node in ast.walk(statement)
    )


def _caught_names(handler: ast.ExceptHandler) -> list[str]:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return [ast.unparse(kind).rsplit(".", 1)[-1] for kind in kinds if kind is not None]


def test_the_error_classes_are_found() -> None:
    classes = _project_error_classes()
    assert classes["vllm_overlay.errors.InputError"] is errors.InputError
    assert issubclass(classes["vllm_overlay.upstream.lock.LockError"], errors.InputError)
    assert issubclass(classes["vllm_overlay.report.ReportPathError"], errors.InputError)


def test_every_project_error_a_command_turns_into_exit_2_is_an_input_error() -> None:
    by_name: dict[str, list[type]] = {}
    for cls in _project_error_classes().values():
        by_name.setdefault(cls.__name__, []).append(cls)
    offenders = []
    for path in sorted(Path(vllm_overlay.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for handler in (n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler)):
            if not _returns_2(handler):
                continue
            for name in _caught_names(handler):
                for cls in by_name.get(name, []):
                    if not issubclass(cls, errors.InputError):
                        offenders.append(f"{path.name}:{handler.lineno}: {cls.__module__}.{cls.__name__}")
    assert offenders == [], "exit 2 outside the one error path for errors that are not InputError"


def test_every_input_error_class_keeps_exit_2(tmp_path: Path, capsys) -> None:
    # main returns the exception's exit_code: no InputError subclass overrides it with another code.
    classes = [cls for cls in _project_error_classes().values() if issubclass(cls, errors.InputError)]
    assert len(classes) > 5
    assert {cls.exit_code for cls in classes} == {2}
