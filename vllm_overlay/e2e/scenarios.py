"""The scenarios: each runs against one ready server and returns what it observed.

A scenario never decides pristine against patched by itself; it records facts (outputs, status
codes, timings) and its own pass/fail against what that runtime must do. The suite
(vllm_overlay.e2e.suite) runs every scenario on both servers and compares them.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay.e2e.server import MODEL_NAME, Server, get, post_json, stream_completion

PROMPTS = (
    "the model serves",
    "each rank reads",
    "the engine core steps",
    "stream the reply back to",
    "workers answer the",
    "one chunk per token",
    "before the first prompt",
    "every request while",
)
MAX_TOKENS = 24
# A stream long enough to probe health from inside it a few times (prompt + this < --max-model-len).
LONG_TOKENS = 160
REQUEST_TIMEOUT = 240.0


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    seconds: float
    data: dict = field(default_factory=dict)


def _completion(prompt: str) -> dict:
    # Greedy and a fixed length (ignore_eos): the same prompt gives the same text on any runtime
    # that computes the same model.
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "seed": 0,
    }


def _concurrently(count: int, work: Callable[[int], object]) -> list[object]:
    """Run ``work(i)`` for i < count in threads; results in order, exceptions as values."""
    results: list[object] = [None] * count

    def run(i: int) -> None:
        try:
            results[i] = work(i)
        except Exception as exc:  # recorded, reported by the scenario
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(REQUEST_TIMEOUT + 30)
    return results


def completions(server: Server, clients: int) -> Result:
    """``clients`` concurrent non-streamed completions; every one must succeed."""
    started = time.monotonic()
    url = server.url + "/v1/completions"

    def one(i: int) -> str:
        status, body = post_json(url, _completion(PROMPTS[i % len(PROMPTS)]), REQUEST_TIMEOUT)
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"HTTP {status}: {str(body)[:200]}")
        return body["choices"][0]["text"]

    outputs = _concurrently(clients, one)
    errors = [str(o) for o in outputs if isinstance(o, Exception)]
    texts = [o if isinstance(o, str) else None for o in outputs]
    return Result(
        "completions",
        not errors,
        f"{clients} concurrent clients, {len(errors)} error(s)" + (f": {errors[0]}" if errors else ""),
        time.monotonic() - started,
        {"texts": texts},
    )


def streaming(server: Server, clients: int, expected: list[str | None]) -> Result:
    """``clients`` concurrent streamed completions; each must equal the same prompt's non-streamed text."""
    started = time.monotonic()
    url = server.url + "/v1/completions"

    def one(i: int) -> tuple[str, float | None]:
        chunks, first = stream_completion(url, _completion(PROMPTS[i % len(PROMPTS)]), REQUEST_TIMEOUT)
        return "".join(chunks), first

    outputs = _concurrently(clients, one)
    errors = [str(o) for o in outputs if isinstance(o, Exception)]
    texts = [o[0] if isinstance(o, tuple) else None for o in outputs]
    ttft = [o[1] for o in outputs if isinstance(o, tuple) and o[1] is not None]
    mismatched = [i for i, text in enumerate(texts) if text is not None and text != expected[i]]
    ok = not errors and not mismatched
    detail = f"{clients} concurrent streams, {len(errors)} error(s), {len(mismatched)} differing from non-streamed"
    return Result(
        "streaming",
        ok,
        detail + (f": {errors[0]}" if errors else ""),
        time.monotonic() - started,
        {"texts": texts, "ttft_max_s": max(ttft) if ttft else None},
    )


