"""upstream.lock: the real lock parses, bad values are refused, render round-trips."""

from __future__ import annotations

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay.upstream import lock


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


# The lock's project and version name files in the cache and a git tag.
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('project = "vllm"', 'project = "../../../outside/vllm"', "not a supported distribution"),
        ('project = "vllm"', 'project = "vLLM"', "not a supported distribution"),
        ('version = "0.33.0"', 'version = "0.33.0/../../x"', "not a canonical version"),
        ('version = "0.33.0"', 'version = "0.33.0-post0"', r"write '0.33.0.post0'"),
        ('version = "0.33.0"', 'version = "v0.33.0"', r"write '0.33.0'"),
        (
            'filename = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"',
            'filename = "../vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"',
            "is not a wheel's file name",
        ),
        (
            'filename = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"',
            'filename = "torch-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"',
            "not a wheel of vllm 0.33.0",
        ),
    ],
)
def test_a_lock_cannot_name_a_path_outside_the_cache(old, new, message):
    text = (REPO_ROOT / "upstream.lock").read_text()
    assert old in text
    with pytest.raises(lock.LockError, match=message):
        lock.parse(text.replace(old, new, 1))


@pytest.mark.parametrize("name", ["../vllm-0.33.0.tar.gz", "a/b.tar.gz", "..", ".", "", "x\0y"])
def test_store_download_paths_stay_in_the_cache(tmp_path, name):
    from vllm_overlay.store import OutsideCacheError, Store

    store = Store(tmp_path / "cache")
    with pytest.raises(OutsideCacheError, match="not a plain file name inside the cache"):
        store.download(name)
    assert not (tmp_path / "cache").exists()  # refused before anything is written
    assert store.download("vllm-0.33.0.tar.gz") == tmp_path / "cache" / "downloads" / "vllm-0.33.0.tar.gz"


def test_a_download_symlinked_out_of_the_cache_is_refused(tmp_path):
    from vllm_overlay.store import OutsideCacheError, Store

    store = Store(tmp_path / "cache")
    store.downloads.mkdir(parents=True)
    (tmp_path / "elsewhere.tar.gz").write_bytes(b"x")
    (store.downloads / "vllm-0.33.0.tar.gz").symlink_to(tmp_path / "elsewhere.tar.gz")
    with pytest.raises(OutsideCacheError):
        store.download("vllm-0.33.0.tar.gz")


# Every key's type is checked and named; nothing ends in a traceback.
def _without_tables(text: str, prefix: str) -> str:
    """The lock with every [prefix...] table (header to blank line) removed."""
    kept, skipping = [], False
    for line in text.splitlines():
        if line.startswith("["):
            skipping = line.startswith(f"[{prefix}")
        elif not line.strip():
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + "\n"


@pytest.mark.parametrize("table", ["upstream", "artifacts", "base-image", "pins"])
def test_a_table_given_as_a_string_is_named(table):
    text = f'{table} = "x"\n' + _without_tables((REPO_ROOT / "upstream.lock").read_text(), table)
    with pytest.raises(lock.LockError, match=rf"\[{table}\] must be a table, not a string"):
        lock.parse(text)


def test_an_artifact_given_as_a_string_is_named():
    text = _without_tables((REPO_ROOT / "upstream.lock").read_text(), "artifacts.wheel-x86_64")
    text = text.replace("[artifacts.sdist]", '[artifacts]\nwheel-x86_64 = "x"\n\n[artifacts.sdist]')
    with pytest.raises(lock.LockError, match=r"\[artifacts.wheel-x86_64\] must be a table, not a string"):
        lock.parse(text)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'commit = "g4ba787ec9"',
            'commit = ["g4ba787ec9"]',
            r"'commit' in \[upstream\] must be a string, not an arr",
        ),
        (
            'torch = "2.14.0"',
            "torch = {version = '2.14.0'}",
            r"'torch' in \[pins\] must be a version string, not a table",
        ),
        ('torch = "2.14.0"', "torch = 2", r"pin 'torch' in \[pins\] must be a version string, not a number"),
        (
            'version = "0.33.0"',
            'version = " 0.33.0"',
            r"' 0.33.0' is not a canonical version number \(write '0.33.0'\)",
        ),
        ('version = "0.33.0"', 'version = "0.33.0 "', "not a canonical version"),
        ('version = "0.33.0"', "version = 0.33", r"'version' in \[upstream\] must be a string, not a number"),
        ('digest = ""', "digest = true", r"'digest' in \[base-image\] must be a string, not a boolean"),
        ('name = "vllm/vllm-openai:v0.33.0"', "name = 1", r"'name' in \[base-image\] must be a string, not a number"),
    ],
)
def test_lock_value_types_are_named(old, new, message):
    text = (REPO_ROOT / "upstream.lock").read_text()
    assert old in text
    with pytest.raises(lock.LockError, match=message):
        lock.parse(text.replace(old, new, 1))


def test_the_canonical_version_pattern_is_packagings_canonical_form():
    """The lock checks a version with a regular expression (an unchanged re-apply must not import
    packaging): over every combination below it accepts exactly what ``str(Version(v))`` gives back."""
    import itertools

    from packaging.version import InvalidVersion, Version

    releases = ["0", "00", "1", "01", "0.33.0", "0.033.0", "2.14.0", "1.2.3.4"]
    extras = ["", "a1", "b0", "rc2", "RC1", "c1", ".post1", "-post2", "post3", ".dev0", "-1", "+local.1", "+L.01"]
    checked = 0
    for head, release, extra, tail in itertools.product(["", "v", "1!", "0!", " "], releases, extras, ["", " ", "/x"]):
        value = head + release + extra + tail
        try:
            canonical = str(Version(value)) == value
        except InvalidVersion:
            canonical = False
        assert bool(lock.CANONICAL_VERSION_RE.match(value)) == canonical, value
        checked += canonical
    assert checked > 50  # the canonical ones were met too, not only refusals
