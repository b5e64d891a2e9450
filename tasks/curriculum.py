"""The learnable curriculum: small synthetic tasks a 135M chat model solves some of the time.

The shipped train sets (reasoning-gym, HumanEval) are too hard for the embedded
SmolLM2-135M-Instruct: it passes almost none of them, so every GRPO group has equal
rewards, every advantage is 0 and GRPO cannot learn. These sets are easy enough that
the model starts with a clearly nonzero but improvable pass@1 (measured per family in
docs/tasks.md), in the shipped task format and verified by the existing verifier kinds.

Three families, four generators each, every task generated from its own seeded
``random.Random`` (string seeds: independent of ``PYTHONHASHSEED`` and of each other):

* math (verifier ``math``) -- ``add`` (two-digit + one-digit), ``sub`` (two-digit -
  one-digit), ``mul`` (one-digit x one-digit), ``add2`` (two-digit + two-digit);
* logic -- ``smaller`` (the smaller of two numbers, ``logic``), ``largest`` (the largest
  of three, ``logic``), ``count`` (how often a letter occurs in a word, ``logic``),
  ``sort3`` (three numbers in ascending order, ``logic:number_sorting``);
* code (verifier ``code``, HumanEval-style ``check(candidate)``) -- ``arith`` (x plus /
  minus / times k), ``compare`` (n greater than / divisible by k), ``index`` (element,
  prefix or suffix at k), ``aggregate`` (sum plus k, count above k, length plus k).

Math and logic prompts are ChatML (the chat format SmolLM2 and Qwen2.5 share) with two
solved examples, so a completion is one short reply ending at the model's end-of-turn
token: "The answer is 37." Code prompts must be a Python program (the verifier runs
``prompt + completion``), so they show two solved functions and end the stub with
``return``: the completion is the returned expression. The two examples of each
generator are fixed and never drawn as tasks.
"""

from __future__ import annotations

import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

#: one ChatML turn pair; the model's reply follows the assistant header
USER = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
REPLY = "The answer is {answer}.<|im_end|>\n"

WORDS = (
    "apple", "banana", "cherry", "letter", "bottle", "address", "coffee", "pepper", "summer",
    "little", "yellow", "button", "garden", "window", "mirror", "rabbit", "butter", "kitten",
    "puppy", "paper", "carrot", "orange", "potato", "tomato", "pillow", "basket", "ladder",
    "hammer", "dinner", "silver", "banner", "cotton", "ribbon", "parrot", "lemon", "melon",
    "balloon", "cookie", "guitar", "pencil",
)  # fmt: skip


@dataclass(frozen=True)
class Draw:
    """One generated task: the question (code: the stub), the reference answer (code: the
    returned expression of a canonical solution) and, for code, the tests."""

    question: str
    answer: str
    tests: str | None = None
    entry_point: str | None = None


Make = Callable[[random.Random], Draw]


@dataclass(frozen=True)
class Generator:
    """One task generator: ``make(rng) -> Draw``; ``shots`` are the two solved examples
    (question, answer) shown before every question of this generator."""

    family: str
    name: str
    verifier: str
    make: Make
    shots: tuple[tuple[str, str], tuple[str, str]]

    def prompt(self, question: str) -> str:
        if self.family == "code":
            solved = "".join(f"{stub} {expr}\n\n\n" for stub, expr in self.shots)
            return solved + question
        solved = "".join(USER.format(question=q) + REPLY.format(answer=a) for q, a in self.shots)
        return solved + USER.format(question=question)


def _add(rng: random.Random) -> Draw:
    a, b = rng.randint(10, 39), rng.randint(1, 9)
    return Draw(f"What is {a} + {b}?", str(a + b))


def _sub(rng: random.Random) -> Draw:
    a, b = rng.randint(10, 39), rng.randint(1, 9)
    return Draw(f"What is {a} - {b}?", str(a - b))


def _mul(rng: random.Random) -> Draw:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return Draw(f"What is {a} * {b}?", str(a * b))


def _add2(rng: random.Random) -> Draw:
    a, b = rng.randint(10, 49), rng.randint(10, 49)
    return Draw(f"What is {a} + {b}?", str(a + b))


def _smaller(rng: random.Random) -> Draw:
    a, b = rng.sample(range(1, 100), 2)
    return Draw(f"Which is smaller, {a} or {b}?", str(min(a, b)))


