"""The OpenAI-compatible client (``core/engines/endpoint.py``) against the in-process fake
server: retries and backoff, splitting n, fewer choices than asked, empty texts, token
counts, concurrency, and the one-line errors."""

from __future__ import annotations

import pytest

from cdscope.core.engines import GenRequest
from cdscope.core.engines.base import part_seed
from cdscope.core.engines.endpoint import (
    Client,
    EndpointEngine,
    EndpointError,
    identity,
    served_model,
    server_message,
)
from tests.fake_openai import Behaviour, FakeServer, answer_text

REQUESTS = [GenRequest(f"What is {i} + 1?", 3, 16, 1000 + i) for i in range(4)]


def engine(server: FakeServer, sleeps: list | None = None, **kw) -> EndpointEngine:
    client = Client(server.url, retries=kw.pop("retries", 3), sleep=[].append if sleeps is None else sleeps.append,
                    api_key=kw.pop("api_key", None), timeout=kw.pop("timeout", 30))  # fmt: skip
    entry = served_model(client, kw.pop("name", None))
    return EndpointEngine(client, entry, 0.6, 0.95, kw.pop("concurrency", 2), kw.pop("split", None))


def expected(request: GenRequest, per_request: int) -> list[str]:
    """What the fake answers when a problem's n is asked ``per_request`` at a time."""
    texts, part = [], 0
    while len(texts) < request.n:
        want = min(per_request, request.n - len(texts))
        texts += [
            answer_text(request.prompt, part_seed(request.seed, part), i) for i in range(want)
        ]
        part += 1
    return texts


def test_one_request_per_problem_carries_the_sampling_settings() -> None:
    with FakeServer() as server:
        out = engine(server).generate(REQUESTS)
    assert [g.texts for g in out] == [expected(r, 3) for r in REQUESTS]
    assert len(server.requests) == 4
    sent = {r["prompt"]: r for r in server.requests}
    for request in REQUESTS:
        body = sent[request.prompt]
        assert body == {"model": "fake", "prompt": request.prompt, "n": 3, "max_tokens": 16,
                        "temperature": 0.6, "top_p": 0.95, "seed": request.seed}  # fmt: skip
    # three choices, no per-choice counts: unknown per completion, the usage in total
    assert out[0].tokens == [None] * 3
    assert out[0].total_tokens == sum(len(t.split()) + 1 for t in out[0].texts)


def test_per_choice_token_ids_are_counted() -> None:
    with FakeServer(Behaviour(token_ids=True)) as server:
        out = engine(server).generate(REQUESTS[:1])
    assert out[0].tokens == [len(t.split()) + 1 for t in out[0].texts]


def test_a_capped_server_is_asked_again_under_further_seeds() -> None:
    """llama.cpp answers one choice whatever n is: the rest comes from more requests,
    each under part_seed(seed, part); one choice per answer gives exact token counts."""
    with FakeServer(Behaviour(max_choices=1)) as server:
        out = engine(server).generate(REQUESTS[:2])
    assert [g.texts for g in out] == [expected(r, 1) for r in REQUESTS[:2]]
    assert len(server.requests) == 6
    seeds = sorted(r["seed"] for r in server.requests if r["prompt"] == REQUESTS[0].prompt)
    assert seeds == sorted(part_seed(REQUESTS[0].seed, p) for p in range(3))
    assert len(set(seeds)) == 3 and REQUESTS[0].seed in seeds
    assert out[0].tokens == [len(t.split()) + 1 for t in out[0].texts]
    with FakeServer() as server:  # --n-per-request 2: 2 + 1
        out = engine(server, split=2).generate(REQUESTS[:1])
    assert [r["n"] for r in server.requests] == [2, 1]
    assert out[0].texts == expected(REQUESTS[0], 2)


