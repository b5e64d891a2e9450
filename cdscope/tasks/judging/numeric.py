"""Exact numbers in answer text, and how they are written (SPEC §5 reward, §7 pass@k).

``read_number`` reads one number into an exact ``fractions.Fraction`` and remembers its
spelling, which the form rule of "simplify" tasks needs:

* integers and decimals, with thousands separators (``1,234``, ``1{,}234``, ``1\\,234``),
  a sign (also ``−``), currency signs, degrees (``90^\\circ``, ``90°``), parentheses
  around the whole (``\\left(\\frac{3}{4}\\right)``), trailing units or words (``12
  apples``, ``5 \\text{cm}``, ``%``), and the last side of an equation (``x = 5``,
  ``880/1594 = 440/797``: the sides that are numbers must agree, and a side holding
  ``,``, ``;``, "or", "and" or "either" is no equation but a list or a hedge);
* fractions in every spelling: ``a/b``, ``(a)/(b)``, ``\\frac{a}{b}``, ``\\dfrac``,
  ``\\tfrac``, ``\\cfrac``, ``\\frac12``, ``a \\over b``, ``-\\frac{a}{b}``, ``a/b exactly``;
* scientific notation: ``1.5e3``, ``1.5 \\times 10^{3}``, ``1.5 \\cdot 10^3``, ``1.5×10³``
  written with ``^``, ``1.5*10**3``.

Text holding a second number (``12 or 13``, ``3 1/2``, ``7 - 4 + 2``) is not *a* number,
nor is a number followed by more mathematics (``tail_problem``): a LaTeX command
(``2\\pi``, ``\\frac{1}{2}\\pi``), an operator (``3+\\pi``, ``5!``, ``x^``), a variable
glued on or after it (``4x``, ``5i``, ``2 x``), or a word that says an operation, a
number or a doubt (``42 minus one``, ``42 or so``). A reference like ``2\\pi`` was read as
its leading 2 before, so ``\\boxed{2}`` passed for 2π.
No floats: ``0.1000000001`` is not ``0.1``. Every read is bounded: a digit run longer than
``MAX_DIGITS`` -- counted with its thousands separators and LaTeX spacing removed, as
they are when it is read -- or an exponent beyond ``MAX_EXPONENT`` is not a number (a
5,000-digit answer is a wrong answer, never an exception), and the work is linear in
the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from math import gcd

from cdscope.tasks.judging.answers import clean_answer

MAX_DIGITS = 1000  # a longer digit run is not a number
MAX_EXPONENT = 1000  # |e| in 10^e
MAX_TEXT = 20_000  # characters of answer text read at all

_NUM = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_SCIENTIFIC = re.compile(
    rf"(?P<sign>[-+]?)\s*(?P<m>{_NUM})(?:[eE](?P<e1>[-+]?\d{{1,6}})|\s*(?:\\times|\\cdot|×|·|\*)"
    r"\s*10\s*(?:\^|\*\*)\s*\{?\s*(?P<e2>[-+]?\d{1,6})\s*\}?)"
)
_FRACTION = re.compile(
    rf"(?P<sign>[-+]?)\s*\(?\s*(?P<ns>[-+]?)\s*(?P<n>{_NUM})\s*\)?\s*/\s*\(?\s*(?P<ds>[-+]?)"
    rf"\s*(?P<d>{_NUM})\s*\)?"
)
_PLAIN = re.compile(rf"(?P<sign>[-+]?)\s*(?P<n>{_NUM})")
_LATEX_FRAC = re.compile(r"\\[dtc]?frac\s*(?:\{([^{}]*)\}|(\d))\s*(?:\{([^{}]*)\}|(\d))")
_OVER = re.compile(r"^\{?\s*([^{}]*?)\s*\\over\s*([^{}]*?)\s*\}?$")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox|textit|mathit|operatorname)\s*\{([^{}]*)\}")
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SPACES = ("\\,", "\\!", "\\;", "\\:", "\\ ", "~", "\\left", "\\right", "\\qquad", "\\quad")
_DEGREES = ("^{\\circ}", "^\\circ", "\\circ", "\\degree", "°")
_RELATIONS = ("<", ">", "!=", "==", "≠", "≤", "≥", "≈")  # no equation chain with these
_NOT_AN_EQUATION = re.compile(r"[,;]|\b(?:or|and|either)\b", re.IGNORECASE)
_OPERATORS = frozenset("\\+-*/^=×÷·√π∞±<>!")
_BETWEEN_LETTERS = re.compile(r"(?<=[A-Za-z])[-/](?=[A-Za-z])")  # km/h, one-way
_WORD = re.compile(r"[A-Za-z]+")
_NOT_A_UNIT_WORDS = (  # operation, number and doubt words: 42 minus one, 42 or so
    "plus minus times divided over multiplied add added subtract subtracted less more squared "
    "cubed root power sqrt pi or either maybe perhaps zero one two three four five six seven "
    "eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen "
    "nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion trillion half halves third thirds quarter quarters"
)
_NOT_A_UNIT = frozenset(_NOT_A_UNIT_WORDS.split())
_VARIABLES = frozenset("xyznike")  # a lone letter after a number: 2 x, 5 i
_GLUED_VARIABLES = frozenset("abcdeijknpqrtuvwxyz")  # glued on: 4x, 5i, 2e (not 5m, 3s)
_DIGIT_RUN = re.compile(r"\d+")
_SIMPLIFY = re.compile(
    r"simplif|lowest terms|simplest form|reduced form|reduce the fraction|irreducible",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Number:
    """An exact value and its spelling: ``kind`` is integer | decimal | fraction |
    scientific; ``parts`` the written numerator and denominator of a fraction when both
    are integers (None otherwise)."""

    value: Fraction
    kind: str
    parts: tuple[int, int] | None = None

    @property
    def in_lowest_terms(self) -> bool:
        """A fraction written with integer parts sharing no factor (``1/1`` included)."""
        if self.kind != "fraction" or self.parts is None:
            return False
        num, den = self.parts
        return den != 0 and gcd(num, den) == 1


def normalise_number_text(text: str) -> str:
    """The answer text with LaTeX fractions as ``(a)/(b)``, wrappers and spacing removed,
    and every run of whitespace one space (so the patterns below, whose ``\\s*`` meet on
    either side of optional tokens, cannot backtrack over 19,000 spaces: 4-18 s a verdict
    before)."""
    s = clean_answer(text)
    for degree in _DEGREES:
        s = s.replace(degree, "")
    s = _TEXT.sub(r" \1", s).translate(_SUPERSCRIPTS)
    s = s.replace("{,}", ",").replace("\u2212", "-").replace("\u2013", "-")
    for space in _SPACES:
        s = s.replace(space, "" if space in ("\\,", "\\!", "\\left", "\\right") else " ")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "%").replace("\\cdotp", ".")
    s = _LATEX_FRAC.sub(lambda m: f"({m.group(1) or m.group(2)})/({m.group(3) or m.group(4)})", s)
    s = " ".join(s.split())  # one space at most: every \s* below then matches 0 or 1
    over = _OVER.match(s)
    if over is not None:
        s = f"({over.group(1)})/({over.group(2)})"
    return " ".join(re.sub(r"[€£¥₹]", "", s).split())


def has_long_digit_run(text: str) -> bool:
    """Whether ``text`` holds a run of more than ``MAX_DIGITS`` digits (one linear scan)."""
    return any(m.end() - m.start() > MAX_DIGITS for m in _DIGIT_RUN.finditer(text))


def has_long_number(text: str) -> bool:
    """Whether ``text`` states a number of more than ``MAX_DIGITS`` digits, thousands
    separators (``1,000``, ``1{,}000``, ``1\\,000``) and LaTeX spacing not counted as
    breaks: ``read_number`` reads no such number."""
    if len(text) > MAX_TEXT:
        return has_long_digit_run(text)
    return has_long_digit_run(normalise_number_text(text).replace(",", ""))


def _decimal(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def _integer_parts(num: str, den: str) -> tuple[int, int] | None:
    if "." in num or "." in den:
        return None
    return int(num.replace(",", "")), int(den.replace(",", ""))


def read_number(text: str) -> Number | None:
    """The exact number ``text`` states, with its spelling; None when it is not exactly
    one number (module docstring)."""
    if len(text) > MAX_TEXT or has_long_digit_run(text):
        return None
    s = normalise_number_text(text)
    if has_long_digit_run(s.replace(",", "")):  # 1,000,...: 1{,}000: 1\,000 joined
        return None
    *earlier, last = _sides(s)
    number = _one_number(last)
    if number is None:
        return None
    for side in earlier:  # "880/1594 = 440/797" agrees; "42 = 43" states two numbers
        other = _one_number(side)
        if other is not None and other.value != number.value:
            return None
    return number


def _sides(s: str) -> list[str]:
    """The sides of an equation chain ``a = b = c`` (``[s]`` when it is none)."""
    if "=" not in s or any(r in s for r in _RELATIONS):
        return [s]
    sides = s.split("=")
    if not sides[-1].strip() or any(_NOT_AN_EQUATION.search(p) for p in sides[:-1]):
        return [s]
    return sides


def _one_number(s: str) -> Number | None:
    s = _without_outer_parens(s.strip())
    number, end = _match(s)
    return None if number is None or tail_problem(s[end:]) else number


def _without_outer_parens(s: str) -> str:
    """``s`` without parentheses that wrap all of it (``((3)/(4))`` -> ``(3)/(4)``)."""
    while s.startswith("(") and s.endswith(")") and _closing(s) == len(s) - 1:
        s = s[1:-1].strip()
    return s


def _closing(s: str) -> int:
    """The index of the ``)`` that closes ``s``'s first ``(`` (-1 when none does)."""
    depth = 0
    for index, char in enumerate(s):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return index
    return -1


