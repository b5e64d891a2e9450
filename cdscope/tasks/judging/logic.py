"""Answer checks for the logic generators of the shipped sets (reasoning-gym).

Each check takes the reference answer, the extracted candidate answer and the task
prompt, and returns ``(passed, message)``. The comparisons are structural where the
answer has structure:

* ``knights_knaves`` -- the roles the answer states (``claims.roles``: "<Name> is a
  <role>", "is not a <role>", "<Name>: <role>", any case, one line or one name a line)
  must equal the reference's, in any order; a hedge (a name given two roles,
  ``knight/knave``, ``a knight (or knave)``, a condition) fails.
* ``syllogism`` -- Yes/No (``claims.polarity``: the first word, or "It does not follow",
  "The argument is valid"; the justification after "because" does not count); a hedge
  ("Yes or No", "yes/no", "Yes, if ...") fails.
* ``number_sorting`` -- the list of numbers (quoted or not) must equal the reference
  element by element, compared exactly as fractions ("34" equals "34.0").
* ``shortest_path`` -- "infeasible" or a sequence of up/down/left/right. Several paths
  can be shortest, so the candidate is replayed on the grid parsed from the prompt: it
  must stay on open cells, end on ``#`` and be as short as a breadth-first search says
  is possible. If the grid cannot be parsed (or BFS disagrees with the reference, which
  would mean the parse is wrong) the check falls back to an exact match.
* anything else (``logic``) -- normalised exact match (case, whitespace, quotes, a
  trailing period ignored; yes/no synonyms as for syllogisms).
"""

from __future__ import annotations

import re
from collections import deque
from fractions import Fraction

from cdscope.tasks.judging.answers import show
from cdscope.tasks.judging.claims import NO_WORDS, YES_WORDS, polarity, role_pair, roles
from cdscope.tasks.judging.numeric import MAX_DIGITS, has_long_digit_run

Check = tuple[bool, str]

MULTILINE_KINDS = frozenset({"logic:knights_knaves"})  # answers may give one name a line
MAX_LINES = 20  # of a multi-line answer read (each read again as lines are added)


def normalise(text: str) -> str:
    """Case-folded, whitespace-collapsed, without surrounding quotes or a trailing period."""
    text = text.casefold().strip().strip("\"'`*").strip()
    return " ".join(text.split()).rstrip(".").strip()


def check_exact(reference: str, candidate: str, prompt: str = "") -> Check:
    """Normalised exact match; Yes/No references compare by polarity (``claims``)."""
    if normalise(reference) in YES_WORDS | NO_WORDS:
        want, got = polarity(reference), polarity(candidate)
        if got == "hedge":
            return False, f"expected {reference}, got a hedge: {show(candidate)!r}"
        if got is None:
            return False, f"expected {reference}, got {show(candidate)!r}"
        return (got == want, "ok" if got == want else f"expected {reference}, got {got}")
    if normalise(reference) == normalise(candidate):
        return True, "ok"
    return False, f"expected {show(reference)!r}, got {show(candidate)!r}"


def check_syllogism(reference: str, candidate: str, prompt: str = "") -> Check:
    return check_exact(reference, candidate, prompt)


def check_knights_knaves(reference: str, candidate: str, prompt: str = "") -> Check:
    """The roles stated equal the reference's (``claims.roles``); ``candidate`` may hold
    one name a line: its first lines (at most ``MAX_LINES``) are read until every
    reference name has a role."""
    expected, _ = roles(reference)
    if not expected:
        return check_exact(reference, candidate, prompt)
    known = set(expected.values())
    pair = role_pair(prompt, known)
    known |= set(pair or ())
    lines = candidate.split("\n", MAX_LINES)[:MAX_LINES]
    got: dict[str, str] = {}
    hedge = None
    for count in range(1, len(lines) + 1):
        got, hedge = roles("\n".join(lines[:count]), known, pair)
        if hedge is not None or all(name in got for name in expected):
            break
    if hedge is not None:
        return False, f"a hedge: {hedge}"
    for name, role in expected.items():
        if name not in got:
            return False, f"no role stated for {name}"
        if got[name] != role:
            return False, f"expected {name} is a {role}, got {got[name]}"
    return True, "ok"


_DECIMAL = re.compile(r"[-+]?\d+(?:\.\d+)?")


def number_tokens(text: str) -> list[str] | None:
    """Every decimal number in ``text`` in order, as written; None when one has more than
    ``MAX_DIGITS`` digits (bounded work: a huge number is a wrong answer, not an error)."""
    if has_long_digit_run(text):
        return None
    return _DECIMAL.findall(text.replace("\u2212", "-"))


