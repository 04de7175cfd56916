"""The failing-call cases against a stand-in HTTP server (no vLLM): what they call, and how they judge.

The stand-in answers like vLLM's routes do (a streamed completion, a 500 carrying the worker's error,
200 for calls that succeed) and can be told to hang a route, to fail streams or to die, so each of
the judge's outcomes (up, wrong, hangs, dies) is reached by a real HTTP exchange.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vllm_overlay.commands import serve_e2e
from vllm_overlay.e2e import rpc_faults


class _Fake:
    """What the stand-in does: routes that hang, whether the engine is dead, what was called."""

    def __init__(self) -> None:
        self.hang: set[str] = set()
        self.dead = False
        self.named = True  # failing calls carry the worker's error
        self.calls: list[str] = []


def _handler(fake: _Fake) -> type[BaseHTTPRequestHandler]:
    errors = {
        "discard": rpc_faults.DISCARD_ERROR,
        "profile": rpc_faults.PROFILE_ERROR,
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(503 if fake.dead else 200, "")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            path = self.path.split("?")[0]
            fake.calls.append(path)
            if path in fake.hang:
                time.sleep(5)
                return
            if fake.dead:
                self._send(500, '{"error": "EngineDeadError"}')
            elif path == "/v1/completions":
                self._completion(body)
            elif path == "/collective_rpc" and body["method"] == "check_health":
                self._send(200, '{"results": [null]}')
            elif path == "/collective_rpc":
                text = errors[body["method"]] if fake.named else "Internal Server Error"
                self._send(500, json.dumps({"error": {"message": text}}))
            elif path == "/v1/load_lora_adapter":
                rank = json.loads((Path(body["lora_path"]) / "adapter_config.json").read_text())["r"]
                text = f"LoRA rank {rank} is {rpc_faults.LORA_ERROR}." if fake.named else "error"
                self._send(500, json.dumps({"error": {"message": text}}))
            elif path == "/start_profile":
                self._send(404, '{"detail": "Not Found"}')
            else:
                self._send(200, "{}")

        def _completion(self, body: dict) -> None:
            if not body.get("stream"):
                self._send(200, json.dumps({"choices": [{"text": "x" * body["max_tokens"]}]}))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(body["max_tokens"]):
                finish = "length" if i == body["max_tokens"] - 1 else None
                event = {"choices": [{"text": "x", "finish_reason": finish}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                time.sleep(0.002)
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@pytest.fixture
def fake(monkeypatch):
    state = _Fake()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(rpc_faults, "CALL_TIMEOUT_S", 1.0)
    state.server = type("S", (), {"url": f"http://127.0.0.1:{httpd.server_address[1]}"})()
    yield state
    httpd.shutdown()


def test_the_adapter_is_above_the_servers_lora_rank(tmp_path):
    config = json.loads((rpc_faults.adapter(tmp_path / "a") / "adapter_config.json").read_text())
    assert config["r"] == rpc_faults.ADAPTER_RANK > rpc_faults.MAX_LORA_RANK
    assert config["peft_type"] == "LORA" and config["bias"] == "none"


def test_layout_specs_bind_one_core_per_rank_and_open_the_dev_routes(tmp_path):
    tp1 = rpc_faults.spec(tmp_path / "python", tmp_path, "pristine tp1", "tp1")
    pp2 = rpc_faults.spec(tmp_path / "python", tmp_path, "patched pp2", "pp2")
    tp2 = rpc_faults.spec(tmp_path / "python", tmp_path, "patched tp2", "tp2")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in tp1.env and tp1.tensor_parallel == 1
    assert pp2.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1" and pp2.tensor_parallel == 1
    assert pp2.extra_args[-2:] == ["--pipeline-parallel-size", "2"]
    assert tp2.tensor_parallel == 2 and "--pipeline-parallel-size" not in tp2.extra_args
    for spec in (tp1, pp2, tp2):
        assert spec.env["VLLM_SERVER_DEV_MODE"] == "1" and spec.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
        assert spec.extra_args[:3] == ["--enable-lora", "--max-lora-rank", str(rpc_faults.MAX_LORA_RANK)]


def test_a_server_that_answers_every_case_right_is_up_on_both_runtimes(fake, tmp_path):
    results = rpc_faults.layout_results(fake.server, "tp2", True, 2, 6, rpc_faults.adapter(tmp_path / "a"))
    assert [r.name for r in results][-2:] == ["tp2 burst-streaming x6", "tp2 burst-idle x6"]
    assert all(r.ok for r in results), [r.detail for r in results if not r.ok]
    assert all(r.data["state"] == "up" for r in results)
    profile = next(r for r in results if r.name == "tp2 profile-unconfigured")
    assert "/start_profile HTTP 404" in profile.detail and "1/1 failing call(s) named" in profile.detail
    assert "streams 0 completed" not in results[0].detail  # the calls were made while streams ran
    # The bursts cycle through the three failing calls.
    assert fake.calls.count("/v1/load_lora_adapter") == 1 + 2 + 2


def test_a_failing_call_without_its_workers_error_is_wrong_for_patched(fake, tmp_path):
    fake.named = False
    calls = rpc_faults.case_calls(rpc_faults.adapter(tmp_path / "a"))["collective-rpc-raises"]
    observed = rpc_faults.run_case(fake.server, calls, 1)
    assert observed.state == "wrong"
    ok, detail = rpc_faults.verdict("tp1", "collective-rpc-raises", True, observed)
    assert not ok and "0/1 failing call(s) named" in detail


def test_a_hung_call_with_health_200_is_a_hang_and_stops_the_layout(fake, tmp_path):
    fake.hang.add("/collective_rpc")
    results = rpc_faults.layout_results(fake.server, "tp2", True, 1, 4, rpc_faults.adapter(tmp_path / "a"))
    assert results[0].name == "tp2 collective-rpc-ok"
    assert results[0].data["state"] == "hangs" and not results[0].ok
    assert all(r.detail == "not reached: the engine hung at collective-rpc-ok" for r in results[1:])
    assert not any(r.ok for r in results[1:])  # patched: a case not reached is a failure


def test_pristine_is_recorded_never_failed_and_says_when_it_differs_from_the_record(fake, tmp_path, monkeypatch):
    fake.dead = True
    monkeypatch.setitem(rpc_faults.PRISTINE_KNOWN, ("tp1", "collective-rpc-ok"), "dies")
    results = rpc_faults.layout_results(fake.server, "tp1", False, 0, 3, rpc_faults.adapter(tmp_path / "a"))
    assert results[0].data["state"] == "dies" and results[0].ok
    assert "its known defect, as recorded (dies)" in results[0].detail
    assert all(r.ok and r.detail.startswith("not reached") for r in results[1:])
    monkeypatch.delitem(rpc_faults.PRISTINE_KNOWN, ("tp1", "collective-rpc-ok"))
    again = rpc_faults.verdict("tp1", "collective-rpc-ok", False, rpc_faults.run_case(fake.server, [], 0))
    assert again[0] and "recorded: up; differs" in again[1]


def test_the_cli_takes_known_layouts_only():
    assert serve_e2e._layouts("tp1, pp2") == "tp1,pp2"
    for bad in ("tp3", "tp1,tp1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            serve_e2e._layouts(bad)


def test_a_runtime_defect_listed_as_data_is_accepted_on_patched_only_with_its_traceback(fake, tmp_path, monkeypatch):
    """A death in a layout with a listed runtime defect passes on patched only when the server's log
    holds that defect's traceback; a hang, or a death without it, fails as ever."""
    signature = r"AssertionError[\s\S]*KeyError: 'cmpl-"
    monkeypatch.setitem(rpc_faults.RUNTIME_DEFECTS, "tp2", ("dies", "a listed defect", signature))
    monkeypatch.setattr(rpc_faults, "IDLE_FIRST", frozenset({"tp2"}))
    assert rpc_faults.case_order("tp2")[0] == "burst-idle" and rpc_faults.case_order("tp1") == rpc_faults.CASES
    adapter_dir = rpc_faults.adapter(tmp_path / "a")
    fake.server.log = tmp_path / "server.log"
    fake.server.log.write_text("INFO serving\n")
    up = rpc_faults.layout_results(fake.server, "tp2", True, 1, 3, adapter_dir)
    assert [r.name for r in up][:2] == ["tp2 burst-idle x3", "tp2 collective-rpc-ok"] and all(r.ok for r in up)
    fake.dead = True
    died = rpc_faults.layout_results(fake.server, "tp2", True, 1, 3, adapter_dir)
    assert not died[0].ok and not any(r.ok for r in died)  # no traceback of the defect: the series' failure
    fake.server.log.write_text("AssertionError\n...\nKeyError: 'cmpl-1-0'\n")
    died = rpc_faults.layout_results(fake.server, "tp2", True, 1, 3, adapter_dir)
    assert died[0].ok and "the runtime's own defect, as on pristine: a listed defect" in died[0].detail
    assert all(r.ok and "(the runtime's own defect: a listed defect)" in r.detail for r in died[1:])
    log = fake.server.log.read_text()
    hung = rpc_faults.Observed(answers=[("/x", 0, 1.0, False)], health_after=200)
    assert rpc_faults.verdict("tp2", "burst-idle", True, hung, log)[0] is False  # a hang is not the listed death