def _largest(rng: random.Random) -> Draw:
    xs = rng.sample(range(1, 100), 3)
    return Draw(f"What is the largest of {', '.join(map(str, xs))}?", str(max(xs)))


def _count(rng: random.Random) -> Draw:
    word = rng.choice(WORDS)
    letter = rng.choice(sorted(set(word)))
    question = f'How many times does the letter "{letter}" appear in "{word}"?'
    return Draw(question, str(word.count(letter)))


def _sort3(rng: random.Random) -> Draw:
    xs = rng.sample(range(1, 100), 3)
    question = f"Sort the numbers {', '.join(map(str, xs))} in ascending order."
    return Draw(question, ", ".join(map(str, sorted(xs))))


# -- code: (signature line, docstring, solution expression, [(argument, expected)]) ------

CodeSpec = tuple[str, str, str, list[tuple[str, str]]]


ARITH = (
    ("+", "plus", "add", operator.add),
    ("-", "minus", "subtract", operator.sub),
    ("*", "times", "multiply", operator.mul),
)


def _arith(rng: random.Random) -> CodeSpec:
    k = rng.randint(2, 19)
    op, word, name, fn = rng.choice(ARITH)
    cases = [(str(x), str(fn(x, k))) for x in (0, 3, -4, 10)]
    return f"def {name}_{k}(x):", f"Return x {word} {k}.", f"x {op} {k}", cases


#: (function name, docstring, returned expression, k range, inputs) per kind; every
#: template takes k, the expression is also the canonical solution the tests come from
COMPARE = (
    ("above_{k}", "Return True if n is greater than {k}, else False.", "n > {k}", (1, 40)),
    ("below_{k}", "Return True if n is less than {k}, else False.", "n < {k}", (1, 40)),
    ("divisible_by_{k}", "Return True if n is divisible by {k}, else False.", "n % {k} == 0",
     (2, 10)),
)  # fmt: skip
INDEX = (
    ("item_{k}", "Return the element of the list xs at index {k}.", "xs[{k}]", (0, 5)),
    ("first_{k}", "Return the first {k} elements of the list xs.", "xs[:{k}]", (1, 6)),
    ("drop_{k}", "Return the list xs without its first {k} elements.", "xs[{k}:]", (1, 7)),
    ("from_end_{k}", "Return the element {k} places from the end of the list xs.", "xs[-{k}]",
     (1, 6)),
    ("every_{k}", "Return every {k}-th element of the list xs, starting with the first.",
     "xs[::{k}]", (2, 4)),
    ("last_chars_{k}", "Return the last {k} characters of the string xs.", "xs[-{k}:]", (1, 10)),
    ("first_chars_{k}", "Return the first {k} characters of the string xs.", "xs[:{k}]", (1, 10)),
    ("skip_chars_{k}", "Return the string xs without its first {k} characters.", "xs[{k}:]",
     (1, 8)),
)  # fmt: skip
LISTS = ([10, 11, 12, 13, 14, 15, 16, 17], [5, 3, 9, 1, 7, 2, 8], ["a", "b", "c", "d", "e", "f"])
TEXTS = ("abcdefgh", "python code", "banana split")


def _table(
    rng: random.Random, table: tuple, arg: str, inputs: Callable[[str, int], list]
) -> CodeSpec:
    """One kind of ``table``, one k in its range; cases = the expression on ``inputs``."""
    name, doc, expr, (low, high) = rng.choice(table)
    k = rng.randint(low, high)
    return _spec((name, doc, expr), k, arg, inputs(name, k))


def _spec(template: tuple[str, str, str], k: int, arg: str, inputs: list) -> CodeSpec:
    """Signature, docstring, canonical expression and cases of a (name, doc, expression)
    template at k; each case's expected value is the expression evaluated on it."""
    name, doc, expr = template
    code = expr.format(k=k)
    fn = eval(f"lambda {arg}: {code}")  # noqa: S307  (our own template, never task input)
    cases = [(repr(x), repr(fn(x))) for x in inputs]
    return f"def {name.format(k=k)}({arg}):", doc.format(k=k), code, cases


def _compare(rng: random.Random) -> CodeSpec:
    # the boundary (k - 1, k, k + 1) and multiples / non-multiples on both sides of it
    return _table(rng, COMPARE, "n", lambda name, k: [0, 1, k - 1, k, k + 1, 2 * k, 3 * k + 1, 50])