def numbers(text: str) -> list[Fraction] | None:
    """``number_tokens`` read exactly (None as there)."""
    tokens = number_tokens(text)
    return None if tokens is None else [Fraction(tok) for tok in tokens]


def check_number_sorting(reference: str, candidate: str, prompt: str = "") -> Check:
    expected, tokens = numbers(reference) or [], number_tokens(candidate)
    if tokens is None:
        return False, f"a number of over {MAX_DIGITS} digits"
    if len(tokens) != len(expected):  # counted before any is read: 50k numbers cost 0.6 s
        return False, f"expected {len(expected)} numbers, got {len(tokens)}"
    got = [Fraction(tok) for tok in tokens]
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        if want != have:
            return False, f"position {index + 1}: expected {_shown(want)}, got {_shown(have)}"
    return True, "ok"


def _shown(value: Fraction) -> str:
    """``value`` for a message: ``%g`` where a float holds it, else its first digits (a
    310-digit number overflows ``float`` and raised out of the reward step before)."""
    try:
        return f"{float(value):g}"
    except OverflowError:
        return show(str(value), 24)


_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def parse_grid(prompt: str) -> list[list[str]] | None:
    """The grid of a shortest-path prompt (rows of ``* # O X`` cells), or None."""
    marker = prompt.rfind("following grid:")
    if marker < 0:
        return None
    rows = []
    for line in prompt[marker:].split("\n")[1:]:
        cells = line.split()
        if not cells:
            if rows:
                break
            continue
        if any(cell not in ("*", "#", "O", "X") for cell in cells):
            break
        rows.append(cells)
    if not rows or len({len(r) for r in rows}) != 1:
        return None
    flat = [c for r in rows for c in r]
    if flat.count("*") != 1 or flat.count("#") != 1:
        return None
    return rows


def _find(grid: list[list[str]], mark: str) -> tuple[int, int]:
    return next((r, c) for r, row in enumerate(grid) for c, cell in enumerate(row) if cell == mark)


def shortest_distance(grid: list[list[str]]) -> int | None:
    """Breadth-first search from * to # through non-X cells; None when unreachable."""
    start, goal = _find(grid, "*"), _find(grid, "#")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return dist[cell]
        for dr, dc in _MOVES.values():
            r, c = cell[0] + dr, cell[1] + dc
            inside = 0 <= r < len(grid) and 0 <= c < len(grid[0])
            if inside and grid[r][c] != "X" and (r, c) not in dist:
                dist[(r, c)] = dist[cell] + 1
                queue.append((r, c))
    return None


def _moves(text: str) -> list[str] | None:
    tokens = re.findall(r"[a-z]+", text.casefold())
    return tokens if tokens and all(t in _MOVES for t in tokens) else None


def replay(grid: list[list[str]], moves: list[str]) -> str | None:
    """None when ``moves`` walk from * over open cells and end on #; else the reason."""
    r, c = _find(grid, "*")
    for step, move in enumerate(moves, start=1):
        dr, dc = _MOVES[move]
        r, c = r + dr, c + dc
        if not (0 <= r < len(grid) and 0 <= c < len(grid[0])):
            return f"step {step} ({move}) leaves the grid"
        if grid[r][c] == "X":
            return f"step {step} ({move}) enters a blocked cell"
    return None if grid[r][c] == "#" else "the path does not end on #"


def check_shortest_path(reference: str, candidate: str, prompt: str = "") -> Check:
    grid = parse_grid(prompt)
    ref_infeasible = normalise(reference) == "infeasible"
    distance = shortest_distance(grid) if grid is not None else None
    ref_moves = _moves(reference)
    consistent = grid is not None and (
        (ref_infeasible and distance is None)
        or (ref_moves is not None and distance == len(ref_moves))
    )
    if not consistent:
        return check_exact(reference, candidate, prompt)
    if normalise(candidate) == "infeasible":
        return (True, "ok") if ref_infeasible else (False, "said infeasible, but # is reachable")
    moves = _moves(candidate)
    if moves is None:
        return False, f"not a sequence of up/down/left/right: {show(candidate)!r}"
    if ref_infeasible:
        return False, "expected infeasible"
    problem = replay(grid, moves)  # type: ignore[arg-type]
    if problem is not None:
        return False, problem
    if len(moves) != distance:
        return False, f"path of {len(moves)} moves; the shortest has {distance}"
    return True, "ok"


LOGIC_CHECKS = {
    "logic": check_exact,
    "logic:knights_knaves": check_knights_knaves,
    "logic:syllogism": check_syllogism,
    "logic:number_sorting": check_number_sorting,
    "logic:shortest_path": check_shortest_path,
}
