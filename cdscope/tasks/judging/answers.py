"""Final answers in free text: where a completion states its answer (SPEC §5 reward, §7 pass@k).

``find_final_answer`` reads the formats models write, in this order of precedence:

1. **Boxed** -- the completion's *last* ``\\boxed{...}`` or ``\\fbox{...}`` whose braces
   close (nested braces allowed; ``\\{`` and ``\\}`` are literal braces, not groups) and
   that holds an answer: an empty box or one holding only a mark (``\\checkmark``,
   ``\\blacksquare``, ``QED``, ...) after it is no answer and is skipped. Two *different*
   boxes on that box's line are a hedge (``\\boxed{12} or \\boxed{13}``).
2. **An answer statement** -- the last of ``Answer:``, ``Final answer:``, ``The (final)
   answer is``, ``**Answer:**`` (any case, bold allowed around the marker), a heading line
   holding only "Answer" or "Final Answer" (``**Final Answer**``, ``## Final Answer``) and
   the GSM8K ``#### N``: the rest of its line, or the next non-empty line when the rest is
   empty (``FinalAnswer.block`` also holds the lines that follow, up to a blank line: one
   name per line).
   When that text starts with a math span (``$...$``, ``\\(...\\)``, ``\\[...\\]``) only
   the span is taken (Minerva's "The final answer is $42$. I hope it is correct.").
3. Otherwise there is no final answer.

"Last" rather than "first": a completion that rambles on into a new question and answers
that one is scored on what it said last. The answer text is cleaned by ``clean_answer``:
markdown bold/italics/code, surrounding ``$``/``\\(\\)``/``\\[\\]``, a wrapping
``\\text{}``/``\\textbf{}``/``\\mathrm{}``/``\\mathbf{}``/``\\mbox{}``, a brace group
around the whole (``\\boxed{{r}}``) and trailing punctuation (``. , ;``; not ``!``, a
factorial) are removed.

Every step is linear in the completion's length: braces are matched in one pass with a
stack (56k characters of unclosed ``\\boxed{`` cost one scan, not one scan per box), and
no regular expression here backtracks over a run of one character class more than once
(tested at 100k characters of every hostile shape, ``tests/tasks/test_deadlines.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
# a heading line of its own ("**Final Answer**", "## Answer:"); possessive runs: its
# [ \t]* meet around optional tokens and would backtrack over a line of spaces
_HEADING = (
    r"^[ \t]*+(?:\#{1,6}[ \t]*+)?(?:\*\*|__)?[ \t]*+(?:final[ \t]++)?answer[ \t]*+:?[ \t]*+"
    r"(?:\*\*|__)?[ \t]*+:?[ \t]*+$"
)
_MARKER = re.compile(
    rf"(?:{_HEADING}|\b(?:final\s+)?answer\b(?:\s*(?:\*\*|__))?\s*(?:is\b\s*:?|:)|####)",
    re.IGNORECASE | re.MULTILINE,
)
_MARKS = frozenset(
    ["\\checkmark", "\\blacksquare", "\\square", "\\Box", "\\qed", "QED", "Q.E.D", "∎", "✓", "✔"]
)  # what a box may hold that is no answer (a proof's end, a tick)
MAX_BLOCK_LINES = 20
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_HOPE = "i hope it is correct"  # Minerva's closing sentence, any case
_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|mbox|textit|mathit)\s*\{")
_TRAILING = ".,;"  # not "!": a factorial


@dataclass(frozen=True)
class FinalAnswer:
    """The extracted answer text and where its statement ends in the completion."""

    text: str
    end: int  # index just past the line (or closing brace) holding the answer
    how: str  # "boxed" | "answer is"
    hedged: bool = False  # two different answers in the final statement
    block: str = ""  # a statement's text and the lines after it, up to a blank line

    def __post_init__(self) -> None:
        if not self.block:
            object.__setattr__(self, "block", self.text)


def matching_braces(text: str) -> dict[int, int]:
    """``{index of "{": index of its "}"}`` for every group that closes, in one pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for token in _BRACE_TOKEN.finditer(text):
        char = token.group()
        if char == "{":
            stack.append(token.start())
        elif char == "}" and stack:
            pairs[stack.pop()] = token.start()
    return pairs


