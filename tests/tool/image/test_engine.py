"""The container engine wrapper: each engine's own flags where it takes them."""

from __future__ import annotations


def _argv_of(monkeypatch, eng, call):
    """The command lines ``call(eng)`` would run (nothing runs)."""
    from vllm_overlay.image import engine

    seen: list[list[str]] = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def fake_run(argv, **_kwargs):
        seen.append(list(argv))
        return Done()

    monkeypatch.setattr(engine, "_run", fake_run)
    call(eng)
    return seen


def test_podman_gets_its_runtime_as_a_global_flag_and_ulimits_on_build_and_run(monkeypatch, tmp_path):
    """Debian's podman 4.3 runs nothing with its default runtime: build-image --engine podman must pass them."""
    from vllm_overlay.image import engine

    options = engine.Options(runtime="runc", ulimits=("nofile=1024:1024", "nproc=4096:4096"), network="none")
    podman = engine.Engine("podman", "/usr/bin/podman", options)
    (build,) = _argv_of(monkeypatch, podman, lambda e: e.build(tmp_path, ["t"], {}, 0))
    (run,) = _argv_of(monkeypatch, podman, lambda e: e.run("t", ["python3", "-V"]))
    limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "--network", "none"]
    for argv, verb in ((build, "build"), (run, "run")):
        assert argv[:4] == ["/usr/bin/podman", "--runtime", "runc", verb]
        at = argv.index(limits[0])
        assert argv[at : at + len(limits)] == limits
    docker = engine.Engine("docker", "docker", options)
    (build,) = _argv_of(monkeypatch, docker, lambda e: e.build(tmp_path, ["t"], {}, 0))
    (run,) = _argv_of(monkeypatch, docker, lambda e: e.run("t", ["python3"]))
    assert "--runtime" not in build and "--force-rm" in build  # docker build picks no runtime
    assert run[:4] == ["docker", "run", "--rm", "--runtime"] and "nproc=4096:4096" in run
