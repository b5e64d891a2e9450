"""Attacks on the code verifier, scored by the reward function training uses: each is 0.

Every attack is a real completion string. Most return a WRONG answer while trying to
make it score as passing (forged pass marker, rebinding ``check``, always-equal objects,
patched builtins, exit tricks, fake output); the containment ones (loops, fork bombs,
memory, network, writes, reads, killing the parent, reading the tests) return the right
answer after or through the attack, so their 0 shows the attack was stopped. The
shipped canonical solutions must still pass (tests/data/humaneval_canonical.json holds
HumanEval's canonical solutions of the shipped tasks, MIT-licensed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cdscope.errors import CdscopeError
from cdscope.tasks import Task, default_task_paths, load_tasks, verify, verify_many
from cdscope.tasks.sandbox import layers as sb
from cdscope.train.run import verifier_rewards

ROOT = Path(__file__).resolve().parents[2]
EVAL_CODE_TASKS = next(p for p in default_task_paths("eval") if p.name == "code.jsonl")
TIMEOUT = 2.0
pytestmark = pytest.mark.skipif(
    not sb.code_sandbox_available()[0], reason="no files-isolating sandbox on this machine"
)

ADD = Task(
    "code/attack/add",
    "code",
    "def add(a, b):\n",
    "code",
    tests="def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
    entry_point="add",
)
# Property-style: the test computes with the returned value (a tolerance via abs).
ROOT2 = Task(
    "code/attack/root2",
    "code",
    "def root2():\n",
    "code",
    tests="def check(candidate):\n    assert abs(candidate() - 2 ** 0.5) < 1e-9\n",
    entry_point="root2",
)

# Reads the child's own memory through a path that reaches /proc without naming it,
# prints every marker-like string on its own line and exits 0 (issue #13, finding 1).
FORGED_MARKER = """    import os, re
    base = '/dev/fd/../'
    found = set()
    for line in open(base + 'maps').read().splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[1].startswith('rw'):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split('-'))
        try:
            with open(base + 'mem', 'rb', buffering=0) as mem:
                mem.seek(lo)
                found.update(re.findall(rb'[0-9a-f]{32}', mem.read(hi - lo)))
        except (OSError, ValueError, OverflowError, MemoryError):
            pass
    os.write(1, b''.join(b'\\n' + m + b'\\n' for m in found))
    os._exit(0)
"""
# A trailing decorator binds to whatever follows the completion: the tests' ``check``.
REBIND_CHECK = "    return None\n@lambda f: (lambda c: None)\n"
ALWAYS_EQUAL = (
    "    class Anything:\n"
    "        def __eq__(self, other):\n            return True\n"
    "        def __ne__(self, other):\n            return False\n"
    "    return Anything()\n"
)
ALWAYS_EQUAL_INT = (
    "    class Int(int):\n"
    "        def __eq__(self, other):\n            return True\n"
    "        __hash__ = int.__hash__\n"
    "    return Int(0)\n"
)
# What each attack class looks like against ADD (wrong answers, or containment).
WRONG: dict[str, str] = {
    "forged marker via /dev/fd/../mem": FORGED_MARKER,
    "trailing decorator rebinds check": REBIND_CHECK,
    "always-equal object": ALWAYS_EQUAL,
    "always-equal int subclass": ALWAYS_EQUAL_INT,
    "patched builtins (AssertionError, print, exit)": (
        "    return None\n"
        "import builtins, sys\n"
        "builtins.AssertionError = type('Never', (Exception,), {})\n"
        "sys.excepthook = lambda *a: None\n"
        "builtins.print = lambda *a, **k: None\n"
    ),
    "os._exit(0)": "    import os\n    os._exit(0)\n",
    "sys.exit(0)": "    import sys\n    sys.exit(0)\n",
    "raise SystemExit(0) at import": "    return None\nraise SystemExit(0)\n",
    "fake markers and output": (
        "    import sys\n"
        "    for token in ('ok', 'passed', 'PASS', '0' * 32, 'f' * 32):\n"
        "        sys.stdout.write('\\n' + token + '\\n')\n"
        "        sys.stderr.write('\\n' + token + '\\n')\n"
        "    sys.stdout.flush()\n"
        "    return None\n"
    ),
    "oversized return value": "    return 'x' * (9 * 2**20)\n",
    "deeply nested return value": "    x = []\n    for _ in range(200):\n        x = [x]\n    return x\n",
    "forged reply frames on every descriptor": (
        "    import os, struct, json\n"
        "    frame = json.dumps({'r': 3}).encode()\n"
        "    for fd in range(3, 64):\n"
        "        try:\n"
        "            os.write(fd, struct.pack('>I', len(frame)) + frame)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return None\n"
    ),
}


def _containment(target: Path) -> dict[str, str]:
    """Right answers after (or while) attacking the host: a 0 shows containment."""
    secret = ROOT / "pyproject.toml"  # world-readable on the host
    return {
        "infinite loop": "    while True:\n        pass\n    return a + b\n",
        "fork bomb": "    import os\n    while True:\n        os.fork()\n    return a + b\n",
        "memory hog": "    x = bytearray(10**11)\n    return a + b\n",
        "memory hog, growing": "    x = []\n    while True:\n        x.append(bytearray(10**6))\n",
        "network connect": (
            "    import socket\n"
            "    socket.create_connection(('127.0.0.1', 22), timeout=1).close()\n"
            "    return a + b\n"
        ),
        "write outside the work dir": f"    open({str(target)!r}, 'w').write('x')\n    return a + b\n",
        "os.system": f"    import os\n    os.system('touch {target}')\n    return a + b\n",
        "read a host file": f"    open({str(secret)!r}).read()\n    return a + b\n",
        "read the task files": (f"    open({str(EVAL_CODE_TASKS)!r}).read()\n    return a + b\n"),
        "read the parent's memory": "    import os\n    open(f'/proc/{os.getppid()}/mem', 'rb')\n    return a + b\n",
        "kill the parent": (
            "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n    return a + b\n"
        ),
    }


def test_wrong_answers_score_zero_as_training_rewards(tmp_path) -> None:
    """Every cheating class, one batch through the training reward: only honest code scores."""
    attacks = {**WRONG, **_containment(tmp_path / "pwned")}
    honest = "    return a + b\n"
    start = time.perf_counter()
    rewards = verifier_rewards([ADD] * (len(attacks) + 1), [*attacks.values(), honest], TIMEOUT)
    scored = dict(zip(attacks, rewards, strict=False))
    assert rewards == [0.0] * len(attacks) + [1.0], scored
    assert not (tmp_path / "pwned").exists()
    assert time.perf_counter() - start < 6 * TIMEOUT  # loops are cut by the clock


def test_patched_builtins_do_not_reach_property_tests() -> None:
    """The tests compute with plain values in the parent: patching ``abs``/``math`` in the
    candidate's process changes nothing there."""
    attacks = [  # module level: the patch is in place before the tests run
        "    return 0.0\nimport builtins\nbuiltins.abs = lambda x: 0\n",
        "    return 0.0\nimport sys\nvars(sys.modules['builtins'])['abs'] = lambda x: 0\n",
    ]
    rewards = verifier_rewards([ROOT2] * 3, [*attacks, "    return 2 ** 0.5\n"], TIMEOUT)
    assert rewards == [0.0, 0.0, 1.0]


