"""Any OpenAI-compatible completions server (``cdscope eval --endpoint URL``).

vLLM's ``vllm serve``, SGLang, TGI and llama.cpp's server all answer ``GET URL/models``
and ``POST URL/completions`` (URL is the API base, e.g. ``http://127.0.0.1:8000/v1``).
The client is the standard library's ``urllib`` (no new dependency), one thread per
request in flight, at most ``concurrency`` at once.

- **Which model**: ``--served-model NAME``, else the server's only model; a name the
  server does not list, or a server with several models and no name, is one line.
- **Requests**: the body carries the standard fields only (``model``, ``prompt``, ``n``,
  ``max_tokens``, ``temperature``, ``top_p``, ``seed``); the prompt is raw text, as for
  the other engines. A problem's n samples go in one request, or in requests of
  ``n_per_request`` where a server caps n; a server that answers fewer choices than asked
  (llama.cpp's answers one) is asked again for the rest, each further request under
  ``base.part_seed(seed, part)``; no choices three times running is an error.
- **Failures**: 429 and 5xx answers, refused or reset connections and timeouts are
  retried ``retries`` times with exponential backoff (0.5 s doubling, at most 30 s,
  ``Retry-After`` honoured); then, and at once for any other 4xx (a refused parameter, an
  unknown model, a rejected key), one line naming the server's own message. At the
  start an unreachable server is one line, without retries.
- **Tokens**: per completion from the choice's ``token_ids`` or ``logprobs.tokens``
  where the server sends them, from ``usage.completion_tokens`` when the answer holds
  one choice, else unknown (None); the run's tokens/s uses ``usage`` throughout.
- **API key**: read from the environment variable the caller names (never a flag value),
  sent as ``Authorization: Bearer``.
- **Identity** (``--resume``): no weights to hash, so a served model is the name it is
  served under plus what the server reports about it (``root``, ``parent``: the path or
  hub id vLLM loaded); the URL is metadata, not identity (a restarted server on another
  port is the same model).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cdscope.core.engines.base import Generation, GenRequest, part_seed
from cdscope.errors import CdscopeError

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
NETWORK_ERRORS = (urllib.error.URLError, ConnectionError, http.client.HTTPException,
                  TimeoutError, socket.timeout)  # fmt: skip
BACKOFF_S, BACKOFF_MAX_S = 0.5, 30.0
MAX_EMPTY_ANSWERS = 3
#: what a served model's identity is made of (module doc); the rest is metadata
IDENTITY_FIELDS = ("id", "root", "parent")


class EndpointError(CdscopeError):
    """A server that answered with an error, was unreachable, or answered nonsense."""


def server_message(body: bytes) -> str:
    """The server's own words from an error body (OpenAI's ``error.message``, FastAPI's
    ``detail``, or the text), on one line."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return " ".join(text.split())[:300] or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            found = error.get("message") or error.get("detail") or error.get("msg")
            if found:
                return " ".join(str(found).split())[:300]
        elif isinstance(error, str):
            return " ".join(error.split())[:300]
    return " ".join(text.split())[:300]


