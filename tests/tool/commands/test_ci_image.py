"""ci-image's command module: its flags, and their translation into one ci_checks.run_checks call.

run_checks builds with buildah (as root) and debootstraps stand-in bases: the tests stand in for
that one call alone, at the attribute the command looks it up by (``from vllm_overlay.image import
ci_checks`` inside run), so no container engine starts.
"""

from __future__ import annotations

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import cli
from vllm_overlay.image import ci_checks
from vllm_overlay.project import Project

OPTIONS = (
    "--project",
    "--python",
    "--storage-driver",
    "--suite",
    "--tool-suite",
    "--mirror",
    "--rebuild-base",
    "--engines",
    "--root-build",
)


@pytest.fixture
def calls(monkeypatch):
    """run_checks replaced by a recorder returning ``code[0]``."""
    recorded: list[tuple[Project, ci_checks.Options]] = []
    code = [0]

    def fake_run_checks(proj, options):
        recorded.append((proj, options))
        return code[0]

    monkeypatch.setattr(ci_checks, "run_checks", fake_run_checks)
    monkeypatch.delenv("VLLM_OVERLAY_CI_ENGINES", raising=False)
    return recorded, code


def test_help_is_the_check_modules_docstring_and_lists_every_option(capsys):
    text = verb_help("ci-image", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    first_line = ci_checks.__doc__.strip().splitlines()[0]
    assert first_line in text
    assert "{overlay,vfs}" in text


def test_an_unknown_storage_driver_is_refused_by_the_parser(calls, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ci-image", "--storage-driver", "btrfs"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'btrfs'" in capsys.readouterr().err
    assert calls[0] == []


def test_defaults_are_the_library_defaults(project, calls):
    recorded, _ = calls
    assert cli.main(["ci-image", "--project", str(project)]) == 0
    assert recorded == [(Project(project.resolve()), ci_checks.Options())]


def test_every_flag_reaches_the_options(project, calls):
    recorded, _ = calls
    argv = ["ci-image", "--project", str(project), "--python", "/opt/py/bin/python3", "--storage-driver", "vfs"]
    argv += ["--suite", "trixie", "--tool-suite", "sid", "--mirror", "file:///srv/debian", "--rebuild-base"]
    argv += ["--engines", "docker,podman", "--root-build"]
    assert cli.main(argv) == 0
    [(_, options)] = recorded
    assert options == ci_checks.Options(
        python="/opt/py/bin/python3",
        storage_driver="vfs",
        suite="trixie",
        tool_suite="sid",
        mirror="file:///srv/debian",
        rebuild_base=True,
        root_build=True,
        engines="docker,podman",
    )


def test_the_engines_default_is_read_from_the_environment(project, calls, monkeypatch):
    recorded, _ = calls
    monkeypatch.setenv("VLLM_OVERLAY_CI_ENGINES", "none")
    assert cli.main(["ci-image", "--project", str(project)]) == 0
    assert recorded[0][1].engines == "none"
    assert cli.main(["ci-image", "--project", str(project), "--engines", "podman"]) == 0
    assert recorded[1][1].engines == "podman"  # the flag wins over the variable


@pytest.mark.parametrize("code", [0, 1, 2])
def test_the_checks_code_is_the_exit_code(project, calls, code):
    calls[1][0] = code
    assert cli.main(["ci-image", "--project", str(project)]) == code


def test_a_project_without_a_lock_is_exit_2_before_any_engine(tmp_path, capsys, monkeypatch):
    """The real run_checks: it reads the lock before it asks for root or looks for buildah."""
    from vllm_overlay.image import engine

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was looked for")

    monkeypatch.setattr(engine, "find_engine", no_engine)
    assert cli.main(["ci-image", "--project", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {tmp_path.resolve() / 'upstream.lock'}: not found\n"
    assert captured.out == ""