def tail_problem(rest: str) -> bool:
    """Whether the text after a number makes the whole more than one number (module
    docstring): a digit, a LaTeX command or operator, a variable, or an operation, number
    or doubt word. Units and plain words (``12 apples``, ``5 cm``, ``60 km/h``) are fine."""
    if not rest.strip():
        return False
    if any(c.isdigit() for c in rest):
        return True
    if any(c in _OPERATORS for c in _BETWEEN_LETTERS.sub("", rest)):
        return True
    if rest[0].isalpha():  # glued on: 4x, 5i
        glued = _WORD.match(rest)
        if glued is not None and glued.group().casefold() in _GLUED_VARIABLES:
            return True
    words = [w.casefold() for w in _WORD.findall(rest)]
    return any(w in _NOT_A_UNIT or w in _VARIABLES for w in words)


def _match(s: str) -> tuple[Number | None, int]:
    match = _SCIENTIFIC.match(s)
    if match is not None:
        exponent = int(match.group("e1") or match.group("e2"))
        if abs(exponent) > MAX_EXPONENT:
            return None, 0
        value = _decimal(match.group("m")) * Fraction(10) ** exponent
        return Number(-value if match.group("sign") == "-" else value, "scientific"), match.end()
    match = _FRACTION.match(s)
    if match is not None:
        num, den = _decimal(match.group("n")), _decimal(match.group("d"))
        if den == 0:
            return None, 0
        negative = [match.group(g) == "-" for g in ("sign", "ns", "ds")].count(True) % 2 == 1
        value = num / den
        parts = _integer_parts(match.group("n"), match.group("d"))
        return Number(-value if negative else value, "fraction", parts), match.end()
    match = _PLAIN.match(s)
    if match is not None:
        text = match.group("n")
        value = _decimal(text)
        kind = "decimal" if "." in text else "integer"
        return Number(-value if match.group("sign") == "-" else value, kind), match.end()
    return None, 0


def parse_number(text: str) -> Fraction | None:
    """The exact value of ``read_number`` (None when ``text`` is not exactly one number)."""
    number = read_number(text)
    return None if number is None else number.value


def asks_to_simplify(prompt: str) -> bool:
    """Whether a task's prompt asks for a reduced fraction ("simplify", "lowest terms")."""
    return _SIMPLIFY.search(prompt) is not None


def form_problem(reference: Number, candidate: Number, prompt: str) -> str | None:
    """Why ``candidate`` (equal in value to ``reference``) breaks the task's form rule:
    where the reference is a fraction in lowest terms, a candidate written as a fraction,
    in any spelling, must be in lowest terms too; where the prompt also asks to simplify,
    it must be written as such a fraction (or an integer when the value is one). None
    when the form is fine."""
    if not reference.in_lowest_terms:
        return None
    if candidate.kind == "fraction" and not candidate.in_lowest_terms:
        return "not in lowest terms"
    if asks_to_simplify(prompt) and candidate.kind not in ("fraction", "integer"):
        return "not a fraction in lowest terms"
    return None