def check_url(url: str) -> str:
    """``url`` without a trailing slash; one line unless it is http(s)://host[:port][/path]."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise CdscopeError(
            f"--endpoint takes the server's API base URL, like http://127.0.0.1:8000/v1; got {url!r}"
        )
    return url.rstrip("/")


@dataclass
class Client:
    """JSON over HTTP to one API base with retries (module doc)."""

    url: str
    api_key: str | None = None
    timeout: float = 600.0
    retries: int = 5
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self.url = check_url(self.url)

    def call(self, path: str, body: dict | None = None, retries: int | None = None) -> tuple:
        """(JSON answer, response headers) of GET (no body) or POST ``body`` to URL/path."""
        tries = self.retries if retries is None else retries
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        target = f"{self.url}/{path}"
        for attempt in range(tries + 1):
            request = urllib.request.Request(target, data=data, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                    return self._json(raw, target), dict(response.headers)
            except urllib.error.HTTPError as exc:
                message = server_message(exc.read())
                if exc.code in RETRY_STATUS and attempt < tries:
                    self.sleep(self._delay(attempt, exc.headers.get("Retry-After")))
                    continue
                raise self._http_error(exc.code, message, target, attempt) from None
            except NETWORK_ERRORS as exc:
                if attempt < tries:
                    self.sleep(self._delay(attempt, None))
                    continue
                reason = getattr(exc, "reason", None) or exc
                tried = f" after {attempt + 1} tries" if attempt else ""
                raise EndpointError(
                    f"cannot reach {target}{tried}: {type(reason).__name__}: {reason} "
                    "(is the server running? --resume continues from the problems finished)"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _json(raw: bytes, target: str) -> dict:
        try:
            answer = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EndpointError(
                f"{target} answered with something other than JSON: {raw[:120]!r}"
            ) from None
        if not isinstance(answer, dict):
            raise EndpointError(f"{target} answered {type(answer).__name__}, not a JSON object")
        return answer

    @staticmethod
    def _delay(attempt: int, retry_after: str | None) -> float:
        try:
            wanted = float(retry_after) if retry_after else 0.0
        except ValueError:
            wanted = 0.0
        return min(max(BACKOFF_S * 2**attempt, wanted), BACKOFF_MAX_S)

    def _http_error(self, code: int, message: str, target: str, attempt: int) -> EndpointError:
        if code in (401, 403):
            return EndpointError(
                f"{target} refused the request ({code}: {message}); check the API key"
            )
        if code in RETRY_STATUS:
            return EndpointError(
                f"{target} kept failing ({code}: {message}) after {attempt + 1} tries; "
                "--resume continues from the problems finished"
            )
        return EndpointError(f"{target} refused the request ({code}: {message})")


def served_model(client: Client, name: str | None) -> dict:
    """The ``/models`` entry of the model to evaluate: ``name``, else the only one."""
    answer, headers = client.call("models", retries=0)
    entries = answer.get("data")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise EndpointError(
            f"{client.url}/models did not list models (no data[].id): is it an OpenAI-compatible API base?"
        )
    ids = [str(e["id"]) for e in entries]
    if name is None:
        if len(ids) != 1:
            raise EndpointError(
                f"{client.url} serves {len(ids)} models ({', '.join(ids) or 'none'}); "
                "name one with --served-model"
            )
        name = ids[0]
    if name not in ids:
        raise EndpointError(
            f"--served-model {name!r} is not served by {client.url} (it serves: {', '.join(ids)})"
        )
    entry = dict(entries[ids.index(name)])
    for volatile in ("created", "permission"):
        entry.pop(volatile, None)
    server = (headers.get("server") or headers.get("Server") or "").strip()
    return entry | ({"server": server} if server else {})


def identity(entry: dict) -> str:
    """A served model's identity (module doc): a hash of its name and reported origin."""
    parts = {k: entry.get(k) for k in IDENTITY_FIELDS}
    return "served:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def choice_tokens(choice: dict, usage_tokens: int | None, count: int) -> int | None:
    """Generated tokens of one choice, where the answer tells (module doc)."""
    if isinstance(choice.get("token_ids"), list):
        return len(choice["token_ids"])
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
        return len(logprobs["tokens"])
    return usage_tokens if count == 1 else None


class EndpointEngine:
    """Completions of one served model (module doc)."""

    def __init__(
        self,
        client: Client,
        entry: dict,
        temperature: float,
        top_p: float,
        concurrency: int,
        n_per_request: int | None,
    ) -> None:
        self.client, self.entry, self.model = client, entry, str(entry["id"])
        self.temperature, self.top_p = temperature, top_p
        self.per_call, self.n_per_request = concurrency, n_per_request
        self._stop = threading.Event()

    def _one(self, request: GenRequest) -> Generation:
        texts: list[str] = []
        tokens: list[int | None] = []
        total, part, empty = 0, 0, 0
        while len(texts) < request.n:
            if self._stop.is_set():
                raise EndpointError("stopped: another request of this batch failed")
            want = min(request.n - len(texts), self.n_per_request or request.n)
            body = {
                "model": self.model, "prompt": request.prompt, "n": want,
                "max_tokens": request.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "seed": part_seed(request.seed, part),
            }  # fmt: skip
            answer, _ = self.client.call("completions", body)
            part += 1
            choices = answer.get("choices")
            if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
                raise EndpointError(
                    f"{self.client.url}/completions answered without a choices list"
                )
            choices = sorted(choices, key=lambda c: c.get("index", 0))[:want]
            usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
            used = usage.get("completion_tokens")
            used = used if isinstance(used, int) and used >= 0 else None
            if not choices:
                empty += 1
                if empty >= MAX_EMPTY_ANSWERS:
                    raise EndpointError(
                        f"{self.client.url} answered no choices {empty} times running for one "
                        f"prompt (asked n={want})"
                    )
                continue
            empty = 0
            counts = [choice_tokens(c, used, len(choices)) for c in choices]
            texts += [c.get("text") if isinstance(c.get("text"), str) else "" for c in choices]
            tokens += counts
            total += used if used is not None else sum(t for t in counts if t is not None)
        return Generation(texts, tokens, total)

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        self._stop.clear()
        with ThreadPoolExecutor(max_workers=max(1, min(self.per_call, len(requests)))) as pool:
            futures = [pool.submit(self._one, r) for r in requests]
            try:
                return [f.result() for f in futures]
            except BaseException:
                self._stop.set()
                for future in futures:
                    future.cancel()
                raise

    def describe(self) -> dict:
        return {"engine": "endpoint", "endpoint": self.client.url, "served_model": self.entry,
                "n_per_request": self.n_per_request, "concurrency": self.per_call}  # fmt: skip

    def close(self) -> None:
        return None