def test_retries_back_off_and_honour_retry_after() -> None:
    sleeps: list[float] = []
    with FakeServer(Behaviour(fail_first=3, fail_status=503)) as server:
        out = engine(server, sleeps, concurrency=1).generate(REQUESTS[:1])
    assert out[0].texts == expected(REQUESTS[0], 3)
    assert sleeps == [0.5, 1.0, 2.0]
    sleeps.clear()
    with FakeServer(Behaviour(fail_first=1, fail_status=429, retry_after="7")) as server:
        engine(server, sleeps, concurrency=1).generate(REQUESTS[:1])
    assert sleeps == [7.0]
    kept_failing = r"kept failing \(500: overloaded\) after 4 tries"
    with (
        FakeServer(Behaviour(fail_first=10, fail_status=500)) as server,
        pytest.raises(EndpointError, match=kept_failing),
    ):
        engine(server, concurrency=1).generate(REQUESTS[:1])


def test_empty_texts_are_kept_as_empty_completions() -> None:
    with FakeServer(Behaviour(empty_every=2)) as server:
        out = engine(server).generate(REQUESTS[:1])
    assert out[0].texts[1] == "" and out[0].texts[0] and len(out[0].texts) == 3


def test_concurrency_is_bounded() -> None:
    with FakeServer(Behaviour(delay_s=0.2)) as server:
        engine(server, concurrency=2).generate(REQUESTS)
    assert server.max_in_flight == 2
    with FakeServer(Behaviour(delay_s=0.1)) as server:
        engine(server, concurrency=1).generate(REQUESTS)
    assert server.max_in_flight == 1


def test_which_model_and_its_identity() -> None:
    two = [{"id": "a", "root": "/m/a"}, {"id": "b", "root": "hub/b"}]
    with FakeServer(Behaviour(models=two)) as server:
        client = Client(server.url)
        with pytest.raises(
            EndpointError, match="serves 2 models .a, b.; name one with --served-model"
        ):
            served_model(client, None)
        with pytest.raises(EndpointError, match=r"'c' is not served by .* \(it serves: a, b\)"):
            served_model(client, "c")
        entry = served_model(client, "b")
    assert entry == {"id": "b", "root": "hub/b", "object": "model", "server": "fake/1.0"}
    assert identity(entry) == identity({**entry, "server": "other", "max_model_len": 9})
    assert identity(entry) != identity({**entry, "root": "hub/c"})


def test_failures_are_one_line_errors() -> None:
    refused = r"refused the request \(400: seed is not supported\)"
    with (
        FakeServer(Behaviour(refuse="seed")) as server,
        pytest.raises(EndpointError, match=refused),
    ):
        engine(server).generate(REQUESTS[:1])
    with FakeServer(Behaviour(api_key="s3cret")) as server:
        with pytest.raises(EndpointError, match="401: Invalid API key.*check the API key"):
            engine(server)
        assert engine(server, api_key="s3cret").generate(REQUESTS[:1])[0].texts
    with FakeServer(Behaviour(die_after=1)) as server:
        sleeps: list[float] = []
        eng = engine(server, sleeps, concurrency=1, retries=2)
        eng.generate(REQUESTS[:1])
        with pytest.raises(EndpointError, match=r"cannot reach .* after 3 tries.*--resume"):
            eng.generate(REQUESTS[1:2])
    with pytest.raises(EndpointError, match=r"cannot reach .*models: .*\(is the server running"):
        served_model(Client(server.url), None)  # gone: at the start, no retries
    with pytest.raises(Exception, match="API base URL"):
        Client("localhost:8000")


def test_server_messages_are_read_from_the_usual_shapes() -> None:
    assert server_message(b'{"error": {"message": "bad  n\\n value"}}') == "bad n value"
    assert server_message(b'{"detail": "Not Found"}') == "Not Found"
    assert server_message(b'{"error": "quota"}') == "quota"
    assert server_message(b"<html>502 Bad Gateway</html>") == "<html>502 Bad Gateway</html>"
    assert server_message(b"") == "(empty body)"
