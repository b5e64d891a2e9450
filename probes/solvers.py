"""Independent solvers for the reasoning-gym generators of the probe pools and task sets.

Each ``solve_<generator>(entry)`` takes a reasoning-gym entry (question, answer,
metadata), recomputes the answer from the structured metadata with its own algorithm
(exact arithmetic, brute force, model checking, BFS, exact sorting) and returns
``(worked solution ending "The answer is <answer>.", answer, stats)``; it raises
``Reject`` when it cannot confirm the generator's answer. Used by
``probes/build_pools.py`` (probe targets) and ``tasks/build_tasks.py`` (re-checking the
held-out train/eval items). Standard library only.
"""

from __future__ import annotations

import math
import re
from collections import deque
from fractions import Fraction
from typing import Any

ANSWER_PREFIX = "The answer is "


class Reject(Exception):
    """An entry that cannot be turned into a verified item (reason in args[0])."""


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
