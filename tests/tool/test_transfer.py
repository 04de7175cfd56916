"""Transfers end at their deadline however slowly bytes keep coming (real HTTP trickles: test_upstream_trees)."""

from __future__ import annotations

import io

import pytest

from vllm_overlay import transfer


class _Slow(io.RawIOBase):
    """A response that gives one byte per read, for ever, and moves the clock 0.5 s each time."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def read1(self, size: int = -1) -> bytes:
        self.clock[0] += 0.5
        return b"x"


def test_blocks_end_at_the_deadline_saying_how_far_they_got(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(transfer.time, "monotonic", lambda: clock[0])
    got = []
    with pytest.raises(transfer.TooSlow, match=r"the download of f did not finish within 2 s \(5 bytes received\)"):
        for block in transfer.blocks(_Slow(clock), 2.0, "the download of f"):
            got.append(block)
    assert len(got) == 5


def test_blocks_of_a_whole_response_are_its_bytes():
    assert b"".join(transfer.blocks(io.BufferedReader(io.BytesIO(b"abc" * 1000)), 5.0, "x", size=7)) == b"abc" * 1000


@pytest.mark.parametrize(
    ("value", "seconds"), [("", 60.0), ("90", 90.0), ("0", 60.0), ("-1", 60.0), ("inf", 60.0), ("x", 60.0)]
)
def test_the_deadline_variable_gives_more_seconds_or_is_ignored(monkeypatch, value, seconds):
    monkeypatch.setenv(transfer.DEADLINE_ENV, value)
    assert transfer.deadline_seconds(60.0) == seconds
