"""Held-out pass@k of a model: what ``cdscope eval`` and in-training evaluation share (SPEC §7).

One problem at a time: ``n`` completions drawn with ``core.generation.sample`` under a seed
that depends on (run seed, problem id) alone (``problem_seed``), each verified by its
task's verifier (``score_completions``: code only inside the sandbox; an empty completion
fails without running a verifier), one row per sample (``problem_samples``). The rows feed
``analysis.passk.summarize`` (the unbiased estimator and its benchmark / domain / overall
means). ``select`` picks the first ``limit`` problems of every benchmark in file order.

Because a problem's samples depend only on its own seed and the model, the same settings
give the same samples whether a problem is evaluated by ``cdscope eval`` on a saved model
or during training on the model in memory (``train.evidence``) at the same weights.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from torch import nn

from cdscope.errors import CdscopeError
from cdscope.settings import EvalSettings
from cdscope.tasks.contamination import benchmark_of

#: (task, prompt, max_new_tokens, seed) -> (completions, generated token counts)
Generator = Callable[[object, str, int, int], tuple[list[str], list[int]]]


def problem_seed(seed: int, problem_id: str) -> int:
    """The generation seed of one problem: a function of (run seed, problem id) only."""
    digest = hashlib.sha256(problem_id.encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return int(np.random.SeedSequence([seed, *words]).generate_state(1, dtype=np.uint64)[0] >> 1)


def select(tasks: Sequence, limit: int | None) -> list[tuple[object, str]]:
    """(task, benchmark) for the first ``limit`` tasks of each benchmark, in file order."""
    if limit is not None and limit < 1:
        raise CdscopeError(f"--limit must be >= 1, got {limit}")
    taken: dict[str, int] = {}
    out = []
    for task in tasks:
        bench = benchmark_of(task.id, task.family, task.meta)
        if limit is None or taken.get(bench, 0) < limit:
            taken[bench] = taken.get(bench, 0) + 1
            out.append((task, bench))
    return out


def hf_generator(model: nn.Module, tokenizer: object, settings: EvalSettings) -> Generator:
    """(task, prompt, max_new_tokens, seed) -> ``settings.n`` completions and their token
    counts, through ``model.generate`` (``core.generation.sample``)."""
    from cdscope.core.generation import sample

    def generate(_task: object, prompt: str, max_new: int, seed: int):  # noqa: ANN202
        r = sample(
            model,
            tokenizer,
            [prompt],
            num_samples=settings.n,
            max_new_tokens=max_new,
            temperature=settings.temperature,
            seed=seed,
            batch_size=settings.batch_size,
            top_p=settings.top_p,
        )
        return r.texts, r.completion_mask.sum(dim=1).tolist()

    return generate


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


def problem_samples(
    model_name: str, task: object, bench: str, generate: Generator, settings: EvalSettings
) -> tuple[pd.DataFrame, dict[str, float]]:
    """The ``n`` verified samples of one problem as rows (``cdscope eval``'s samples
    columns), and what they cost: ``generate_s``, ``verify_s``, ``tokens``, ``empty``."""
    t0 = time.perf_counter()
    texts, counts = generate(
        task,
        task.prompt,  # type: ignore[attr-defined]
        settings.tokens_for(task.family),  # type: ignore[attr-defined]
        problem_seed(settings.seed, task.id),  # type: ignore[attr-defined]
    )
    t1 = time.perf_counter()
    verdicts = score_completions([task] * len(texts), texts, settings)
    cost = {
        "generate_s": t1 - t0,
        "verify_s": time.perf_counter() - t1,
        "tokens": int(sum(counts)),
        "empty": sum(not t.strip() for t in texts),
    }
    frame = pd.DataFrame(
        dict(
            model=model_name,
            benchmark=bench,
            domain=task.family,  # type: ignore[attr-defined]
            problem_id=task.id,  # type: ignore[attr-defined]
            sample=np.arange(len(texts)),
            completion=texts,
            passed=[v[0] for v in verdicts],
            message=[v[1] for v in verdicts],
            generated_tokens=np.asarray(counts, dtype=np.int64),
        )
    )
    return frame, cost
