"""Final answers in free text, and exact numeric comparison (SPEC §5 reward, §7 pass@k).

``find_final_answer`` takes the completion's *last* ``\\boxed{...}`` (nested braces
allowed); without one, the text after the last "answer is" up to the end of its line
(trailing period dropped); otherwise there is no answer. ``parse_number`` reads ints,
decimals, fractions ``a/b`` and ``\\frac{a}{b}``, thousands separators (``1,234``),
signs, currency and trailing units, into an exact ``fractions.Fraction``; anything with a
second number in it (``12 or 13``) is not a number. No floating point is involved, so
``0.1 + 0.2``-style noise cannot make a wrong answer pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"answer\s+is\b\s*:?", re.IGNORECASE)


@dataclass(frozen=True)
class FinalAnswer:
    """The extracted answer text and where its statement ends in the completion."""

    text: str
    end: int  # index just past the line (or closing brace) holding the answer
    how: str  # "boxed" | "answer is"


def _boxed_content(text: str, open_brace: int) -> tuple[str, int] | None:
    """Content of the brace group opening at ``open_brace`` and the index past it."""
    depth = 0
    for index in range(open_brace, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : index], index + 1
    return None  # unbalanced: the box never closes


def clean_answer(text: str) -> str:
    """Strip markdown emphasis, math delimiters, quotes and a trailing period."""
    text = text.strip()
    for _ in range(3):
        before = text
        text = text.strip().strip("*_`").strip()
        if text.startswith("$") and text.endswith("$") and len(text) > 1:
            text = text.strip("$").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if text.startswith(left) and text.endswith(right):
                text = text[len(left) : -len(right)].strip()
        text = text.rstrip(".").rstrip()
        if text == before:
            break
    return text


def find_final_answer(completion: str) -> FinalAnswer | None:
    """The last boxed answer, else the last "answer is X" line, else None."""
    boxed = None
    for match in _BOXED.finditer(completion):
        found = _boxed_content(completion, match.end() - 1)
        if found is not None:
            boxed = found
    if boxed is not None:
        return FinalAnswer(clean_answer(boxed[0]), boxed[1], "boxed")
    matches = list(_ANSWER_IS.finditer(completion))
    if not matches:
        return None
    start = matches[-1].end()
    newline = completion.find("\n", start)
    end = len(completion) if newline < 0 else newline
    text = clean_answer(completion[start:end])
    if not text:
        return None
    return FinalAnswer(text, end, "answer is")


_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}")
_NUMBER = re.compile(
    r"^(?P<sign>[-+]?)\s*(?P<int>\d{1,3}(?:,\d{3})+|\d+)?(?:\.(?P<dec>\d+))?"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?"
)
_LEADING_NAME = re.compile(r"^[A-Za-z]\w*\s*=\s*")


def parse_number(text: str) -> Fraction | None:
    """An exact number written in ``text``, or None when it is not exactly one number."""
    s = clean_answer(text)
    s = _TEXT.sub(r" \1", s)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = s.replace("\u2212", "-").replace("\\$", "").replace("$", "").replace("\\%", "%")
    s = s.replace("\\,", "").replace("\\!", "").replace("\\ ", " ")
    s = re.sub(r"\((\s*[-+]?\d+(?:\.\d+)?\s*)\)", r"\1", s)  # (3)/(4) -> 3/4
    s = re.sub(r"[€£¥]", "", s).strip()
    s = _LEADING_NAME.sub("", s)  # "x = 5"
    match = _NUMBER.match(s)
    if match is None or (match.group("int") is None and match.group("dec") is None):
        return None
    rest = s[match.end() :]
    if re.search(r"\d", rest):
        return None  # a second number: "12 or 13", "3 1/2", "10^3"
    integer = (match.group("int") or "0").replace(",", "")
    value = Fraction(integer + ("." + match.group("dec") if match.group("dec") else ""))
    if match.group("den") is not None:
        den = Fraction(match.group("den"))
        if den == 0:
            return None
        value /= den
    return -value if match.group("sign") == "-" else value


def is_reduced_fraction_text(text: str) -> bool | None:
    """For ``a/b`` text: whether it is in lowest terms; None when it is not an a/b."""
    match = re.fullmatch(r"\s*[-+]?\s*(\d+)\s*/\s*(\d+)\s*", clean_answer(text))
    if match is None:
        return None
    num, den = int(match.group(1)), int(match.group(2))
    return den != 0 and Fraction(num, den).denominator == den


def show(text: str, limit: int = 60) -> str:
    """A completion fragment short enough for a one-line verdict message."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
