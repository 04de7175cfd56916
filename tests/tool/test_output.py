"""output: messages to stderr with their prefix, results to stdout, URL secrets masked everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_overlay import output


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("https://user:s3cret@example.invalid/simple/", "https://user:****@example.invalid/simple/"),
        ("https://tok3n@example.invalid/simple/", "https://****@example.invalid/simple/"),
        ("git+ssh://git:pw@example.invalid/r.git", "git+ssh://git:****@example.invalid/r.git"),
        ("https://:only-secret@example.invalid/", "https://:****@example.invalid/"),
        ("https://example.invalid/simple/", "https://example.invalid/simple/"),
        ("mail me at me@example.invalid", "mail me at me@example.invalid"),  # no scheme: not a URL's userinfo
        ("a https://u:p@h1/ and b http://t@h2/x", "a https://u:****@h1/ and b http://****@h2/x"),
    ],
)
def test_redact_credentials(text: str, masked: str) -> None:
    assert output.redact_credentials(text) == masked


def test_info_warn_error_go_to_stderr_with_their_prefix(capsys) -> None:
    output.info("plain")
    output.warn("careful")
    output.error("broken")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "plain\nwarning: careful\nerror: broken\n"


def test_result_goes_to_stdout(capsys) -> None:
    output.result("| a | b |")
    assert capsys.readouterr() == ("| a | b |\n", "")


def test_every_stream_masks_secrets(capsys) -> None:
    url = "https://me:hunter2@example.invalid/simple"
    for say in (output.info, output.warn, output.error, output.result):
        say(f"index {url}")
    captured = capsys.readouterr()
    assert "hunter2" not in captured.out + captured.err
    assert captured.out == "index https://me:****@example.invalid/simple\n"
    assert captured.err.count("https://me:****@example.invalid/simple") == 3


def test_waiting_for_names_the_pid_or_another_process(capsys) -> None:
    on_wait = output.waiting_for(Path("/x/build/patched"))
    on_wait(4242)
    on_wait(None)
    assert capsys.readouterr().err.splitlines() == [
        "waiting for pid 4242, which is writing /x/build/patched (--no-wait to give up instead)",
        "waiting for another process, which is writing /x/build/patched (--no-wait to give up instead)",
    ]
