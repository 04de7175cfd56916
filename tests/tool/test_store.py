"""store: where the cache is, its lock across processes, and the leftovers of killed runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from vllm_overlay import store
from vllm_overlay.store import Store

# Another process trying the store's lock without waiting: prints "taken" or "free".
TRY_LOCK = """
import fcntl, sys
with open(sys.argv[1], "a+") as handle:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("taken")
    else:
        print("free")
"""


def _other_process_sees(path: Path) -> str:
    return subprocess.run([sys.executable, "-c", TRY_LOCK, str(path)], capture_output=True, text=True).stdout.strip()


def test_default_root_prefers_the_variable_then_xdg_then_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store.default_root() == tmp_path / "explicit"
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", "")  # empty counts as unset
    assert store.default_root() == tmp_path / "xdg" / "vllm-overlay"
    monkeypatch.delenv("VLLM_OVERLAY_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert store.default_root() == tmp_path / "home" / ".cache" / "vllm-overlay"


def test_store_layout_follows_the_variable_and_is_absolute(store_env: Path, tmp_path: Path, monkeypatch) -> None:
    default = Store()
    assert default.root == store_env.resolve()
    assert default.downloads == store_env / "downloads"
    assert default.upstreams_git == store_env / "upstreams.git"
    assert default.envs == store_env / "envs"
    monkeypatch.chdir(tmp_path)
    assert Store(Path("relative")).root == tmp_path / "relative"
    assert not store_env.exists()  # naming the store creates nothing


def test_exclusive_holds_the_lock_against_other_processes(store_env: Path) -> None:
    cache = Store()
    assert not store_env.exists()
    with cache.exclusive():
        assert (store_env / ".lock").is_file()
        assert _other_process_sees(store_env / ".lock") == "taken"
        assert _other_process_sees(store_env / "other.lock") == "free"  # another named lock is its own
    assert _other_process_sees(store_env / ".lock") == "free"
    with cache.exclusive("other.lock"):
        assert _other_process_sees(store_env / "other.lock") == "taken"
        assert _other_process_sees(store_env / ".lock") == "free"


def test_exclusive_waits_for_the_holder(store_env: Path) -> None:
    store_env.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\nh = open(sys.argv[1], 'a+')\nfcntl.flock(h, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(0.5)",
            str(store_env / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with Store().exclusive():
            waited = time.monotonic() - started
    finally:
        holder.wait()
    assert waited > 0.2


def test_remove_leftovers_takes_what_killed_runs_left_and_nothing_else(store_env: Path) -> None:
    cache = Store()
    tags = cache.upstreams_git / "refs" / "tags" / "upstream"
    tags.mkdir(parents=True)
    cache.downloads.mkdir()
    left = [
        cache.downloads / ".vllm-0.33.0.tar.gz.1a2b.part",
        store_env / f"{store.UNPACK_PREFIX}x1" / "vllm-0.33.0" / "setup.py",
        tags / "0.33.0.lock",
        cache.upstreams_git / "packed-refs.lock",
        cache.upstreams_git / "index.lock",
    ]
    kept = [
        cache.downloads / "vllm-0.33.0.tar.gz",
        tags / "0.33.0",
        cache.upstreams_git / "packed-refs",
        cache.upstreams_git / "objects" / "pack" / "keep.lock",  # not a ref lock: git's objects are not touched
        cache.envs / "abc.build.log",
    ]
    for path in left + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    (cache.upstreams_git / "shallow.lock").mkdir()  # a directory of that name at the top is not git's lock file
    with cache.exclusive():
        removed = cache.remove_leftovers()
    assert sorted(removed) == sorted([left[0], left[1].parents[1], *left[2:]])
    assert [p for p in left if p.exists()] == [] and not left[1].parents[1].exists()
    assert all(p.exists() for p in kept) and (cache.upstreams_git / "shallow.lock").is_dir()
    assert cache.remove_leftovers() == []


def test_remove_leftovers_of_a_store_not_made_yet(store_env: Path) -> None:
    assert Store().remove_leftovers() == []
    assert not store_env.exists()


def test_the_store_names_every_folder_of_the_cache_and_lists_what_is_there(store_env: Path) -> None:
    cache = Store()
    named = cache.folders()
    everything = ["downloads", "upstreams.git", "envs", "kept-builds", "verdicts", "dependencies", "ci"]
    everything += ["oracle-examples", "baselines"]
    assert sorted(p.name for p in named) == sorted(everything)
    assert all(p.parent == cache.root for p in named) and len(set(named.values())) == len(named)
    assert cache.present() == []  # a cache not made yet holds nothing
    for path in (cache.ci, cache.kept_builds, store_env / "made-by-hand", store_env / f"{store.UNPACK_PREFIX}x1"):
        path.mkdir(parents=True)
    (store_env / ".lock").write_text("1\n")  # files are not folders
    assert cache.present() == [
        (store_env / ".unpack-x1", "half-unpacked"),
        (cache.ci, "CI stand-ins"),
        (cache.kept_builds, "kept builds"),
        (store_env / "made-by-hand", "unknown folder"),
    ]


def test_a_verdict_scope_stays_inside_the_verdict_store(store_env: Path) -> None:
    import pytest

    cache = Store()
    assert cache.verdict_scope("e2e") == cache.verdicts / "e2e"
    assert cache.verdict_secret == cache.verdicts / ".secret"
    for name in ("", ".", "..", "../envs", "a/b"):
        with pytest.raises(store.OutsideCacheError, match="inside the cache's verdicts"):
            cache.verdict_scope(name)


def test_no_module_but_the_store_names_a_cache_folder() -> None:
    """``<path> / "<cache folder>"`` anywhere in the package but store.py: ask the Store for the folder."""
    import ast

    from tests.tool.helpers.repos import REPO_ROOT

    names = {p.name for p in Store(Path("/cache")).folders()}
    found = []
    for path in sorted((REPO_ROOT / "vllm_overlay").rglob("*.py")):
        if path.name == "store.py" and path.parent.name == "vllm_overlay":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                if isinstance(node.right, ast.Constant) and node.right.value in names:
                    found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.right.value}")
    assert found == []