def health(server: Server, patched: bool) -> Result:
    """/health and /health/progress idle, and while streams are open (the patched runtime has the latter).

    "While streaming" is between a stream's first chunk and its end, from the client's side: the
    checks are made from inside each stream's read loop, so they always fall inside a live request.
    """
    started = time.monotonic()
    seen: dict[str, list[int]] = {"idle_health": [], "idle_progress": [], "busy_health": [], "busy_progress": []}
    bodies: list[str] = []
    for _ in range(2):
        seen["idle_health"].append(get(server.url + "/health")[0])
        status, body = get(server.url + "/health/progress")
        seen["idle_progress"].append(status)
        bodies.append(body)
    lock = threading.Lock()

    def probe() -> None:
        health_status = get(server.url + "/health")[0]
        progress_status, body = get(server.url + "/health/progress")
        with lock:
            seen["busy_health"].append(health_status)
            seen["busy_progress"].append(progress_status)
            bodies.append(body)

    payload = {**_completion(PROMPTS[0]), "max_tokens": LONG_TOKENS}
    streams = _concurrently(
        2, lambda i: stream_completion(server.url + "/v1/completions", payload, REQUEST_TIMEOUT, on_chunk=probe)
    )
    errors = [str(o) for o in streams if isinstance(o, Exception)]
    want_progress = 200 if patched else 404
    ok = (
        not errors
        and set(seen["idle_health"]) == {200}
        and set(seen["busy_health"]) == {200}
        and set(seen["idle_progress"]) == {want_progress}
        and set(seen["busy_progress"]) == {want_progress}
    )
    if patched and ok:
        try:
            report = json.loads(bodies[-1])
        except ValueError:
            report = None
        ok = isinstance(report, dict)
    summary = ", ".join(f"{k} {sorted(set(v))} x{len(v)}" for k, v in seen.items())
    if errors:
        summary += f"; stream error: {errors[0]}"
    return Result("health", ok, summary, time.monotonic() - started, {"progress_body": bodies[-1][:300]})


INFO_RE = re.compile(r"^vllm_overlay_info\{(?P<labels>[^}]*)\}\s+1(?:\.0)?$", re.M)


def metrics(server: Server, series_sha256: str | None) -> Result:
    """/metrics: the patched runtime carries vllm_overlay_info with its series hash; pristine does not."""
    started = time.monotonic()
    status, body = get(server.url + "/metrics")
    match = INFO_RE.search(body)
    if series_sha256 is None:
        ok = status == 200 and match is None
        detail = f"HTTP {status}; vllm_overlay_info {'present' if match else 'absent'}"
    else:
        ok = status == 200 and match is not None and f'series_sha256="{series_sha256}"' in match.group("labels")
        detail = f"HTTP {status}; " + (f"vllm_overlay_info{{{match.group('labels')[:120]}...}}" if match else "absent")
    return Result("metrics", ok, detail, time.monotonic() - started)


