"""What the verifier tests share: the four routes a completion's reward takes, run side by
side (issue #38) -- ``verify`` one by one, ``verify_many``, the hf loop's
``train.run.verifier_rewards`` and the TRL backend's ``integrations.trl.RewardRecorder``;
tests of "a verdict for every completion" go through all four, since a fix in one route
is not a fix in the others --, the shipped tasks of a kind, a small code task and a
candidate that forges its own reply frames."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from cdscope.resources import default_task_dir
from cdscope.tasks import Task, default_task_paths, load_tasks, verify, verify_many
from cdscope.tasks.judging import Verdict


def shipped(kind: str, *, curriculum: bool = False) -> list[Task]:
    """Every shipped train+eval task of verifier ``kind`` (or of the curriculum)."""
    if curriculum:
        root = default_task_dir() / "curriculum"
        paths = sorted(Path(root).glob("*/*.jsonl"))
    else:
        paths = [*default_task_paths("train"), *default_task_paths("eval")]
    return [t for t in load_tasks(paths) if t.verifier == kind]


def rewards_by_route(
    tasks: Sequence[Task], completions: Sequence[str], *, timeout: float = 5.0, workers: int = 2
) -> dict[str, list[float]]:
    """``{route: rewards}`` for the four routes (each raises if its route raises)."""
    from cdscope.integrations.trl import RewardRecorder
    from cdscope.train.run import verifier_rewards

    one_by_one = [verify(t, c, timeout=timeout) for t, c in zip(tasks, completions, strict=True)]
    many = verify_many(tasks, completions, timeout=timeout, workers=workers)
    cfg = SimpleNamespace(verify_timeout=timeout, verify_workers=workers)
    families = sorted({t.family for t in tasks})
    inputs = SimpleNamespace(tasks=list(tasks), cfg=cfg, reward_fn=None, families=families)
    trl = RewardRecorder(inputs)(  # type: ignore[arg-type]
        [""] * len(tasks), list(completions), task_index=list(range(len(tasks)))
    )
    return {
        "verify": [reward(v) for v in one_by_one],
        "verify_many": [reward(v) for v in many],
        "verifier_rewards": verifier_rewards(tasks, completions, timeout, workers),
        "trl": trl,
    }


def reward(verdict: Verdict) -> float:
    return 1.0 if verdict.passed else 0.0


ADD = Task(
    "code/add",
    "code",
    "def add(a, b):\n",
    "code",
    tests="def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n",
    entry_point="add",
)


GRID = "Now, find the shortest path from * to # in the following grid:\n* O\nO #\nSolution:\n"
KNIGHTS = (
    'You meet 2 inhabitants: Jack, and Abigail. (Format your answer like: "Jack is a '
    'knight/knave, and Abigail is a knight/knave")\nSolution:\n'
)
# one task of every answer kind: exact, fraction form, symbolic, text, and each logic check
ANSWER_TASKS = [
    Task("p/int", "math", "q", "math", answer="12"),
    Task("p/frac", "math", "Simplify the fraction 6/8 to its lowest terms.", "math", answer="3/4"),
    Task("p/root", "math", "Simplify $\\sqrt{8}$.", "math", answer="2\\sqrt{2}"),
    Task("p/text", "math", "q", "math", answer="Yes"),
    Task("p/logic", "logic", "q", "logic", answer="B"),
    Task(
        "p/kk",
        "logic",
        KNIGHTS,
        "logic:knights_knaves",
        answer="Jack is a knight, and Abigail is a knave",
    ),
    Task("p/syl", "logic", "q", "logic:syllogism", answer="No"),
    Task("p/sort", "logic", "q", "logic:number_sorting", answer="['-1', '2.5', '7']"),
    Task("p/path", "logic", GRID, "logic:shortest_path", answer="right down"),
]


def forged_replies(build: str, times: int = 1) -> str:
    """A candidate body that writes its own reply frame ``times`` over on every descriptor
    the parent could read, then sleeps: ``build`` is indented code that sets ``body``
    (the frame's JSON bytes), with ``os``, ``struct``, ``json`` imported."""
    return (
        "    import os, struct, json, time\n"
        + build
        + "    frame = struct.pack('>I', len(body)) + body\n"
        + f"    for k in range({times}):\n"
        + "        for fd in range(3, 64):\n"
        + "            try:\n"
        + "                os.write(fd, frame)\n"
        + "            except OSError:\n"
        + "                pass\n"
        + "    time.sleep(60)\n"
    )
