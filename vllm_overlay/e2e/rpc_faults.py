"""Failing utility and collective calls on real servers while clients stream (``serve-e2e --faults``).

Every call goes through vLLM's own endpoints, as a user or an RL framework makes it: the dev-mode
routes (``VLLM_SERVER_DEV_MODE=1``: /collective_rpc, /reset_prefix_cache, /sleep, /wake_up) and
/v1/load_lora_adapter (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``). Nothing is added to the runtime.

The cases, each made while ``clients`` streams are open (new ones started as they end) and
followed by a plain completion:

- collective-rpc-ok       /collective_rpc ``check_health``: succeeds on every rank (the control: a
                          collective call that does not fail, between the same steps);
- collective-rpc-raises   /collective_rpc ``discard``: vLLM's CPU worker raises on every rank
                          ("Selective discard is not supported on CPU.");
- lora-rank-refused       /v1/load_lora_adapter of an adapter of rank 16 with --max-lora-rank 8:
                          the workers' PEFTHelper.validate_legal raises (add_lora);
- profile-unconfigured    /start_profile is not routed without --profiler-config (its answer is
                          recorded); the workers' call it makes, ``profile``, through /collective_rpc
                          raises "Profiling is not enabled" on every rank;
- reset-prefix-cache      /reset_prefix_cache (succeeds);
- sleep-wake              /sleep?level=1&mode=wait then /wake_up: the engine pauses, the executor
                          calls the workers' sleep and wake_up (the CPU worker logs that sleep mode
                          is not supported and returns; vLLM refuses --enable-sleep-mode on CPU);
- burst-streaming         ``burst`` failing calls back to back (the three failing kinds in turn);
- burst-idle              the same with no request in flight.

The oracle rule (pristine decides): a runtime *stays up* when every call answered within
CALL_TIMEOUT_S (a failing call with its worker's error, a succeeding one with 200), every stream
finished with all its tokens, and a completion after the case succeeded. The patched runtime must
stay up in every case. Pristine is recorded, never failed: where it dies or hangs that is its
known defect (PRISTINE_KNOWN), which the series fixes; the verdict says whether what it did
matches what was recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_overlay.e2e.scenarios import PROMPTS, Result
from vllm_overlay.e2e.server import MODEL_NAME, Server, ServerError, ServerSpec, get, stream_events

# Layout name -> (tensor parallel, pipeline parallel).
LAYOUTS: dict[str, tuple[int, int]] = {"tp1": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}
MAX_LORA_RANK = 8
ADAPTER_RANK = 16  # above MAX_LORA_RANK: the workers refuse it
# A failing call answers in well under a second on a healthy engine; one that takes this long has hung.
CALL_TIMEOUT_S = 30.0
STREAM_TOKENS = 96  # long enough that a stream spans a call; prompt + this < --max-model-len
# The longest a stream may go without a chunk (urllib's read timeout): a healthy engine sends one every
# few milliseconds here; a stream silent this long is stuck in a hung engine.
STREAM_TIMEOUT_S = 60.0
BURST_CI = 100  # back-to-back failing calls per burst in CI: the count asked for (docs/e2e.md: what they cost)
BURST_DEEP = 1000  # --deep: ten times that, for a long run

CASES = (
    "collective-rpc-ok",
    "collective-rpc-raises",
    "lora-rank-refused",
    "profile-unconfigured",
    "reset-prefix-cache",
    "sleep-wake",
    "burst-streaming",
    "burst-idle",
)

# What pristine vLLM 0.32.0 (the CPU runtime) was seen to do, by layout and case, the cases run in
# CASES order on one server: "up" (it stays up), "wrong" (it serves, but a call got another call's
# answer or a stream failed), "dies" (the engine stops: calls and completions fail, /health 503) or
# "hangs" (a call or completion never answers while /health says 200). Cases not listed: "up".
# The patched runtime must be "up" in all. docs/e2e.md has the runs these come from.
PRISTINE_KNOWN: dict[tuple[str, str], str] = {
    # A failed collective RPC leaves rank 1's reply unread; the next collective RPC takes it as its own:
    # /sleep answers the earlier discard's error ("Call to sleep method failed: Worker failed with error
    # 'Selective discard is not supported on CPU.'").
    ("tp2", "sleep-wake"): "wrong",
    # Unread replies pile up in rank 1's response queue: the 9th call of the burst never answers, the
    # streams stop, /health stays 200 (burst-idle is then not reached).
    ("tp2", "burst-streaming"): "hangs",
    # PP=2 runs its idle burst first (IDLE_FIRST): the same pile-up in a worker's response queue, the
    # 22nd call never answers, /health stays 200; the streaming cases are then not reached.
    ("pp2", "burst-idle"): "hangs",
    # Reached only on an engine that survived the idle burst: see RUNTIME_DEFECTS.
    ("pp2", "collective-rpc-ok"): "dies",
}

# Where the runtime itself fails, pristine and patched alike, on calls that succeed (found by the
# control case): a defect the series does not address, listed once, as data, by layout: (the state
# it leaves, what it is, a pattern its traceback leaves in the server's log). In that layout a case
# where patched dies with that traceback in its log is accepted (as on pristine), and the cases after
# it on that server are not reached on either runtime; a hang, or a death without it, still fails.
RUNTIME_DEFECTS: dict[str, tuple[str, str, str]] = {
    # vLLM 0.32.0 on CPU at PP=2: the first model step after any collective RPC (check_health, which
    # succeeds on every rank, included; with batches in flight or idle) ends the engine: the PP=1
    # worker's execute_model finds no intermediate tensors (AssertionError in
    # sync_and_gather_intermediate_tensors), then the scheduler gets an output without its requests
    # (KeyError in update_from_output). Same on both runtimes.
    "pp2": (
        "dies",
        "the first model step after a collective RPC ends vLLM 0.32.0 on CPU at PP=2",
        r"sync_and_gather_intermediate_tensors[\s\S]*AssertionError[\s\S]*KeyError: 'cmpl-",
    ),
}
# Layouts whose idle burst runs first, because any streaming case ends the runtime there (RUNTIME_DEFECTS).
IDLE_FIRST = frozenset({"pp2"})


@dataclass(frozen=True)
class Call:
    """One HTTP call of a case: the path, its JSON body (None: no body) and what it must answer."""

    path: str
    body: dict | None = None
    fails_with: str | None = None  # the worker's error text the failing call must carry; None: must succeed
    recorded_only: bool = False  # its answer is a fact, not part of the verdict (/start_profile: not routed)


def adapter(dest: Path, rank: int = ADAPTER_RANK) -> Path:
    """A PEFT LoRA adapter directory of ``rank`` for the tiny Llama's attention projections.

    Only its adapter_config.json is read before the workers refuse it (PEFTHelper.validate_legal
    runs before any weight is loaded), so it carries no weights: a rank within the limit would be
    refused for the missing weights instead, which is not what this case tests.
    """
    dest.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "lora_dropout": 0.0,
        "task_type": "CAUSAL_LM",
    }
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return dest


DISCARD_ERROR = "Selective discard is not supported on CPU"
LORA_ERROR = f"greater than max_lora_rank {MAX_LORA_RANK}"
PROFILE_ERROR = "Profiling is not enabled"


def case_calls(adapter_dir: Path) -> dict[str, list[Call]]:
    """The calls of each single case (the bursts cycle through FAILING)."""
    return {
        "collective-rpc-ok": [Call("/collective_rpc", {"method": "check_health"})],
        "collective-rpc-raises": [Call("/collective_rpc", {"method": "discard", "args": ["kv_cache"]}, DISCARD_ERROR)],
        "lora-rank-refused": [
            Call("/v1/load_lora_adapter", {"lora_name": "e2e-rank16", "lora_path": str(adapter_dir)}, LORA_ERROR)
        ],
        "profile-unconfigured": [
            Call("/start_profile", None, recorded_only=True),
            Call("/collective_rpc", {"method": "profile", "args": []}, PROFILE_ERROR),
        ],
        "reset-prefix-cache": [Call("/reset_prefix_cache")],
        "sleep-wake": [Call("/sleep?level=1&mode=wait"), Call("/wake_up")],
    }


def failing_calls(adapter_dir: Path) -> list[Call]:
    calls = case_calls(adapter_dir)
    return [
        calls["collective-rpc-raises"][0],
        calls["lora-rank-refused"][0],
        calls["profile-unconfigured"][1],
    ]


def spec(python: Path, model: Path, label: str, layout: str) -> ServerSpec:
    """A server of ``layout`` with the dev-mode routes, runtime LoRA loading and LoRA enabled."""
    tp, pp = LAYOUTS[layout]
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    if tp * pp > 1:
        # One core per rank (PP ranks too): without it the CPU workers bind to cores already taken.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp * pp))
    extra = ["--enable-lora", "--max-lora-rank", str(MAX_LORA_RANK), "--max-loras", "1"]
    if pp > 1:
        extra += ["--pipeline-parallel-size", str(pp)]
    return ServerSpec(python=python, model=model, label=label, tensor_parallel=tp, extra_args=extra, env=env)


@dataclass
class Answer:
    status: int  # 0: no answer within the timeout (or the connection failed)
    body: str
    seconds: float


def post(url: str, body: dict | None, timeout: float) -> Answer:
    """POST (a JSON body or none); the status and body, also of an error; status 0 when nothing answered."""
    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
            return Answer(response.status, text, time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode("utf-8", errors="replace"), time.monotonic() - started)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return Answer(0, f"{type(exc).__name__}: {exc}", time.monotonic() - started)


def stream_once(
    url: str, prompt: str, tokens: int, timeout: float, on_open: Callable[[], None] | None = None
) -> tuple[int, str | None]:
    """One streamed greedy completion: (token chunks seen, its finish reason or None); raises on an error event.

    ``on_open`` is called at its first chunk (the request is live in the engine from then on).
    """
    payload = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    chunks, finish = 0, None
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for event in stream_events(response):
            if "error" in event:
                raise ServerError(f"stream error: {str(event['error'])[:200]}")
            choice = event["choices"][0]
            chunks += 1
            if chunks == 1 and on_open is not None:
                on_open()
            finish = choice.get("finish_reason") or finish
    return chunks, finish


class Load:
    """``clients`` threads streaming back to back until stopped; every stream's end is recorded.

    A stream *completes* when it ends with finish_reason "length" (ignore_eos: all its tokens).
    """

    def __init__(self, server: Server, clients: int, tokens: int = STREAM_TOKENS) -> None:
        self.url = server.url + "/v1/completions"
        self.tokens = tokens
        self.stop = threading.Event()
        self.first = [threading.Event() for _ in range(clients)]
        self.completed = 0
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, index: int) -> None:
        while not self.stop.is_set():
            try:
                prompt = PROMPTS[index % len(PROMPTS)]
                _, finish = stream_once(self.url, prompt, self.tokens, STREAM_TIMEOUT_S, self.first[index].set)
                outcome = None if finish == "length" else f"ended with finish_reason {finish!r}"
            except Exception as exc:  # recorded: a stream that did not complete
                outcome = f"{type(exc).__name__}: {str(exc)[:160]}"
            with self.lock:
                if outcome is None:
                    self.completed += 1
                else:
                    self.failed.append(outcome)
            self.first[index].set()
            if outcome is not None:
                return  # a broken engine: do not hammer it

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def wait_open(self, timeout: float = 120.0) -> bool:
        """Wait until every client has a stream open (its first chunk came): the engine is streaming."""
        end = time.monotonic() + timeout
        return all(event.wait(max(0.0, end - time.monotonic())) for event in self.first)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(STREAM_TIMEOUT_S + 10)

    def hung(self) -> int:
        return sum(thread.is_alive() for thread in self.threads)


@dataclass
class Observed:
    """What one case did on one runtime."""

    answers: list[tuple[str, int, float, bool]] = field(default_factory=list)  # (path, status, seconds, right)
    errors_named: int = 0  # failing calls whose answer carried their worker's error
    failing: int = 0
    recorded: list[str] = field(default_factory=list)  # the recorded-only answers
    streams_completed: int = 0
    streams_failed: list[str] = field(default_factory=list)
    streams_hung: int = 0
    completion_after: int = 0
    health_after: int = 0
    first_wrong: str = ""

    @property
    def state(self) -> str:
        """up, wrong (up, but an answer or a stream was wrong), dies or hangs (see the module's docstring)."""
        unanswered = any(status == 0 for _, status, _, _ in self.answers) or self.completion_after == 0
        if unanswered or self.streams_hung:
            return "hangs" if self.health_after == 200 else "dies"
        if self.completion_after != 200 or self.health_after != 200:
            return "dies"
        if self.first_wrong or self.streams_failed:
            return "wrong"
        return "up"


def run_calls(server: Server, calls: list[Call], observed: Observed) -> None:
    """Make ``calls`` in order; stop at the first that does not answer (the engine is hung or gone)."""
    for call in calls:
        answer = post(server.url + call.path, call.body, CALL_TIMEOUT_S)
        if call.recorded_only:
            observed.recorded.append(f"{call.path} HTTP {answer.status}")
            continue
        if call.fails_with is None:
            right = answer.status == 200
        else:
            observed.failing += 1
            named = call.fails_with in answer.body
            observed.errors_named += named
            right = answer.status >= 400 and named
        observed.answers.append((call.path, answer.status, answer.seconds, right))
        if not right and not observed.first_wrong:
            observed.first_wrong = f"{call.path} HTTP {answer.status}: {answer.body[:200]}"
        if answer.status == 0:
            return


def after(server: Server, observed: Observed) -> None:
    """A plain completion after the case, and /health."""
    completion = post(
        server.url + "/v1/completions",
        {"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0.0, "ignore_eos": True},
        CALL_TIMEOUT_S,
    )
    observed.completion_after = completion.status
    observed.health_after = get(server.url + "/health", timeout=10)[0]


def run_case(server: Server, calls: list[Call], clients: int) -> Observed:
    """``calls`` while ``clients`` stream (none: on an idle engine), then a completion and /health."""
    observed = Observed()
    if clients:
        load = Load(server, clients)
        with load:
            if not load.wait_open():
                observed.first_wrong = "the streams did not start"
            else:
                run_calls(server, calls, observed)
            # Each client ends after the stream it is in; bounded by STREAM_TIMEOUT_S in __exit__.
        observed.streams_completed = load.completed
        observed.streams_failed = list(load.failed)
        observed.streams_hung = load.hung()
    else:
        run_calls(server, calls, observed)
    after(server, observed)
    return observed


def describe(observed: Observed) -> str:
    statuses = sorted({status for _, status, _, _ in observed.answers})
    slowest = max((seconds for _, _, seconds, _ in observed.answers), default=0.0)
    text = f"{observed.state}: {len(observed.answers)} call(s) HTTP {statuses}, slowest {slowest:.2f}s"
    if observed.failing:
        text += f", {observed.errors_named}/{observed.failing} failing call(s) named their worker's error"
    if observed.recorded:
        text += f" ({'; '.join(observed.recorded)})"
    text += f"; streams {observed.streams_completed} completed, {len(observed.streams_failed)} failed"
    if observed.streams_hung:
        text += f", {observed.streams_hung} still open"
    text += f"; completion after HTTP {observed.completion_after}; /health {observed.health_after}"
    if observed.first_wrong:
        text += f"; first wrong answer: {observed.first_wrong}"
    if observed.streams_failed:
        text += f"; first failed stream: {observed.streams_failed[0]}"
    return text


def runtime_defect(layout: str, observed: Observed, log: str) -> str | None:
    """What RUNTIME_DEFECTS lists for ``layout``, if ``observed`` is that defect (its state, and its
    traceback in the server's ``log``); else None."""
    defect = RUNTIME_DEFECTS.get(layout)
    if defect is None or observed.state != defect[0] or not re.search(defect[2], log):
        return None
    return defect[1]


def verdict(layout: str, case: str, patched: bool, observed: Observed, log: str = "") -> tuple[bool, str]:
    """Patched must stay up (or die of the runtime's own listed defect, as pristine does); pristine is
    recorded against PRISTINE_KNOWN and never failed."""
    detail = describe(observed)
    if patched:
        defect = runtime_defect(layout, observed, log)
        if defect is not None:
            return True, f"{detail} [the runtime's own defect, as on pristine: {defect}]"
        return observed.state == "up", detail
    known = PRISTINE_KNOWN.get((layout, case), "up")
    if observed.state == known:
        note = "as recorded" if known == "up" else f"its known defect, as recorded ({known})"
    else:
        note = f"recorded: {known}; differs (pristine is not judged, see docs/e2e.md)"
    return True, f"{detail} [{note}]"


def case_order(layout: str) -> tuple[str, ...]:
    """CASES, the idle one first where a streaming case ends the runtime (IDLE_FIRST)."""
    if layout not in IDLE_FIRST:
        return CASES
    return ("burst-idle", *(case for case in CASES if case != "burst-idle"))


def _read(server: Server) -> str:
    """The server's log so far ("" when it has none)."""
    try:
        return Path(server.log).read_text(encoding="utf-8", errors="replace")
    except (AttributeError, OSError):
        return ""


def layout_results(
    server: Server, layout: str, patched: bool, clients: int, burst: int, adapter_dir: Path
) -> list[Result]:
    """Every case of CASES in order on one server; once the engine is gone or hung, the rest are not reached."""
    calls = case_calls(adapter_dir)
    failing = failing_calls(adapter_dir)
    bursts: dict[str, Callable[[], Observed]] = {
        "burst-streaming": lambda: run_case(server, [failing[i % 3] for i in range(burst)], clients),
        "burst-idle": lambda: run_case(server, [failing[i % 3] for i in range(burst)], 0),
    }
    results: list[Result] = []
    stopped: str | None = None
    by_defect = False
    for case in case_order(layout):
        name = f"{layout} {case}" + (f" x{burst}" if case.startswith("burst") else "")
        if stopped is not None:
            # Patched: a case not reached is a failure, unless the runtime's own defect ended it.
            ok = not patched or by_defect
            results.append(Result(name, ok, f"not reached: the engine {stopped}", 0.0))
            continue
        started = time.monotonic()
        observed = bursts[case]() if case in bursts else run_case(server, calls[case], clients)
        log = _read(server)
        ok, detail = verdict(layout, case, patched, observed, log)
        results.append(Result(name, ok, detail, time.monotonic() - started, {"state": observed.state}))
        if observed.state in ("dies", "hangs"):
            stopped = f"{'died' if observed.state == 'dies' else 'hung'} at {case}"
            defect = runtime_defect(layout, observed, log)
            by_defect = defect is not None
            if by_defect:
                stopped += f" (the runtime's own defect: {defect})"
    return results
