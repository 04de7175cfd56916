"""build-image's command module: its flags, and their translation into one build_image call.

The library call (vllm_overlay.image.build.build_image) stages, builds with a container engine and
verifies in the image: the tests stand in for it alone, at the attribute the command looks it up
by (``from vllm_overlay.image import build`` inside run), so no engine is ever started.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import cli
from vllm_overlay.image import build, engine
from vllm_overlay.project import Project

OPTIONS = (
    "--project",
    "--engine",
    "--runtime",
    "--ulimit",
    "--network",
    "--base",
    "--tag",
    "--build-arg",
    "--source-url",
    "--stage-only",
    "--no-pull",
    "--no-cache",
    "--sync-dockerfile",
    "--check-dockerfile",
)


@pytest.fixture
def calls(monkeypatch):
    """build_image replaced by a recorder returning ``calls.result``: the engine work stays out of the test."""
    recorded = SimpleNamespace(args=[], result=build.BuildResult(0, None))

    def fake_build_image(project, options, **kwargs):
        recorded.args.append((project, options, kwargs))
        return recorded.result

    monkeypatch.setattr(build, "build_image", fake_build_image)
    return recorded


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("build-image", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "Exit codes: 0 built and verified" in text
    for name in ("auto", *engine.ENGINES):
        assert name in text


def test_an_unknown_engine_is_refused_by_the_parser(calls, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-image", "--engine", "kaniko"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'kaniko'" in capsys.readouterr().err
    assert calls.args == []


def test_defaults_are_the_library_defaults(project, calls):
    assert cli.main(["build-image", "--project", str(project)]) == 0
    [(proj, options, kwargs)] = calls.args
    assert proj == Project(project.resolve())
    assert options == build.BuildOptions()
    assert options.pull is True and options.tags == () and options.engine == "auto"
    assert kwargs == {}  # never a pre-staged context from the command line


def test_every_flag_reaches_the_options(project, calls, tmp_path):
    argv = ["build-image", "--project", str(project), "--engine", "podman", "--runtime", "runc"]
    argv += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "--network", "none"]
    argv += ["--base", "example/base:1", "-t", "a:1", "--tag", "b:2", "--build-arg", "K=V=W", "--build-arg", "E="]
    argv += ["--source-url", "file:///src", "--stage-only", "--no-pull", "--no-cache"]
    argv += ["--sync-dockerfile", "--check-dockerfile"]
    assert cli.main(argv) == 0
    [(_, options, _)] = calls.args
    assert options == build.BuildOptions(
        engine="podman",
        engine_options=engine.Options(runtime="runc", ulimits=("nofile=1024:1024", "nproc=4096:4096"), network="none"),
        base="example/base:1",
        tags=("a:1", "b:2"),
        build_args={"K": "V=W", "E": ""},  # split at the first '='; an empty value is a value
        source_url="file:///src",
        stage_only=True,
        pull=False,
        no_cache=True,
        sync_dockerfile=True,
        check_dockerfile=True,
    )


def test_the_summary_lines_go_to_stdout_and_the_code_is_returned(project, calls, capsys):
    calls.result = SimpleNamespace(code=0, summary=lambda: ["image: x:1, y:2", "build time (base present): 4.0 s"])
    assert cli.main(["build-image", "--project", str(project)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "image: x:1, y:2\nbuild time (base present): 4.0 s\n"
    assert captured.err == ""


def test_a_staged_only_result_prints_the_staged_directory(project, calls, capsys):
    """The real BuildResult of a --stage-only run: no tags, so its summary is the staged directory."""
    calls.result = build.BuildResult(0, SimpleNamespace(root=Path("/staged/image"), series_sha256=""))
    assert cli.main(["build-image", "--project", str(project), "--stage-only"]) == 0
    assert capsys.readouterr().out == "/staged/image\n"


@pytest.mark.parametrize("code", [1, 2])
def test_the_result_code_is_the_exit_code(project, calls, capsys, code):
    calls.result = SimpleNamespace(code=code, summary=lambda: [])
    assert cli.main(["build-image", "--project", str(project)]) == code
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("item", ["NOVALUE", ""])
def test_a_build_arg_without_equals_is_one_error_line_and_no_build(project, calls, capsys, item):
    assert cli.main(["build-image", "--project", str(project), "--build-arg", "OK=1", "--build-arg", item]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --build-arg {item!r}: expected KEY=VALUE\n"
    assert calls.args == []


def test_a_project_without_a_lock_is_exit_2_before_any_engine(tmp_path, capsys, monkeypatch):
    """The real build_image: it reads the lock first, so nothing is staged and no engine is looked for."""

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was looked for")

    monkeypatch.setattr(engine, "find_engine", no_engine)
    assert cli.main(["build-image", "--project", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path.resolve() / 'upstream.lock'}: not found\n"
    assert not (tmp_path / "build").exists()
