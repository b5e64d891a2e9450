"""The verifier corpus on every shipped task: false negatives, false positives, verdicts/s.

For each shipped train+eval task, ``cdscope.tasks.judging.cases`` writes the reference in
at least ten formats (must pass) and wrong, hedged, copy-the-prompt and answer-less
completions (must fail); code tasks use HumanEval's canonical solution
(``tests/data/humaneval_canonical.json``) in eleven formats, among them a chat-style
fenced program with imports, a helper and demo code. Every case goes through
``verify_many`` (code in the real sandbox, ``--workers`` at a time).

Prints, per family: cases, false negatives (right answers scored 0), false positives
(wrong answers scored 1), wall seconds, verdicts/s, the slowest verdict
(``Verdict.seconds``) and how many verdicts took longer than their deadline + 1 s (none
expected: the deadline bounds the whole verdict, docs/tasks.md); then the mistakes by
label (none expected).

    PYTHONPATH=. python benchmarks/bench_verifiers.py [--workers 2] [--timeout 5]
        [--families math,logic,code]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from cdscope.tasks import default_task_paths, load_tasks, verify_many
from cdscope.tasks.judging import Case, cases

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "tests" / "data" / "humaneval_canonical.json"


def corpus(family: str) -> list[Case]:
    paths = [p for s in ("train", "eval") for p in default_task_paths(s) if p.stem == family]
    tasks = load_tasks(paths)
    if family == "code":
        canonical = json.loads(CANONICAL.read_text(encoding="utf-8"))
        return [c for t in tasks for c in cases(t, canonical[t.meta["task_id"]])]
    return [c for t in tasks for c in cases(t)]


def score(
    family: str, workers: int, timeout: float
) -> tuple[int, Counter, Counter, float, list[float]]:
    table = corpus(family)
    start = time.perf_counter()
    verdicts = verify_many(
        [c.task for c in table], [c.completion for c in table], workers=workers, timeout=timeout
    )
    seconds = time.perf_counter() - start
    negatives, positives = Counter(), Counter()
    for case, verdict in zip(table, verdicts, strict=True):
        if case.should_pass and not verdict.passed:
            negatives[case.label] += 1
        elif not case.should_pass and verdict.passed:
            positives[case.label] += 1
    return len(table), negatives, positives, seconds, [v.seconds for v in verdicts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--families", default="math,logic,code")
    args = parser.parse_args()
    print(
        f"{'family':8} {'cases':>6} {'FN':>4} {'FP':>4} {'seconds':>8} {'verdicts/s':>11} "
        f"{'slowest s':>10} {'over deadline+1s':>17}"
    )
    mistakes: list[str] = []
    totals = [0, 0, 0, 0]
    for family in args.families.split(","):
        n, negatives, positives, seconds, each = score(family, args.workers, args.timeout)
        fn, fp = sum(negatives.values()), sum(positives.values())
        over = sum(s > args.timeout + 1.0 for s in each)
        totals = [totals[0] + n, totals[1] + fn, totals[2] + fp, totals[3] + over]
        print(
            f"{family:8} {n:6d} {fn:4d} {fp:4d} {seconds:8.2f} {n / seconds:11.1f} "
            f"{max(each):10.3f} {over:17d}"
        )
        mistakes += [f"  FN {family} {label}: {k}" for label, k in negatives.most_common()]
        mistakes += [f"  FP {family} {label}: {k}" for label, k in positives.most_common()]
    print(
        f"{'all':8} {totals[0]:6d} {totals[1]:4d} {totals[2]:4d} {'':8} {'':11} {'':10} {totals[3]:17d}"
    )
    print("mistakes by label:" if mistakes else "no mistakes")
    for line in mistakes:
        print(line)


if __name__ == "__main__":
    main()
