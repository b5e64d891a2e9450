"""A small OpenAI-compatible completions server for tests (standard library only).

It listens on 127.0.0.1 at a free port, in a thread, and answers ``GET /v1/models`` and
``POST /v1/completions`` like vLLM's server, with behaviours a test switches on: the
first requests failing with a status (429 / 503, with ``Retry-After``), a cap on the
choices per answer (llama.cpp answers one), empty texts, an API key it requires, a
parameter it refuses, a delay per request (to see concurrency), and dying after a number
of completions (the server that disappears mid-run). Every completion request is
recorded. A choice's text is a function of (prompt, seed, choice index) only, so two
servers with the same name answer alike: what ``--resume`` across a restart relies on.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer_text(prompt: str, seed: int, index: int) -> str:
    """The fake model: 'The answer is N.' with N drawn from (prompt, seed, index)."""
    rng = random.Random(f"{prompt}|{seed}|{index}")
    return f" The answer is {rng.randint(0, 9)}."


@dataclass
class Behaviour:
    models: list[dict] = field(default_factory=lambda: [{"id": "fake", "root": "/models/fake"}])
    fail_first: int = 0  # this many completion requests answer fail_status
    fail_status: int = 503
    retry_after: str | None = None
    max_choices: int | None = None  # a cap on choices per answer
    empty_every: int = 0  # every k-th choice (1-based) has empty text
    api_key: str | None = None
    refuse: str | None = None  # a body field answered with 400
    delay_s: float = 0.0
    die_after: int | None = None  # completions answered before the server stops
    token_ids: bool = False  # send per-choice token_ids (as vLLM can)


class FakeServer:
    """``with FakeServer(Behaviour(...)) as server: server.url`` (the API base)."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop answering and close the socket (connections are then refused)."""
        if self.thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version, sys_version = "fake/1.0", ""

            def log_message(self, *args: object) -> None:  # quiet
                return None

            def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                key = server.behaviour.api_key
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    self._send(401, {"error": {"message": "Invalid API key"}})
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if not self._authorised():
                    return
                if self.path.rstrip("/") == "/v1/models":
                    data = [{"object": "model", "created": time.time(), **m}
                            for m in server.behaviour.models]  # fmt: skip
                    self._send(200, {"object": "list", "data": data})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorised():
                    return
                if self.path.rstrip("/") != "/v1/completions":
                    self._send(404, {"detail": "Not Found"})
                    return
                with server.lock:
                    server.requests.append(body)
                    count = len(server.requests)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:  # in flight while the answer is made, not while it travels back
                    answer = self._complete(body, count)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                if answer is None:
                    threading.Thread(target=server.stop, daemon=True).start()
                    self.close_connection = True
                    return  # no answer: the connection drops
                self._send(*answer)

            def _complete(self, body: dict, count: int) -> tuple | None:
                """(status, body, headers) of the answer; None: die without one."""
                b = server.behaviour
                if b.delay_s:
                    time.sleep(b.delay_s)
                if b.die_after is not None and count > b.die_after:
                    return None
                if count <= b.fail_first:
                    headers = {"Retry-After": b.retry_after} if b.retry_after else {}
                    return b.fail_status, {"error": {"message": "overloaded"}}, headers
                if b.refuse and b.refuse in body:
                    return 400, {"error": {"message": f"{b.refuse} is not supported"}}, {}
                known = [m["id"] for m in b.models]
                if body.get("model") not in known:
                    message = f"model {body.get('model')} does not exist"
                    return 404, {"error": {"message": message}}, {}
                n = int(body.get("n", 1))
                given = min(n, b.max_choices) if b.max_choices else n
                choices, tokens = [], 0
                for i in range(given):
                    text = answer_text(body["prompt"], int(body.get("seed", 0)), i)
                    if b.empty_every and (i + 1) % b.empty_every == 0:
                        text = ""
                    used = len(text.split()) + 1  # + the end-of-sequence token
                    tokens += used
                    choice = {"index": i, "text": text, "finish_reason": "stop"}
                    if b.token_ids:
                        choice["token_ids"] = list(range(used))
                    choices.append(choice)
                usage = {"prompt_tokens": 5, "completion_tokens": tokens}
                answer = {"object": "text_completion", "model": body["model"],
                          "choices": choices, "usage": usage}  # fmt: skip
                return 200, answer, {}

        return Handler