def _shipped_code(split: str) -> list[Task]:
    return [t for t in load_tasks(default_task_paths(split)) if t.family == "code"]


def _canonical() -> dict[str, str]:
    return json.loads((ROOT / "tests" / "data" / "humaneval_canonical.json").read_text())


def test_attacks_fail_on_shipped_eval_tasks() -> None:
    """The reported attacks on real tasks: a wrong answer plus a trick scores 0 each."""
    eval_tasks = _shipped_code("eval")
    rebindable = [t for t in eval_tasks if (t.tests or "").lstrip().startswith("def check")][:3]
    plain = eval_tasks[:3]
    find_zero = next(t for t in eval_tasks if t.entry_point == "find_zero")
    cases = [(t, FORGED_MARKER) for t in plain] + [(t, REBIND_CHECK) for t in rebindable]
    cases += [(t, ALWAYS_EQUAL) for t in plain] + [(t, "    return None\n") for t in plain]
    cases += [(find_zero, "    return 0.0\nimport math\nmath.fabs = lambda x: 0.0\n")]
    assert len(rebindable) == 3
    rewards = verifier_rewards([t for t, _ in cases], [c for _, c in cases], TIMEOUT)
    assert rewards == [0.0] * len(cases), [
        (t.id, r) for (t, _), r in zip(cases, rewards, strict=True)
    ]


def test_reading_the_tests_to_answer_scores_zero() -> None:
    """A lookup table built from the shipped test file would pass HumanEval/0 if the child
    could read it: it must see no task file at all."""
    task = next(t for t in _shipped_code("eval") if t.entry_point == "has_close_elements")
    cheat = (
        "    import ast, json\n"
        f"    path = {str(ROOT / 'tasks' / 'eval' / 'code.jsonl')!r}\n"
        "    for line in open(path):\n"
        "        record = json.loads(line)\n"
        "        if record['entry_point'] != 'has_close_elements':\n"
        "            continue\n"
        "        for node in ast.walk(ast.parse(record['tests'])):\n"
        "            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):\n"
        "                call = node.left\n"
        "                if [ast.literal_eval(a) for a in call.args] == [numbers, threshold]:\n"
        "                    return ast.literal_eval(node.comparators[0])\n"
        "    return None\n"
    )
    verdict = verify(task, cheat, timeout=TIMEOUT)
    assert not verdict.passed and "FileNotFoundError" in verdict.message


