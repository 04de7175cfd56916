"""carry-cpu's command module: its flags, which recarry call each makes, and how their ends are said.

recarry.start and recarry.resume check out two upstream releases and run bump's git am: where the
test is about what the command does with their result they are stood in for, at the attributes the
command looks them up by (``from vllm_overlay import recarry`` inside run). Their refusals that
come before any download (no carry in progress, no cpu/upstream.lock) are run for real.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import bump, cli
from vllm_overlay.cpu import carry, recarry


@pytest.fixture
def carried(monkeypatch):
    """start/resume/abort replaced by recorders; start and resume return ``carried.outcome``."""
    recorded = SimpleNamespace(calls=[], outcome=recarry.Outcome(), error=None)

    def call(name):
        def fake(root, store=None):
            recorded.calls.append((name, root, None if store is None else store.root))
            if recorded.error is not None:
                raise recorded.error
            return ["bump repository removed", "cpu/ unchanged"] if name == "abort" else recorded.outcome

        return fake

    for name in ("start", "resume", "abort"):
        monkeypatch.setattr(recarry, name, call(name))
    return recorded


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("carry-cpu", capsys)
    assert "--continue" in text and "--abort" in text and "--project" in text
    assert "Exit codes: 0 carried; 1 stopped for a person or refused; 2 usage or input error." in text


def test_continue_and_abort_together_are_refused_by_the_parser(carried, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["carry-cpu", "--continue", "--abort"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert carried.calls == []


@pytest.mark.parametrize("argv, name", [([], "start"), (["--continue"], "resume")])
def test_each_mode_makes_its_one_call_with_the_project_and_the_cache(project, store_env, carried, argv, name):
    assert cli.main(["carry-cpu", "--project", str(project), *argv]) == 0
    assert carried.calls == [(name, project.resolve(), store_env)]


def test_abort_says_each_line_on_stderr(project, store_env, carried, capsys):
    assert cli.main(["carry-cpu", "--project", str(project), "--abort"]) == 0
    assert carried.calls == [("abort", project.resolve(), None)]
    captured = capsys.readouterr()
    assert captured.err == "bump repository removed\ncpu/ unchanged\n" and captured.out == ""


def test_a_finished_carry_lists_what_was_reused_carried_anew_and_written(project, store_env, carried, capsys):
    carried.outcome = recarry.Outcome(
        reused=["a.patch"], written=["patches/a.patch", "upstream.lock"], anew=["b.patch"]
    )
    assert cli.main(["carry-cpu", "--project", str(project)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "reused from the earlier carry: a.patch",
        "carried anew (say in its message what differs on the runtime's release): cpu/patches/b.patch",
        "2 file(s) of cpu/ changed: patches/a.patch, upstream.lock",
    ]


def test_a_carry_that_changed_nothing_says_none(project, store_env, carried, capsys):
    assert cli.main(["carry-cpu", "--project", str(project)]) == 0
    assert capsys.readouterr().out == "0 file(s) of cpu/ changed: none\n"


def test_a_stop_for_a_person_names_carry_cpus_own_commands(project, store_env, carried, capsys):
    carried.error = recarry.NeedsPerson(
        "conflict in a.patch: resolve, then scripts/bump --continue (or scripts/bump --abort)"
    )
    assert cli.main(["carry-cpu", "--project", str(project), "--continue"]) == 1
    assert capsys.readouterr().err == (
        "error: conflict in a.patch: resolve, then scripts/carry-cpu --continue (or scripts/carry-cpu --abort)\n"
    )


@pytest.mark.parametrize(
    "error", [recarry.RecarryError("patches/ changed"), bump.BumpError("no bump"), carry.CarryError("runtime-only")]
)
def test_a_refusal_of_the_carry_is_exit_1_in_one_line(project, store_env, carried, capsys, error):
    carried.error = error
    assert cli.main(["carry-cpu", "--project", str(project)]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"error: {error}\n" and captured.out == ""


def test_continue_without_a_carry_in_progress_is_refused(project, store_env, capsys):
    """The real resume: it looks for the carry's state before anything else."""
    assert cli.main(["carry-cpu", "--project", str(project), "--continue"]) == 1
    repo = project.resolve() / "build" / "carry-cpu" / "bump"
    assert capsys.readouterr().err == f"error: {repo}: no carry in progress (start one with scripts/carry-cpu)\n"


def test_abort_without_a_carry_in_progress_is_refused(project, store_env, capsys):
    assert cli.main(["carry-cpu", "--project", str(project), "--abort"]) == 1
    repo = project.resolve() / "build" / "carry-cpu" / "bump"
    assert capsys.readouterr().err == f"error: {repo}: no bump in progress\n"


def test_start_without_a_cpu_lock_is_exit_2_in_one_line(project, store_env, capsys):
    """The real start: cpu/upstream.lock is read before any tree is made or downloaded."""
    assert cli.main(["carry-cpu", "--project", str(project)]) == 2
    assert capsys.readouterr().err == f"error: {project.resolve() / 'cpu' / 'upstream.lock'}: not found\n"
    assert not (project / "build").exists()