def _unwrap(text: str) -> str:
    """``\\text{X}`` (and friends) wrapping the whole of ``text`` -> ``X``."""
    match = _WRAPPER.match(text)
    if match is None:
        return text
    close = matching_braces(text).get(match.end() - 1)
    return text[match.end() : close].strip() if close == len(text) - 1 else text


def clean_answer(text: str) -> str:
    """Strip markdown emphasis, math delimiters, wrapping ``\\text{}``, quotes' neighbours
    and trailing punctuation (a bounded number of rounds: linear time)."""
    text = text.strip()
    for _ in range(4):
        before = text
        text = text.strip().strip("*_`").strip()
        if text.startswith("$") and text.endswith("$") and len(text) > 1:
            text = text.strip("$").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if text.startswith(left) and text.endswith(right):
                text = text[len(left) : -len(right)].strip()
        text = _unwrap(text)
        if text.startswith("{") and matching_braces(text).get(0) == len(text) - 1:
            text = text[1:-1].strip()  # \boxed{{r}}
        text = text.rstrip(_TRAILING).rstrip()
        if text == before:
            break
    return text


def _boxed(completion: str) -> FinalAnswer | None:
    opens = list(_BOX.finditer(completion))
    if not opens:
        return None
    pairs = matching_braces(completion)
    closed = [
        (m, pairs[m.end() - 1], clean_answer(completion[m.end() : pairs[m.end() - 1]]))
        for m in opens
        if m.end() - 1 in pairs
    ]
    answers = [(m, close, text) for m, close, text in closed if text and text not in _MARKS]
    if not answers:
        return None
    last, close, text = answers[-1]
    line_start = completion.rfind("\n", 0, last.start()) + 1
    line_end = completion.find("\n", close)
    line_end = len(completion) if line_end < 0 else line_end
    same_line = {t for m, c, t in answers if line_start <= m.start() and c < line_end}
    return FinalAnswer(text, close + 1, "boxed", hedged=len(same_line) > 1)


def _statement(completion: str) -> FinalAnswer | None:
    last = None
    for last in _MARKER.finditer(completion):  # noqa: B007 -- the last one is wanted
        pass
    if last is None:
        return None
    start = last.end()
    newline = completion.find("\n", start)
    end = len(completion) if newline < 0 else newline
    text = completion[start:end]
    if not text.strip(" \t*_:"):  # "Answer:\n42" -- the next non-empty line
        rest = completion[end:]
        stripped = rest.lstrip()
        if not stripped:
            return None
        start = end + (len(rest) - len(stripped))
        newline = completion.find("\n", start)
        end = len(completion) if newline < 0 else newline
        text = completion[start:end]
    text = text.strip().lstrip("*_:").strip()
    span = _MATH_SPAN.match(text)
    if span is not None:
        text = next(g for g in span.groups() if g is not None)
    else:
        text = _without_hope(text)
    text = clean_answer(text)
    return FinalAnswer(text, end, "answer is", block=_block(completion, start)) if text else None


def _block(completion: str, start: int) -> str:
    """The lines from ``start`` up to a blank line (at most ``MAX_BLOCK_LINES``), cleaned."""
    lines = []
    for line in completion[start : start + 4000].split("\n")[:MAX_BLOCK_LINES]:
        if not line.strip():
            break
        lines.append(clean_answer(line))
    return "\n".join(lines)


def _without_hope(text: str) -> str:
    """``text`` without a trailing "I hope it is correct." (string operations: the regex
    it replaces, ``\\s*I hope…$``, backtracked quadratically over a run of spaces)."""
    stripped = text.rstrip()
    bare = stripped[:-1] if stripped.endswith(".") else stripped
    if bare[-len(_HOPE) :].casefold() == _HOPE:
        return bare[: -len(_HOPE)].rstrip()
    return text


def find_final_answer(completion: str) -> FinalAnswer | None:
    """The final answer by the precedence of the module docstring, or None."""
    return _boxed(completion) or _statement(completion)


def show(text: str, limit: int = 60) -> str:
    """A completion fragment short enough for a one-line verdict message."""
    text = " ".join(text[: limit * 4].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
