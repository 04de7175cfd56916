"""ci-readme's command module: its flags, and their translation into one readme_ci.run_check call.

run_check builds a Debian stand-in with buildah and runs README's command in it: the tests stand in
for that one call alone, at the attribute the command looks it up by (``from vllm_overlay import
readme_ci`` inside run), so no container engine starts.
"""

from __future__ import annotations

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import cli, readme_ci
from vllm_overlay.project import Project

OPTIONS = ("--project", "--storage-driver", "--suite", "--mirror", "--rebuild-base")


@pytest.fixture
def calls(monkeypatch):
    """run_check replaced by a recorder returning ``code[0]``."""
    recorded: list[tuple[Project, readme_ci.Options]] = []
    code = [0]

    def fake_run_check(proj, options):
        recorded.append((proj, options))
        return code[0]

    monkeypatch.setattr(readme_ci, "run_check", fake_run_check)
    return recorded, code


def test_help_is_the_check_modules_docstring_and_lists_every_option(capsys):
    text = verb_help("ci-readme", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert readme_ci.__doc__.strip().splitlines()[0] in text
    usage = text.split("\n\n")[0]
    assert "--python" not in usage and "--root-build" not in usage  # ci-image's, not this verb's


def test_an_unknown_storage_driver_is_refused_by_the_parser(calls, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ci-readme", "--storage-driver", "zfs"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'zfs'" in capsys.readouterr().err
    assert calls[0] == []


def test_defaults_are_the_library_defaults(project, calls):
    recorded, _ = calls
    assert cli.main(["ci-readme", "--project", str(project)]) == 0
    assert recorded == [(Project(project.resolve()), readme_ci.Options())]


def test_every_flag_reaches_the_options(project, calls):
    recorded, _ = calls
    argv = ["ci-readme", "--project", str(project), "--storage-driver", "vfs", "--suite", "trixie"]
    argv += ["--mirror", "file:///srv/debian", "--rebuild-base"]
    assert cli.main(argv) == 0
    assert recorded[0][1] == readme_ci.Options(
        storage_driver="vfs", suite="trixie", mirror="file:///srv/debian", rebuild_base=True
    )


@pytest.mark.parametrize("code", [0, 1, 2])
def test_the_checks_code_is_the_exit_code(project, calls, code):
    calls[1][0] = code
    assert cli.main(["ci-readme", "--project", str(project)]) == code


def test_a_project_without_readme_commands_is_exit_2_before_any_engine(tmp_path, capsys, monkeypatch):
    """The real run_check: README's two commands are read first, before root or buildah are asked for."""
    from vllm_overlay.image import engine

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was looked for")

    monkeypatch.setattr(engine, "find_engine", no_engine)
    (tmp_path / "README.md").write_text("# A project\n\nNo commands here.\n")
    assert cli.main(["ci-readme", "--project", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {tmp_path.resolve() / 'README.md'}: no '{readme_ci.SECTION}' section\n"
    assert captured.out == ""


TWO_COMMANDS = "# A project\n\n## The two commands\n\n    scripts/setup && scripts/apply-patches\n    scripts/check\n\n"


@pytest.mark.parametrize(
    ("workflows", "said"),
    [
        ("", "no '### Forward a patch' section"),
        ("### Forward a patch\n\n    scripts/forward <series>/<patch>\n\n", "has a placeholder, <series>"),
        ("### Forward a patch\n\n    scripts/forward s/p\n\n", "no '### Drop a patch upstream merged' section"),
        (
            "### Forward a patch\n\n    ls\n\n### Drop a patch upstream merged\n\n    ls\n",
            "runs no `scripts/forward SERIES/PATCH`",
        ),
    ],
    ids=["no-forward", "placeholder", "no-drop", "no-forward-command"],
)
def test_a_readme_whose_workflow_blocks_cannot_run_is_exit_2_before_any_engine(
    tmp_path, capsys, monkeypatch, workflows, said
):
    """The workflow blocks are read with the two commands, before root or buildah are asked for."""
    from vllm_overlay.image import engine

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was looked for")

    monkeypatch.setattr(engine, "find_engine", no_engine)
    (tmp_path / "README.md").write_text(TWO_COMMANDS + workflows)
    assert cli.main(["ci-readme", "--project", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err