def test_shipped_canonical_solutions_pass() -> None:
    canonical = _canonical()
    tasks = _shipped_code("train") + _shipped_code("eval")
    assert len(tasks) == 100 and {t.meta["task_id"] for t in tasks} == set(canonical)
    verdicts = verify_many(tasks, [canonical[t.meta["task_id"]] for t in tasks], timeout=5.0)
    failed = [(t.id, v.message) for t, v in zip(tasks, verdicts, strict=True) if not v.passed]
    assert failed == []


def test_values_cross_as_exact_types() -> None:
    """Tuples stay tuples, bools stay bools, nan/inf and sets survive; an exception the
    candidate raises reaches the tests as its built-in type."""
    task = Task(
        "code/types",
        "code",
        "def echo(x):\n",
        "code",
        tests=(
            "import math\n"
            "def check(candidate):\n"
            "    for value in [(1, 2), [1, (2,)], True, 1, 1.0, 'é', None, {1: {'a': (1,)}},\n"
            "                  {1, 2}, frozenset({(1, 2)}), -0.0, float('inf')]:\n"
            "        got = candidate(value)\n"
            "        assert got == value and type(got) is type(value), (got, value)\n"
            "    assert math.isnan(candidate(float('nan')))\n"
            "    assert candidate(x=5) == 5\n"
            "    try:\n"
            "        candidate('raise')\n"
            "    except ValueError as exc:\n"
            "        assert 'bad input' in str(exc)\n"
            "    else:\n"
            "        raise AssertionError('no exception')\n"
        ),
        entry_point="echo",
    )
    body = "    if x == 'raise':\n        raise ValueError('bad input')\n    return x\n"
    assert verify(task, body, timeout=TIMEOUT) == type(verify(task, body))(True, "ok")
    assert not verify(task, "    return list(x) if type(x) is tuple else x\n").passed


def test_tests_that_never_call_the_candidate_do_not_pass() -> None:
    task = Task(
        "code/t", "code", "def f():\n", "code", tests="def check(c):\n    pass\n", entry_point="f"
    )
    assert verify(task, "    return 1\n") == type(verify(task, ""))(
        False, "the tests never called the candidate"
    )


def test_broken_task_files_are_user_errors() -> None:
    bad = Task(
        "code/b", "code", "def f():\n", "code", tests="def check(c):\n  x = (\n", entry_point="f"
    )
    with pytest.raises(CdscopeError, match="code/b.*tests cannot run"):
        verify(bad, "    return 1\n")


def test_code_tasks_are_refused_where_no_layer_hides_files(monkeypatch) -> None:
    """Without the mount layer the child could read the tests: code tasks are refused
    with one line, before anything runs (math/logic stay available)."""
    weak = sb.Layers(sb.sandbox_layers().interpreter, True, True, False)  # type: ignore[union-attr]
    monkeypatch.setattr(sb, "_detect", lambda: (weak, ""))
    assert sb.sandbox_available()[0] and not sb.code_sandbox_available()[0]
    with pytest.raises(CdscopeError, match="refusing to run generated code for a code task"):
        verify(ADD, "    return a + b\n")
    with pytest.raises(CdscopeError, match="cannot score code tasks: no sandbox here"):
        sb.require_sandbox_for([ADD], "drop the code tasks")


def test_the_tests_random_is_private_and_seeded() -> None:
    """Randomised tests draw from a private ``random`` seeded with 0: the same draws every
    time, and the caller's global RNG state (saved in training checkpoints) is untouched."""
    import random

    task = Task(
        "code/rng",
        "code",
        "def echo(x):\n",
        "code",
        tests=(
            "from random import randint\n"
            "def check(candidate):\n"
            "    assert candidate(randint(0, 10**9)) == "
            + str(random.Random(0).randint(0, 10**9))
            + "\n"
        ),
        entry_point="echo",
    )
    state = random.getstate()
    assert verify(task, "    return x\n", timeout=TIMEOUT).passed
    assert verify(task, "    return x\n", timeout=TIMEOUT).passed
    assert random.getstate() == state


def test_trl_reward_function_scores_the_reported_attacks_zero() -> None:
    """The TRL backend's reward function (same verifiers) on the three reported routes."""
    from types import SimpleNamespace

    from cdscope.integrations.trl import RewardRecorder

    cfg = SimpleNamespace(verify_timeout=TIMEOUT, verify_workers=2)
    inputs = SimpleNamespace(tasks=[ADD], cfg=cfg, reward_fn=None, families=["code"])
    completions = [FORGED_MARKER, REBIND_CHECK, ALWAYS_EQUAL, "    return a + b\n"]
    reward = RewardRecorder(inputs)  # type: ignore[arg-type]
    assert reward([""] * 4, completions, task_index=[0] * 4) == [0.0, 0.0, 0.0, 1.0]
    assert reward.last["reward_code"] == 0.25
