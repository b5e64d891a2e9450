"""Held-out pass@k samples: what ``cdscope eval`` and in-training evaluation share (SPEC §7).

A problem is asked of an engine (``core.engines``: transformers, vLLM, a server) as one
``GenRequest``: ``n`` completions of its prompt under a seed that depends on (run seed,
problem id) alone (``problem_seed``), at most its domain's token cap (``gen_request``).
Each completion is verified by its task's verifier (``score_completions``: code only
inside the sandbox; an empty completion fails without running a verifier) and becomes one
row (``sample_rows``). The rows feed ``analysis.passk.summarize`` (the unbiased estimator
and its benchmark / domain / overall means). ``select`` picks the first ``limit`` problems
of every benchmark in file order; ``sample_problems`` runs a list of them through one
engine, ``engine.per_call`` requests at a time.

Because a problem's samples depend only on its own seed and the model, the same settings
give the same samples whether ``cdscope eval`` runs on a saved model or the training loop
evaluates the model in memory (``train.evidence``) at the same weights (tested).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from cdscope.core.engines import Engine, Generation, GenRequest
from cdscope.errors import CdscopeError, option
from cdscope.settings import EvalSettings
from cdscope.tasks.io import benchmark_of


def problem_seed(seed: int, problem_id: str) -> int:
    """The generation seed of one problem: a function of (run seed, problem id) only."""
    digest = hashlib.sha256(problem_id.encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return int(np.random.SeedSequence([seed, *words]).generate_state(1, dtype=np.uint64)[0] >> 1)


def select(
    tasks: Sequence, limit: int | None, sources: Mapping[str, str] | None = None
) -> list[tuple[object, str]]:
    """(task, benchmark) for the first ``limit`` tasks of each benchmark, in file order;
    ``sources``: task id -> the name of its file (``benchmark_of``)."""
    if limit is not None and limit < 1:
        raise CdscopeError(f"{option('limit')} must be >= 1, got {limit}")
    sources = sources or {}
    taken: dict[str, int] = {}
    out = []
    for task in tasks:
        bench = benchmark_of(task.id, task.family, task.meta, sources.get(task.id))
        if limit is None or taken.get(bench, 0) < limit:
            taken[bench] = taken.get(bench, 0) + 1
            out.append((task, bench))
    return out


def gen_request(task: object, settings: EvalSettings) -> GenRequest:
    """What an engine is asked for one problem: ``settings.n`` completions of its prompt
    under the problem's own seed, at most its domain's token cap."""
    return GenRequest(
        task.prompt,  # type: ignore[attr-defined]
        settings.n,
        settings.tokens_for(task.family),  # type: ignore[attr-defined]
        problem_seed(settings.seed, task.id),  # type: ignore[attr-defined]
    )


def score_completions(
    tasks: Sequence, texts: Sequence[str], settings: EvalSettings
) -> list[tuple[bool, str]]:
    """(passed, message) per completion: its task's verifier, or "empty completion"."""
    from cdscope.tasks import verify_many

    todo = [i for i, t in enumerate(texts) if t.strip()]
    verdicts = verify_many(
        [tasks[i] for i in todo],
        [texts[i] for i in todo],
        timeout=settings.timeout,
        workers=settings.workers,
    )
    out = [(False, "empty completion")] * len(texts)
    for i, v in zip(todo, verdicts, strict=True):
        out[i] = (bool(v.passed), v.message)
    return out


def sample_rows(
    model_name: str,
    task: object,
    bench: str,
    generation: Generation,
    verdicts: Sequence[tuple[bool, str]],
) -> pd.DataFrame:
    """One problem's verified completions as rows (``cdscope eval``'s samples columns)."""
    texts = generation.texts
    return pd.DataFrame(
        dict(
            model=model_name,
            benchmark=bench,
            domain=task.family,  # type: ignore[attr-defined]
            problem_id=task.id,  # type: ignore[attr-defined]
            sample=np.arange(len(texts)),
            completion=texts,
            passed=[v[0] for v in verdicts],
            message=[v[1] for v in verdicts],
            generated_tokens=pd.array(generation.tokens, dtype="Int64"),
        )
    )


def sample_problems(
    model_name: str, engine: Engine, chosen: Sequence[tuple[object, str]], settings: EvalSettings
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Every ``(task, benchmark)`` of ``chosen`` through ``engine``: the samples' rows and
    their cost (``generate_s``, ``verify_s``, ``tokens``)."""
    frames, cost = [], {"generate_s": 0.0, "verify_s": 0.0, "tokens": 0}
    for lo in range(0, len(chosen), engine.per_call):
        chunk = chosen[lo : lo + engine.per_call]
        began = time.perf_counter()
        generations = engine.generate([gen_request(task, settings) for task, _ in chunk])
        cost["generate_s"] += time.perf_counter() - began
        for (task, bench), generation in zip(chunk, generations, strict=True):
            began = time.perf_counter()
            verdicts = score_completions([task] * len(generation.texts), generation.texts, settings)
            cost["verify_s"] += time.perf_counter() - began
            cost["tokens"] += int(generation.total_tokens)
            frames.append(sample_rows(model_name, task, bench, generation, verdicts))
    return pd.concat(frames, ignore_index=True), cost