def _index(rng: random.Random) -> CodeSpec:
    return _table(rng, INDEX, "xs", lambda name, k: list(TEXTS if "chars" in name else LISTS))


AGGREGATE = (
    ("total_plus_{k}", "Return the sum of the numbers in xs plus {k}.", "sum(xs) + {k}"),
    ("count_above_{k}", "Return how many numbers in the list xs are greater than {k}.",
     "sum(1 for x in xs if x > {k})"),
    ("length_plus_{k}", "Return the length of the list xs plus {k}.", "len(xs) + {k}"),
)  # fmt: skip


def _aggregate(rng: random.Random) -> CodeSpec:
    k = rng.randint(1, 20)
    lists = [[1, 2, 3], [10, -4, 25, 7], [], [k, k + 1, k - 1]]
    return _spec(rng.choice(AGGREGATE), k, "xs", lists)


def near_misses(expression: str) -> list[str]:
    """Plausible wrong solutions the tests must reject: the last number off by one, and a
    strict comparison made loose (``>`` -> ``>=``, ``<`` -> ``<=``)."""
    numbers = list(re.finditer(r"\d+", expression))
    out = []
    if numbers:
        last = numbers[-1]
        value = int(last.group())
        out.append(expression[: last.start()] + str(value + 1) + expression[last.end() :])
    loose = re.sub(r"(?<![<>=!])([<>])(?!=)", r"\1=", expression)
    if loose != expression:
        out.append(loose)
    return out


CODE_SHOTS = (
    ("def double(x):", "Return x times two.", "x * 2"),
    ("def first(xs):", "Return the first element of the list xs.", "xs[0]"),
)


def code_stub(signature: str, doc: str) -> str:
    """A function stub ending in ``return``: the completion supplies the expression."""
    return f'{signature}\n    """{doc}"""\n    return'


def code_tests(name: str, cases: list[tuple[str, str]]) -> str:
    """HumanEval-style ``check(candidate)`` with one assertion per (argument, expected)."""
    lines = [f"    assert candidate({arg}) == {want}, {name!r}\n" for arg, want in cases]
    return "def check(candidate):\n" + "".join(lines)


def code_generator(name: str, spec: Callable[[random.Random], CodeSpec]) -> Generator:
    """A code Generator from a spec: stub + tests from one draw of ``spec``."""

    def make(rng: random.Random) -> Draw:
        signature, doc, expr, cases = spec(rng)
        entry_point = signature[len("def ") : signature.index("(")]
        return Draw(code_stub(signature, doc), expr, code_tests(entry_point, cases), entry_point)

    shots = tuple((code_stub(s, d), e) for s, d, e in CODE_SHOTS)
    return Generator("code", name, "code", make, shots)  # type: ignore[arg-type]


CODE_SPECS: dict[str, Callable[[random.Random], CodeSpec]] = {
    "arith": _arith,
    "compare": _compare,
    "index": _index,
    "aggregate": _aggregate,
}

GENERATORS: tuple[Generator, ...] = (
    Generator("math", "add", "math", _add, (("What is 23 + 4?", "27"), ("What is 16 + 3?", "19"))),
    Generator("math", "sub", "math", _sub, (("What is 35 - 4?", "31"), ("What is 28 - 9?", "19"))),
    Generator("math", "mul", "math", _mul, (("What is 3 * 4?", "12"), ("What is 7 * 6?", "42"))),
    Generator("math", "add2", "math", _add2,
              (("What is 23 + 14?", "37"), ("What is 41 + 36?", "77"))),
    Generator("logic", "smaller", "logic", _smaller,
              (("Which is smaller, 12 or 45?", "12"), ("Which is smaller, 71 or 38?", "38"))),
    Generator("logic", "largest", "logic", _largest,
              (("What is the largest of 12, 45, 7?", "45"),
               ("What is the largest of 71, 38, 90?", "90"))),
    Generator("logic", "count", "logic", _count,
              (('How many times does the letter "p" appear in "apple"?', "2"),
               ('How many times does the letter "e" appear in "tree"?', "2"))),
    Generator("logic", "sort3", "logic:number_sorting", _sort3,
              (("Sort the numbers 12, 5, 40 in ascending order.", "5, 12, 40"),
               ("Sort the numbers 88, 31, 64 in ascending order.", "31, 64, 88"))),
    *(code_generator(name, spec) for name, spec in CODE_SPECS.items()),
)  # fmt: skip
