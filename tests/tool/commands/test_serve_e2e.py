"""serve-e2e's command module: its flags, the three paths run takes, and its exit codes.

Every library call behind the verb starts real vLLM servers, builds the CPU runtime (~3 GB) or
applies both series: the tests stand in for suite.run, cpu_runtime.ensure and the module's own
range_diff alone, at the attributes the command looks them up by (``from vllm_overlay.e2e import
suite`` and ``from vllm_overlay import cpu_runtime`` inside run; range_diff a module global). The
stale-carry check before serving is the real one: it only reads cpu/carried-from and patches/.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.tool.helpers.cli import verb_help
from vllm_overlay import cli
from vllm_overlay.commands import serve_e2e
from vllm_overlay.cpu import carry
from vllm_overlay.cpu import runtime as cpu_runtime
from vllm_overlay.e2e import suite

OPTIONS = (
    "--project",
    "--clients",
    "--ready-timeout",
    "--no-tamper",
    "--out",
    "--tp",
    "--no-base",
    "--streaming-input",
    "--hang",
    "--faults",
    "--deep",
    "--range-diff",
    "--image",
    "--runtime-only",
    "--verdicts",
    "--allow-stale-carry",
)


def carried(project: Path, digest: str | None = None) -> Path:
    """cpu/carried-from naming ``digest`` (default: today's patches/, so the carry is current)."""
    (project / "cpu").mkdir(exist_ok=True)
    (project / "cpu" / "carried-from").write_text((digest or carry.series_digest(project / "patches")) + "\n")
    return project


@pytest.fixture
def served(monkeypatch):
    """suite.run replaced by a recorder returning ``served.outcome``: no server is started."""
    recorded = SimpleNamespace(calls=[], outcome=suite.Outcome(cached={"made": "then", "key": "k1", "table": "T\n"}))

    def fake_run(root, options):
        recorded.calls.append((root, options))
        return recorded.outcome

    monkeypatch.setattr(suite, "run", fake_run)
    return recorded


def test_help_lists_every_option_and_the_exit_codes(capsys):
    text = verb_help("serve-e2e", capsys)
    assert [option for option in OPTIONS if option not in text] == []
    assert "Exit codes: 0 every scenario passed on both runtimes" in text


@pytest.mark.parametrize("value", ["kubernetes", "podman,podman", ",", "docker,lxc"])
def test_an_image_engine_list_other_than_podman_and_docker_is_refused(served, capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve-e2e", "--image", value])
    assert exit_info.value.code == 2
    assert f"{value!r}: expected podman, docker or podman,docker" in capsys.readouterr().err
    assert served.calls == []


@pytest.mark.parametrize("value, kept", [("podman", "podman"), (" docker , podman ", "docker,podman")])
def test_an_image_engine_list_is_kept_in_its_order(project, served, value, kept):
    assert cli.main(["serve-e2e", "--project", str(carried(project)), "--image", value]) == 0
    assert served.calls[0][1].image == kept


@pytest.mark.parametrize("flag", ["--clients", "--ready-timeout"])
def test_a_count_that_is_not_a_number_is_refused_by_the_parser(served, capsys, flag):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve-e2e", flag, "lots"])
    assert exit_info.value.code == 2
    assert "invalid" in capsys.readouterr().err and served.calls == []


def test_defaults_are_the_library_defaults(project, served):
    assert cli.main(["serve-e2e", "--project", str(carried(project))]) == 0
    assert served.calls == [(project.resolve(), suite.Options())]


def test_every_flag_reaches_the_options(project, served, tmp_path):
    argv = ["serve-e2e", "--project", str(carried(project)), "--clients", "9", "--ready-timeout", "12.5"]
    argv += ["--no-tamper", "--out", str(tmp_path / "e2e"), "--tp", "--no-base", "--streaming-input", "--hang"]
    argv += ["--image", "podman,docker", "--verdicts", "--faults", "pp2, tp1", "--deep"]
    assert cli.main(argv) == 0
    [(_, options)] = served.calls
    assert options == suite.Options(
        clients=9,
        ready_timeout=12.5,
        tamper=False,
        out=tmp_path / "e2e",
        tp=True,
        hang=True,
        streaming_input=True,
        base=False,
        verdicts=True,
        image="podman,docker",
        faults="pp2,tp1",
        deep=True,
    )


@pytest.mark.parametrize("value", ["tp4", "tp1,tp1", ","])
def test_a_fault_layout_list_other_than_tp1_tp2_pp2_is_refused(served, capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve-e2e", "--faults", value])
    assert exit_info.value.code == 2
    assert f"{value!r}: expected a comma-separated list of tp1, tp2, pp2" in capsys.readouterr().err
    assert served.calls == []


def test_the_rendered_outcome_is_printed_and_a_failed_scenario_is_exit_1(project, served, capsys):
    assert cli.main(["serve-e2e", "--project", str(carried(project))]) == 0
    assert capsys.readouterr().out == "(kept verdict of then, key k1)\nT\n\n"
    served.outcome = suite.Outcome(extra=[SimpleNamespace(ok=False, name="hung step", detail="no reply")])
    assert cli.main(["serve-e2e", "--project", str(project)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("series sha256 ") and "| hung step | FAIL: no reply |" in out


def test_a_stale_carry_is_exit_2_in_one_line_and_serves_nothing(project, served, capsys):
    carried(project, "0" * 64)
    assert cli.main(["serve-e2e", "--project", str(project)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: cpu/patches was carried from another patches/ (series digest 000000000000;")
    assert len(captured.err.splitlines()) == 1 and captured.out == ""
    assert served.calls == []


def test_allow_stale_carry_serves_with_a_warning(project, served, capsys):
    carried(project, "0" * 64)
    assert cli.main(["serve-e2e", "--project", str(project), "--allow-stale-carry"]) == 0
    assert capsys.readouterr().err.startswith("warning: cpu/patches was carried from another patches/")
    assert len(served.calls) == 1


def test_a_carry_that_names_no_source_is_exit_2(project, served, capsys):
    assert cli.main(["serve-e2e", "--project", str(project), "--allow-stale-carry"]) == 2
    assert capsys.readouterr().err == (
        f"error: {project.resolve() / 'cpu' / 'carried-from'}: missing: the carry does not say which patches/ "
        "it was carried from\n"
    )
    assert served.calls == []


def test_runtime_only_prints_the_runtimes_interpreter_and_serves_nothing(project, served, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(cpu_runtime, "load", lambda path: asked.append(path) or "the-runtime-lock")
    monkeypatch.setattr(
        cpu_runtime, "ensure", lambda the_lock, store: SimpleNamespace(python=Path(f"/cache/{the_lock}/bin/python"))
    )
    assert cli.main(["serve-e2e", "--project", str(project), "--runtime-only"]) == 0
    assert capsys.readouterr().out == "/cache/the-runtime-lock/bin/python\n"
    assert asked == [project.resolve() / "cpu" / "runtime.lock"]
    assert served.calls == []  # no stale-carry check either: cpu/carried-from is absent here


def test_runtime_only_without_a_runtime_lock_is_exit_2(project, served, capsys, store_env):
    """The real cpu_runtime.load: the lock is read before the cache is touched."""
    assert cli.main(["serve-e2e", "--project", str(project), "--runtime-only"]) == 2
    assert capsys.readouterr().err == f"error: {project.resolve() / 'cpu' / 'runtime.lock'}: not found\n"
    assert not store_env.exists()


def test_range_diff_prints_the_diff_and_serves_nothing(project, served, monkeypatch, capsys):
    monkeypatch.setattr(serve_e2e, "range_diff", lambda root: f"1:  abc = 1:  def {root.name}")
    assert cli.main(["serve-e2e", "--project", str(project), "--range-diff"]) == 0
    assert capsys.readouterr().out == "1:  abc = 1:  def project\n"
    assert served.calls == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_run_through_its_cleanup_and_is_exit_130(project, monkeypatch, capsys, sig):
    """SIGTERM as Ctrl-C: the suite's finally blocks (where its servers stop) run, then one line, 130."""
    cleaned: list[str] = []

    def run_until_signalled(root, options):  # stands in for the servers: a block a signal must cut
        try:
            os.kill(os.getpid(), sig)
            time.sleep(10)
            raise AssertionError("the signal did not interrupt the run")
        finally:
            cleaned.append("servers stopped")

    monkeypatch.setattr(suite, "run", run_until_signalled)
    # SIGINT as a terminal delivers it (a run started in the background inherits it ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        assert cli.main(["serve-e2e", "--project", str(carried(project))]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 5 and cleaned == ["servers stopped"]
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: interrupted: every server this run started was stopped; no verdict kept"
    ]
    assert signal.getsignal(signal.SIGTERM) is not serve_e2e.interrupts._raise_interrupt  # handler given back


@pytest.fixture
def nothing_fetched(monkeypatch):
    """The runtime fetch and the carry check fail the test if reached: a refusal comes before them."""

    def reached(*_args, **_kwargs):
        raise AssertionError("the run went on past its arguments")

    monkeypatch.setattr(cpu_runtime, "ensure", reached)
    monkeypatch.setattr(carry, "stale_problem", reached)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--clients", "0", "argument --clients: 0: expected a whole number of at least 1"),
        ("--clients", "-3", "argument --clients: -3: expected a whole number of at least 1"),
        ("--ready-timeout", "-1", "argument --ready-timeout: -1: expected a finite number of seconds above 0"),
        ("--ready-timeout", "0", "argument --ready-timeout: 0: expected a finite number of seconds above 0"),
        ("--ready-timeout", "nan", "argument --ready-timeout: nan: expected a finite number of seconds above 0"),
        ("--ready-timeout", "inf", "argument --ready-timeout: inf: expected a finite number of seconds above 0"),
    ],
)
def test_a_count_or_timeout_that_cannot_work_is_refused_up_front(
    project, served, nothing_fetched, capsys, flag, value, says
):
    """Before: --clients 0 and --ready-timeout -1 or nan went on to fetch the runtime."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve-e2e", "--project", str(carried(project)), f"{flag}={value}"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"vllm-overlay serve-e2e: error: {says}"
    assert served.calls == []


@pytest.mark.parametrize("under", [False, True])
def test_an_out_that_is_a_file_is_refused_up_front(project, served, nothing_fetched, capsys, tmp_path, under):
    """Before: --out naming a file (or a path under one) ended in FileExistsError/NotADirectoryError."""
    a_file = tmp_path / "results.txt"
    a_file.write_text("mine\n")
    out = a_file / "e2e" if under else a_file
    code = cli.main(["serve-e2e", "--project", str(carried(project)), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    which = f"lies under {a_file}, which is" if under else "is"
    assert err == f"error: --out {out} {which} not a directory\n"
    assert a_file.read_text() == "mine\n" and served.calls == []
