"""testenv: the environment's key and requirements, and how an environment given from outside is checked.

Only what needs no 10 GB environment: building one (pip install vllm) is left to the real runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.tool.helpers.installs import make_site, seed_wheel_record, site_record
from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay.env import testenv
from vllm_overlay.errors import InputError
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock


@pytest.fixture
def the_lock(tmp_path: Path) -> lock.Lock:
    shutil.copy(REPO_ROOT / "upstream.lock", tmp_path / "upstream.lock")
    return lock.load(tmp_path / "upstream.lock")


def test_requirements_are_vllm_the_test_tools_then_the_tools_own(the_lock: lock.Lock) -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert testenv.tool_requirements() == pyproject["project"]["dependencies"]
    reqs = testenv.requirements(the_lock)
    assert reqs == [f"{the_lock.project}=={the_lock.version}", *testenv.TEST_REQUIREMENTS, *testenv.tool_requirements()]
    assert all("==" in pin for pin in testenv.TEST_REQUIREMENTS)
    assert {name.replace("_", "-") for name in testenv.REQUIRED_MODULES} <= {
        p.split("==")[0] for p in testenv.TEST_REQUIREMENTS
    }


def test_env_key_follows_the_interpreter_version_and_the_order_of_pins(the_lock: lock.Lock) -> None:
    reqs = testenv.requirements(the_lock)
    key = testenv.env_key(the_lock, reqs, "3.11")
    assert len(key) == 24 and int(key, 16) >= 0
    current = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert testenv.env_key(the_lock, reqs) == testenv.env_key(the_lock, reqs, current)  # default: this interpreter
    assert key != testenv.env_key(the_lock, reqs, "3.12")
    assert key != testenv.env_key(the_lock, list(reversed(reqs)), "3.11")
    expected = hashlib.sha256(the_lock.path.read_bytes() + b"\0" + "\n".join(reqs).encode() + b"\0" + b"3.11")
    assert key == expected.hexdigest()[:24]


def test_env_key_of_a_lock_without_a_file_hashes_its_version(the_lock: lock.Lock) -> None:
    loose = dataclasses.replace(the_lock, path=None)
    key = testenv.env_key(loose, ["a==1"], "3.11")
    assert key == hashlib.sha256(the_lock.version.encode() + b"\0a==1\0" + b"3.11").hexdigest()[:24]
    assert key != testenv.env_key(dataclasses.replace(loose, version="0.0.1"), ["a==1"], "3.11")


def test_describe_refuses_a_folder_without_an_interpreter(tmp_path: Path) -> None:
    with pytest.raises(testenv.EnvError, match=r": not a virtual environment \(no bin/python\)$"):
        testenv.describe(tmp_path, None, managed=False)
    assert issubclass(testenv.EnvError, InputError)


def test_describe_refuses_an_interpreter_that_does_not_run(tmp_path: Path) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\nexit 3\n")
    python.chmod(0o755)
    with pytest.raises(testenv.EnvError, match=r"bin/python does not run: .*exit status 3"):
        testenv.describe(tmp_path, None, managed=False)


def test_describe_a_real_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = testenv.describe(venv, "k" * 24, managed=True)
    assert env.python == venv / "bin" / "python"
    assert (
        env.site_packages == venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )
    assert env.to_json() == {
        "path": str(venv),
        "python": str(env.python),
        "site_packages": str(env.site_packages),
        "key": "k" * 24,
        "managed": True,
    }
    assert testenv.missing_modules(env.python, ["json", "pytest", "no_such_module_x"]) == ["pytest", "no_such_module_x"]


def test_missing_modules_of_this_interpreter() -> None:
    assert testenv.missing_modules(Path(sys.executable), ("pytest", "no_such_module_x", "os")) == ["no_such_module_x"]
    assert testenv.missing_modules(Path(sys.executable), []) == []


def test_proof_file_lives_in_the_cache_and_names_a_given_env_by_its_real_path(store_env: Path, tmp_path: Path) -> None:
    store = Store()
    assert testenv.proof_file(store, tmp_path / "env", "abc") == store.envs / "abc.proof.json"
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to("real")
    given = testenv.proof_file(store, tmp_path / "alias", None)
    digest = hashlib.sha256(str((tmp_path / "real").resolve()).encode()).hexdigest()[:16]
    assert given == store.envs / f"given-{digest}.proof.json"
    assert given == testenv.proof_file(store, tmp_path / "real", None)


def _given_env(tmp_path: Path, stubs: dict[str, str]) -> Path:
    """An environment given with --env: an interpreter (this one) seeing extra modules."""
    modules = tmp_path / "modules"
    modules.mkdir()
    for name, text in stubs.items():
        (modules / f"{name}.py").write_text(text)
    env = tmp_path / "given"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text(f'#!/bin/sh\nPYTHONPATH={modules} exec {sys.executable} "$@"\n')
    (env / "bin" / "python").chmod(0o755)
    return env


def test_a_given_env_lacking_the_test_tools_is_refused_by_name(
    the_lock: lock.Lock, store_env: Path, tmp_path: Path
) -> None:
    env = _given_env(tmp_path, {})
    missing = testenv.missing_modules(env / "bin" / "python", testenv.REQUIRED_MODULES)
    assert "pytest" not in missing
    with pytest.raises(testenv.EnvError) as caught:
        testenv.ensure(the_lock, Store(), env)
    assert (
        str(caught.value)
        == f"{env}: lacks {', '.join(missing)}; install them with {env / 'bin' / 'python'} -m pip install ..."
    )


def test_a_given_env_without_vllm_is_refused_not_rebuilt(
    the_lock: lock.Lock, store_env: Path, tmp_path: Path, monkeypatch
) -> None:
    env = _given_env(tmp_path, {"tblib": "", "pytest_timeout": ""})
    seed_wheel_record(store_env, the_lock, site_record(make_site(tmp_path / "wheel")))
    monkeypatch.setenv(testenv.ENV_VAR, str(env))  # the variable gives it as --env does
    with pytest.raises(testenv.EnvError) as caught:
        testenv.ensure(the_lock, Store())
    message = str(caught.value)
    assert message.startswith(f"{env}: the installed vllm is not pristine per its RECORD (")
    assert "no-dist: vllm" in message and "it is not rebuilt" in message
    assert env.is_dir() and sorted(p.name for p in env.iterdir()) == ["bin"]  # nothing deleted or built there
    assert not store_env.joinpath("envs").exists() or not any(store_env.joinpath("envs").glob(".*"))


def test_env_key_follows_lock_and_pins(tmp_path: Path) -> None:
    from vllm_overlay.upstream import lock

    lock_path = tmp_path / "upstream.lock"
    shutil.copy(Path(__file__).resolve().parents[3] / "upstream.lock", lock_path)
    the_lock = lock.load(lock_path)
    reqs = testenv.requirements(the_lock)
    assert reqs[0] == f"vllm=={the_lock.version}" and any(r.startswith("pytest-timeout") for r in reqs)
    key = testenv.env_key(the_lock, reqs)
    assert key == testenv.env_key(the_lock, list(reqs))
    assert key != testenv.env_key(the_lock, [*reqs, "extra==1"])
    lock_path.write_text(lock_path.read_text() + "\n# changed\n")
    assert key != testenv.env_key(lock.load(lock_path), reqs)