# vLLM prefixes each process's lines with its name and pid: "(APIServer pid=1)", "(EngineCore pid=2)",
# "(VllmWorker-0 pid=3)" / "(Worker pid=3)" (one worker process, named twice over its life).
PROCESS_PREFIX = r"^\((?P<proc>[A-Za-z][\w-]*?)(?:-\d+|_TP\d+)? pid=(?P<pid>\d+)\)"
PLUGIN_LINE = re.compile(PROCESS_PREFIX + r".*\+ overlay: series .*series sha256 ", re.M)
KINDS = {"APIServer": "APIServer", "EngineCore": "EngineCore", "VllmWorker": "Worker", "Worker": "Worker"}


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _environ(pid: str) -> dict[str, str] | None:
    """A running process's environment as it was started (None: gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)


def plugin_lines(server: Server, patched: bool, api_metric: bool = False) -> Result:
    """The plugin loaded in every vLLM process (API server, engine core, each worker).

    Processes are told apart by pid (a worker logs under two names). The engine core and the
    workers must log the plugin's line. The API server cannot: vLLM loads general plugins there
    while it builds the argument parser, before it configures its loggers, so the INFO line goes
    nowhere. Its proof is the metric the plugin publishes once its check passed: ``api_metric``
    (vllm_overlay_info with this series on that server's /metrics) counts for it only where no
    other process can have put it there: the engine core and workers (the processes the API
    server starts) were started without PROMETHEUS_MULTIPROC_DIR, so their gauges stay in their
    own memory and the API server's /metrics serves its own registry.
    """
    started = time.monotonic()
    text = server.log.read_text(encoding="utf-8", errors="replace")
    processes: dict[str, str] = {}
    for match in re.finditer(PROCESS_PREFIX, text, re.M):
        processes.setdefault(match.group("pid"), KINDS.get(match.group("proc"), match.group("proc")))
    logged = {m.group("pid") for m in PLUGIN_LINE.finditer(text)}
    found = sorted(f"{processes.get(pid, '?')} {pid}" for pid in logged)
    if not patched:
        ok = not found
        detail = f"logged by {', '.join(found) or 'none'} of {len(processes)} processes (no overlay installed)"
        return Result("plugin-line", ok, detail, time.monotonic() - started)
    children = [pid for pid, kind in processes.items() if kind != "APIServer"]
    environs = {pid: _environ(pid) for pid in children}
    shared = sorted(pid for pid, env in environs.items() if env is None or MULTIPROC_ENV in env)
    by_metric = []
    missing = []
    for pid, kind in sorted(processes.items()):
        if pid in logged:
            continue
        if kind == "APIServer" and api_metric and children and not shared:
            by_metric.append(f"{kind} {pid}")
        else:
            missing.append(f"{kind} {pid}")
    ok = not missing and bool(found)
    detail = f"logged by {', '.join(found) or 'no process'}"
    if by_metric:
        detail += f"; {', '.join(by_metric)}: vllm_overlay_info on its own /metrics (its line is lost: vLLM loads "
        detail += f"plugins there before it configures logging; no child process has {MULTIPROC_ENV})"
    if missing:
        detail += f"; not proven in {', '.join(missing)}"
        if shared:
            detail += f" (processes {', '.join(shared)} have {MULTIPROC_ENV} or are gone: the metric proves nothing)"
    return Result("plugin-line", ok, detail, time.monotonic() - started)


WORKER_RE = re.compile(r"^\((?:VllmWorker|Worker)[\w-]* pid=(\d+)\)", re.M)


def worker_killed(server: Server, timeout: float = 120.0, settle: float = 3.0) -> Result:
    """SIGKILL a worker while a streamed request is open on it: the stream must fail, /health must
    turn non-200, nothing may hang.

    Destructive: the last scenario on a server. The worker's pid is read from the server's own log
    (vLLM prefixes every worker line with it) and checked to be in the server's process group.
    The worker is stopped (SIGSTOP) before the request is sent and killed ``settle`` seconds after,
    the stream still open: the reply cannot finish first. Killed at the stream's first chunk
    instead, a tiny model's worker could write all of it before the kill landed (the API server
    starved of CPU on a loaded 2-core machine), and the stream then ended without error, pristine
    and patched alike. Killed before the request reaches the engine (a machine slower still), the
    request must fail as well.
    """
    import os
    import signal

    started = time.monotonic()
    pids = [int(p) for p in WORKER_RE.findall(server.log.read_text(encoding="utf-8", errors="replace"))]
    members = set(server.pids())
    victims = [p for p in dict.fromkeys(pids) if p in members]
    if not victims:
        return Result("worker-sigkill", False, f"no worker pid of the server's group in its log ({pids})", 0.0)
    victim = victims[-1]
    outcome: dict[str, object] = {}

    def stream() -> None:
        payload = {**_completion(PROMPTS[1]), "max_tokens": LONG_TOKENS}
        try:
            chunks, _ = stream_completion(server.url + "/v1/completions", payload, timeout)
            outcome["stream"] = f"ended after {len(chunks)} chunk(s) without error"
        except Exception as exc:  # the expected way for it to end
            outcome["stream"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            outcome["stream_failed"] = True

    os.kill(victim, signal.SIGSTOP)
    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    thread.join(settle)
    open_at_kill = thread.is_alive()
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(timeout)
    stream_ended = not thread.is_alive()
    health_status = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health_status = get(server.url + "/health", timeout=5)[0]
        if health_status != 200:
            break
        time.sleep(0.5)
    ok = open_at_kill and stream_ended and bool(outcome.get("stream_failed")) and health_status not in (None, 200)
    detail = (
        f"killed worker {victim} (stopped {settle:.0f}s before, the stream {'open' if open_at_kill else 'closed'}); "
        f"stream: {outcome.get('stream', 'still open')}; "
        f"/health {health_status if health_status else 'no answer'} {time.monotonic() - killed_at:.1f}s after the kill"
    )
    return Result("worker-sigkill", ok, detail, time.monotonic() - started)


def hung_step(server: Server, patched: bool, trigger: Path, timeout_s: float, interval_s: float) -> Result:
    """A model step made to hang (the test model's forward waits while ``trigger`` exists).

    Patched: /health/progress must answer 503 within the progress timeout plus one report
    interval of the step starting, and 200 again once the step completes. Pristine has no progress
    check: what /health says meanwhile is recorded (it stays 200 while nothing advances).
    """
    started = time.monotonic()
    bound = timeout_s + interval_s
    seen: list[tuple[float, int, int]] = []
    result: dict[str, object] = {}
    trigger.write_text("hang\n", encoding="utf-8")
    try:

        def request() -> None:
            status, _ = post_json(server.url + "/v1/completions", _completion(PROMPTS[2]), REQUEST_TIMEOUT)
            result["status"] = status

        thread = threading.Thread(target=request, daemon=True)
        sent = time.monotonic()
        thread.start()
        stalled_at = _until_stalled(server, sent, bound, seen)
        # The step really hung: the request is still open when the trigger goes.
        result["open_at_release"] = thread.is_alive()
    finally:
        trigger.unlink(missing_ok=True)
    thread.join(REQUEST_TIMEOUT)
    recovered_at = _until_recovered(server, sent, bound) if patched else None
    ok, detail = _hung_step_verdict(patched, bound, seen, result, stalled_at, recovered_at)
    return Result("hung-step", ok, detail, time.monotonic() - started)


def _until_stalled(server: Server, sent: float, bound: float, seen: list[tuple[float, int, int]]) -> float | None:
    """Poll /health and /health/progress (each pair appended to ``seen``) for ``bound`` + 10 s from
    ``sent``: the seconds after ``sent`` at which progress first answered 503, or None."""
    stalled_at = None
    while time.monotonic() - sent < bound + 10.0:
        health_status = get(server.url + "/health", timeout=5)[0]
        progress_status = get(server.url + "/health/progress", timeout=5)[0]
        seen.append((time.monotonic() - sent, health_status, progress_status))
        if progress_status == 503 and stalled_at is None:
            stalled_at = time.monotonic() - sent
            break
        time.sleep(0.25)
    return stalled_at


def _until_recovered(server: Server, sent: float, bound: float) -> float | None:
    """Poll /health/progress for ``bound`` + 10 s: the seconds after ``sent`` at which it answered 200, or None."""
    recovered_at = None
    end = time.monotonic() + bound + 10.0
    while time.monotonic() < end:
        if get(server.url + "/health/progress", timeout=5)[0] == 200:
            recovered_at = time.monotonic() - sent
            break
        time.sleep(0.25)
    return recovered_at


def _hung_step_verdict(
    patched: bool,
    bound: float,
    seen: list[tuple[float, int, int]],
    result: dict[str, object],
    stalled_at: float | None,
    recovered_at: float | None,
) -> tuple[bool, str]:
    health_seen = sorted({h for _, h, _ in seen})
    progress_seen = sorted({p for _, _, p in seen})
    if patched:
        ok = (
            stalled_at is not None
            and stalled_at <= bound
            and recovered_at is not None
            and result.get("status") == 200
            and bool(result.get("open_at_release"))
        )
        detail = (
            f"/health/progress 503 after {stalled_at:.1f}s (bound {bound:.0f}s)"
            if stalled_at is not None
            else f"/health/progress never 503 in {bound + 10:.0f}s (seen {progress_seen})"
        )
        detail += (
            f"; 200 again {recovered_at:.1f}s after the request" if recovered_at is not None else "; not 200 again"
        )
    else:
        ok = result.get("status") == 200 and progress_seen == [404] and bool(result.get("open_at_release"))
        hang_s = seen[-1][0] if seen else 0.0
        detail = f"/health {health_seen} throughout the {hang_s:.0f}s hang; /health/progress {progress_seen}"
    detail += (
        f"; request HTTP {result.get('status')}, open until the step was released: {result.get('open_at_release')}"
    )
    return ok, detail
