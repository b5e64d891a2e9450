"""Build the learnable curriculum's sets (tasks/curriculum.py's generators) for tasks/build_tasks.py.

For each split (train seed 4000, eval seed 5000) and generator: the first
``CURRICULUM_PER_GENERATOR`` draws of the generator's seeded stream whose normalised
prompt is new -- not a probe prompt, not an example the prompt shows, not a train prompt
(eval), not a repeat. Each kept task must pass its verifier with its reference answer
and fail with the empty completion and with near misses (an answer off by one; code:
``curriculum.near_misses``). Output: ``curriculum/{train,eval}/{math,code,logic}.jsonl``
and the curriculum's entry of cdscope/data/tasks/MANIFEST.json.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from curriculum import GENERATORS, Generator, near_misses

from cdscope.tasks import Task, verify_many
from cdscope.tasks.io import SPLITS, dumps_tasks

#: folder under cdscope/data/tasks, seeds and tasks per generator of each split
CURRICULUM_DIR = "curriculum"
CURRICULUM_SEEDS = {"train": 4000, "eval": 5000}
CURRICULUM_PER_GENERATOR = {"train": 32, "eval": 12}
CURRICULUM_MAX_DRAWS = 10_000
CODE_TIMEOUT_S = 10.0


def reference_completion(task: Task, answer: str) -> str:
    """What a correct reply looks like: 'The answer is X.' (code: ' <expression>')."""
    return f" {answer}\n" if task.family == "code" else f"The answer is {answer}."


def curriculum_misses(task: Task) -> list[str]:
    """Near-miss answers of a curriculum task: code ``near_misses``; a number off by one."""
    reference = task.meta["reference"]
    if task.family == "code":
        return near_misses(reference)
    numbers = reference.split(", ")
    return [", ".join([*numbers[:-1], str(int(numbers[-1]) + 1)])]


def build_generator(
    gen: Generator, split: str, taken: set[str], normalise_prompt: Callable[[str], str]
) -> tuple[list[Task], dict]:
    """The first ``CURRICULUM_PER_GENERATOR[split]`` draws of ``gen``'s seeded stream whose
    normalised prompt is new (not a probe, not an example shown in the prompt, not a
    train prompt for eval, not repeated). Every kept task passes its verifier with its
    reference and fails with the empty completion (a code stub returning None) and with
    near misses (an answer off by one; code: ``curriculum.near_misses``)."""
    seed = CURRICULUM_SEEDS[split]
    rng = random.Random(f"{gen.family}/{gen.name}:{seed}")  # str seeds: no PYTHONHASHSEED
    seen = set(taken) | {normalise_prompt(gen.prompt(q)) for q, _ in gen.shots}
    tasks: list[Task] = []
    skipped = 0
    draw = -1
    while len(tasks) < CURRICULUM_PER_GENERATOR[split]:
        draw += 1
        if draw >= CURRICULUM_MAX_DRAWS:
            raise SystemExit(f"{gen.name} {split}: only {len(tasks)} distinct tasks")
        item = gen.make(rng)
        prompt = gen.prompt(item.question)
        if normalise_prompt(prompt) in seen:
            skipped += 1
            continue
        seen.add(normalise_prompt(prompt))
        tasks.append(
            Task(
                id=f"{gen.family}/{gen.name}/{split}/{draw}",
                family=gen.family,
                prompt=prompt,
                verifier=gen.verifier,
                answer=None if gen.family == "code" else item.answer,
                tests=item.tests,
                entry_point=item.entry_point,
                source=f"cdscope-curriculum:{gen.name}:seed={seed}:draw={draw}",
                meta={"generator": gen.name, "seed": seed, "index": draw, "reference": item.answer},
            )
        )
    good = [reference_completion(t, t.meta["reference"]) for t in tasks]
    wrong = [(t, "") for t in tasks] + [
        (t, reference_completion(t, miss)) for t in tasks for miss in curriculum_misses(t)
    ]
    verdicts = verify_many(tasks, good, timeout=CODE_TIMEOUT_S)
    for task, verdict in zip(tasks, verdicts, strict=True):
        if not verdict.passed:
            raise SystemExit(f"{task.id}: the verifier rejects the reference ({verdict.message})")
    bad = verify_many([t for t, _ in wrong], [c for _, c in wrong], timeout=CODE_TIMEOUT_S)
    for (task, completion), verdict in zip(wrong, bad, strict=True):
        if verdict.passed:
            raise SystemExit(f"{task.id}: the verifier accepts the wrong {completion!r}")
    summary = {
        "name": gen.name,
        "verifier": gen.verifier,
        "seed": seed,
        "draws": draw + 1,
        "kept": len(tasks),
        "skipped_repeats": skipped,
        "examples": [list(shot) for shot in gen.shots],
    }
    return tasks, summary


def build_curriculum(
    probes: set[str], normalise_prompt: Callable[[str], str]
) -> tuple[dict[str, bytes], dict]:
    """``curriculum/{train,eval}/{math,code,logic}.jsonl`` and their MANIFEST entry."""
    files: dict[str, bytes] = {}
    splits: dict[str, dict] = {split: {} for split in SPLITS}
    train_prompts: set[str] = set()
    for split in SPLITS:
        taken = probes | (train_prompts if split == "eval" else set())
        for family in ("math", "code", "logic"):
            tasks, summaries = [], []
            for gen in (g for g in GENERATORS if g.family == family):
                kept, summary = build_generator(gen, split, taken, normalise_prompt)
                tasks += kept
                summaries.append(summary)
            if split == "train":
                train_prompts |= {normalise_prompt(t.prompt) for t in tasks}
            name = f"{CURRICULUM_DIR}/{split}/{family}.jsonl"
            files[name] = dumps_tasks(tasks).encode("utf-8")
            splits[split][family] = {
                "file": name,
                "sha256": hashlib.sha256(files[name]).hexdigest(),
                "n_tasks": len(tasks),
                "generators": summaries,
            }
    manifest = {
        "built_by": "tasks/build_tasks.py from tasks/curriculum.py",
        "purpose": "a learnable curriculum for small models (SmolLM2-135M starts at a nonzero "
        "but improvable pass@1; docs/tasks.md): CDSCOPE_TASKS=<this folder> or --tasks",
        "prompt_format": "math, logic: ChatML, two solved examples, then the question "
        "(reply 'The answer is <answer>.'); code: two solved functions, then a stub ending "
        "in 'return' (the completion is the returned expression)",
        "seeds": CURRICULUM_SEEDS,
        "per_generator": CURRICULUM_PER_GENERATOR,
        "overlap_rule": "within a generator no two tasks, and no task and an example shown in "
        "the prompt, share a normalised prompt; no eval prompt equals a train or probe prompt",
        "verification": "every task passes its verifier with its reference answer "
        "('The answer is <answer>.'; code: ' <expression>') and fails with the empty "
        "completion",
        "splits": splits,
    }
    return files, manifest
