"""upstream.lock: the real lock parses, bad values are refused, render round-trips."""

from __future__ import annotations

import pytest

from tests.tool.helpers import REPO_ROOT
from vllm_overlay import lock


def test_project_lock_pins_the_release():
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    assert the_lock.version == "0.33.0"
    assert the_lock.commit == "g4ba787ec9"
    assert the_lock.sdist.sha256 == "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
    assert set(the_lock.wheels) == {"x86_64", "aarch64"}
    assert the_lock.base_image == "vllm/vllm-openai:v0.33.0"
    assert the_lock.base_digest == ""  # never invented
    assert the_lock.pins == {"torch": "2.14.0", "flashinfer-python": "0.7.2.post1"}


def test_render_round_trips_byte_for_byte():
    text = (REPO_ROOT / "upstream.lock").read_text()
    assert lock.render(lock.parse(text)) == text


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('sha256 = "f4c3', 'sha256 = "zz', "not 64 lowercase hex"),
        ('digest = ""', 'digest = "sha256:1234"', "digest must be empty"),
        ('version = "0.33.0"', 'version = "0.34.0"', "does not match version"),
        ("[upstream]", "[upstreamx]", "missing 'upstream'"),
    ],
)
def test_invalid_locks_are_refused(old, new, message):
    text = (REPO_ROOT / "upstream.lock").read_text().replace(old, new, 1)
    with pytest.raises(lock.LockError, match=message):
        lock.parse(text)


def test_write_is_atomic_and_readable(tmp_path):
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    target = tmp_path / "upstream.lock"
    lock.write(the_lock, target)
    assert lock.load(target).sdist == the_lock.sdist
    assert [p.name for p in tmp_path.iterdir()] == ["upstream.lock"]
