"""The verifier's own test corpus: right answers in the formats models write, and wrong,
hedged and copy-the-prompt answers, for any task (docs/tasks.md, "The corpus").

For a task and its reference -- the answer for math/logic, a solution body for code --
``cases(task, solution)`` returns labelled completions that must pass (``right:*``: at
least ten formats: boxed, ``\\fbox``, ``\\text{}`` inside a box, ``Answer:``, ``Final
answer:``, bold, GSM8K ``####``, Minerva's sentence, the next line, LaTeX spellings; for
code a body, bare and fenced definitions, a chat-style fenced program with imports and a
helper, demo code after it, prose around it) and completions that must fail (``wrong:*``
a different answer in the same form, ``hedge:*`` two answers at once, ``copy:*`` the
prompt's own numbers, fraction, expression or answer template, ``none:*`` no
statement). ``tests/tasks/test_answer_formats.py`` runs it on every shipped task and
``benchmarks/bench_verifiers.py`` counts false negatives and false positives. It is a
library module so that a plugin author can run the same corpus on a new verifier kind.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction

from cdscope.tasks.judging.numeric import read_number
from cdscope.tasks.record import Task, is_code_kind

REASONING = (
    "Let me work through this step by step.\nFirst I restate the problem, then I solve it.\n"
)


@dataclass(frozen=True)
class Case:
    """One completion of the corpus and whether a correct verifier passes it."""

    task: Task
    label: str
    completion: str

    @property
    def should_pass(self) -> bool:
        return self.label.startswith("right:")


def statement_formats(answer: str) -> dict[str, str]:
    """``answer`` stated in the formats of ``answers.find_final_answer`` (all right)."""
    body = REASONING
    return {
        "boxed": f"{body}So the answer is \\boxed{{{answer}}}.",
        "fbox": f"{body}\\fbox{{{answer}}}",
        "boxed text": f"{body}$\\boxed{{\\text{{{answer}}}}}$",
        "answer colon": f"{body}Answer: {answer}",
        "final answer": f"{body}Final answer: {answer}",
        "bold answer": f"{body}**Answer:** {answer}",
        "bold value": f"{body}The answer is **{answer}**.",
        "gsm8k": f"{body}#### {answer}",
        "minerva": f"{body}Final Answer: The final answer is ${answer}$. I hope it is correct.",
        "next line": f"{body}Final answer:\n\n{answer}\n",
        "math span": f"{body}Answer: \\({answer}\\)",
        "heading": f"{body}**Final Answer**\n {answer}",
        "double braces": f"{body}\\boxed{{{{{answer}}}}}",
        "empty box after": f"{body}\\boxed{{{answer}}}\n\nThat is all. \\boxed{{}}",
        "tick box after": f"{body}\\boxed{{{answer}}}\n\nChecked: \\boxed{{\\checkmark}}",
    }


def _number_spellings(answer: str) -> dict[str, str]:
    value = read_number(answer)
    if value is None:
        return {}
    out: dict[str, str] = {}
    if value.kind == "fraction" and value.parts is not None:
        num, den = value.parts
        sign = "-" if value.value < 0 else ""
        out["latex frac"] = f"\\boxed{{{sign}\\frac{{{abs(num)}}}{{{abs(den)}}}}}"
        out["dfrac"] = f"The answer is $\\dfrac{{{num}}}{{{den}}}$."
        out["parenthesised"] = f"Answer: ({num})/({den})"
        out["left right"] = f"\\boxed{{\\left(\\frac{{{num}}}{{{den}}}\\right)}}"
        out["cfrac"] = f"\\boxed{{\\cfrac{{{num}}}{{{den}}}}}"
    elif value.value.denominator == 1 and abs(value.value) >= 1000:
        out["thousands"] = f"The answer is {int(value.value):,}."
    elif value.value.denominator == 1:
        out["decimal zero"] = f"\\boxed{{{int(value.value)}.0}}"
        out["degrees"] = f"\\boxed{{{int(value.value)}^\\circ}}"
    return out


def _other_number(answer: str) -> str:
    value = read_number(answer)
    assert value is not None
    wrong = value.value + 1
    if value.kind == "fraction" and value.parts is not None:
        return f"{wrong.numerator}/{wrong.denominator}"
    return str(wrong.numerator) if wrong.denominator == 1 else str(float(wrong))


def _prompt_copies(task: Task) -> dict[str, str]:
    """The prompt's own material as an answer (wrong unless it happens to be right)."""
    prompt, out = task.prompt, {}
    fraction = re.search(r"fraction\s+\$?(\d+)\s*/\s*(\d+)", prompt)
    if fraction is not None:
        num, den = fraction.groups()
        out["frac"] = f"\\boxed{{\\frac{{{num}}}{{{den}}}}}"
        out["dfrac"] = f"\\boxed{{\\dfrac{{{num}}}{{{den}}}}}"
        out["parenthesised"] = f"Answer: ({num})/({den})"
        out["exactly"] = f"The answer is {num}/{den} exactly."
        out["plain"] = f"Answer: {num}/{den}"
    expression = re.search(r"problem:\s*([-\d+*/ ().]+?)\s*=", prompt)
    if expression is not None:
        out["expression"] = f"\\boxed{{{expression.group(1).strip()}}}"
    numbers = re.search(r"these numbers:\s*([\d, ]+\d)", prompt)
    if numbers is not None:
        out["numbers"] = f"Answer: {numbers.group(1)}"
    template = re.search(r'Format your answer like: "([^"]+)"', prompt)
    if template is not None:
        out["template"] = f"Answer: {template.group(1)}"
    if "(Answer Yes or No)" in prompt:
        out["yes or no"] = "Answer: Yes or No"
    example = re.search(r"e\.g\.\s+((?:(?:up|down|left|right)\s*)+)", prompt)
    if example is not None:
        out["example path"] = f"Answer: {example.group(1).strip()}"
    listed = re.search(r"Sort these numbers[^:]*:\s*([^\n]+)", prompt)
    number = r"-?\d+(?:\.\d+)?"
    if listed is not None and re.findall(number, listed.group(1)) != re.findall(
        number, task.answer or ""
    ):
        out["unsorted list"] = f"Answer: {listed.group(1).strip()}"
    return out


def _knights_parts(answer: str) -> list[str]:
    return [p.strip() for p in re.split(r",?\s*\band\s+|,", answer) if p.strip()]


def _logic_right(task: Task, answer: str) -> dict[str, str]:
    """The spellings of a logic answer that scored 0 before issue 38."""
    kind, out = task.verifier, {}
    if kind == "logic:knights_knaves":
        parts = _knights_parts(answer)
        roles = list(dict.fromkeys(re.findall(r" is an? (\w+)", task.prompt)))[:2]
        out["caps"] = f"Answer: {answer.upper()}"
        out["labelled"] = "Answer: " + ", ".join(re.sub(r" is an? ", ": ", p) for p in parts)
        out["one per line"] = "Answer:\n" + "\n".join(parts)
        if len(roles) == 2:
            out["negated"] = "Answer: " + " and ".join(
                re.sub(
                    rf" is an? ({roles[0]}|{roles[1]})\b",
                    lambda m: f" is not a {_other(roles, m.group(1))}",
                    p,
                )
                for p in parts
            )
    elif kind == "logic:syllogism":
        yes = answer.strip().lower() == "yes"
        out["in words"] = "Answer: It follows." if yes else "Answer: It does not follow."
        out["because"] = (
            f"Answer: {answer}, because the premises do not say it is {'false' if yes else 'true'}."
        )
    return {f"right:{label}": text for label, text in out.items()}


def _other(pair: list[str], role: str) -> str:
    return pair[1] if role == pair[0] else pair[0]


def _logic_wrong(task: Task, answer: str) -> dict[str, str]:
    kind, out = task.verifier, {}
    if kind == "logic:knights_knaves":
        roles = list(dict.fromkeys(re.findall(r" is an? (\w+)", task.prompt)))[:2]
        first = re.search(r" is an? (\w+)", answer)
        if first is not None and len(roles) == 2:
            other = _other(roles, first.group(1))
            out["wrong:flipped role"] = re.sub(
                rf" is an? {first.group(1)}", f" is a {other}", answer, count=1
            )
            out["hedge:slash"] = re.sub(
                rf" is an? {first.group(1)}", f" is a {roles[0]}/{roles[1]}", answer, count=1
            )
            out["hedge:or in parentheses"] = re.sub(
                rf" is an? {first.group(1)}",
                f" is a {first.group(1)} (or {other})",
                answer,
                count=1,
            )
        parts = _knights_parts(answer)
        if len(parts) == 2:
            out["hedge:conditional"] = f"{parts[0]} if {parts[1]}"
    elif kind == "logic:syllogism":
        out["wrong:opposite"] = "No" if answer.strip().lower() == "yes" else "Yes"
        out["hedge:both"] = "Yes or No" if answer.strip().lower() == "yes" else "No or Yes"
        out["hedge:conditional"] = f"{answer}, if the premises hold"
    elif kind == "logic:number_sorting":
        items = re.findall(r"-?\d+(?:\.\d+)?", answer)
        if len(set(items)) > 1:
            out["wrong:reversed"] = "[" + ", ".join(reversed(items)) + "]"
        out["hedge:two lists"] = f"{answer} or {'[' + ', '.join(reversed(items)) + ']'}"
    elif kind == "logic:shortest_path":
        out["wrong:path"] = "infeasible" if answer != "infeasible" else "right"
        out["hedge:or"] = f"{answer} or {out['wrong:path']}"
    return {label: f"Answer: {text}" for label, text in out.items()}


def _answer_cases(task: Task) -> dict[str, str]:
    answer = task.answer or ""
    right = {f"right:{k}": v for k, v in statement_formats(answer).items()}
    if task.verifier == "logic:syllogism":
        right["right:lower case"] = f"Answer: {answer.lower()}"
    if task.verifier == "logic:knights_knaves":
        right["right:reordered"] = "Answer: " + " and ".join(reversed(_knights_parts(answer)))
    right.update(_logic_right(task, answer))
    if task.verifier == "logic:number_sorting":
        right["right:unquoted"] = "Answer: " + answer.replace("'", "")
    right.update({f"right:{k}": v for k, v in _number_spellings(answer).items()})
    fraction = re.search(r"fraction\s+\$?(\d+)\s*/\s*(\d+)", task.prompt)
    reduced = read_number(answer)
    if fraction is not None and reduced is not None and reduced.parts is not None:
        num, den = reduced.parts  # the prompt's fraction = the reduced one
        right["right:equation"] = f"Answer: {fraction.group(1)}/{fraction.group(2)} = {num}/{den}"
    wrong: dict[str, str] = {"none:no statement": REASONING + "I am not sure."}
    if task.verifier == "math" and read_number(answer) is not None:
        other = _other_number(answer)
        wrong["wrong:boxed"] = f"\\boxed{{{other}}}"
        wrong["wrong:answer"] = f"Answer: {other}"
        wrong["hedge:two boxes"] = f"\\boxed{{{answer}}} or \\boxed{{{other}}}"
        wrong["hedge:or"] = f"Answer: {answer} or {other}"
        wrong["hedge:or first wrong"] = f"Answer: {other} or {answer}"
        wrong["wrong:huge number"] = "Answer: " + "9" * 5000
        wrong["hedge:pi tail"] = f"\\boxed{{{answer}\\pi}}"
        wrong["hedge:minus one"] = f"Answer: {answer} minus one"
    wrong.update(_logic_wrong(task, answer))
    want = read_number(answer)
    for label, text in _prompt_copies(task).items():
        if text.split(": ", 1)[-1].strip() == answer.strip():
            continue  # the prompt's example happens to be the answer
        copied = read_number(re.sub(r"^(Answer:|The answer is)\s*", "", text).rstrip("."))
        same = want is not None and copied is not None and copied.value == want.value
        if not same or copied.parts != want.parts:  # a copy that is the answer is right
            wrong[f"copy:{label}"] = text
    return {**right, **wrong}


def _signature(task: Task) -> tuple[str, str] | None:
    """``(parameters as written, call arguments)`` of the prompt's entry point."""
    try:
        tree = ast.parse(task.prompt)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == task.entry_point:
            args = node.args
            names = [a.arg for a in [*args.posonlyargs, *args.args]]
            star = [f"*{args.vararg.arg}"] if args.vararg else []
            return ", ".join(names + star), ", ".join(names + star)
    return None


def _code_cases(task: Task, body: str) -> dict[str, str]:
    full = task.prompt + body
    entry = task.entry_point or ""
    out = {
        "right:body": body,
        "right:bare definition": full,
        "right:fenced": f"```python\n{full}```",
        "right:fenced no language": f"Solution:\n```\n{full}```\n",
        "right:fenced py label": f"```py\n{full}\n```",
        "right:demo after": (
            f"```python\n{full}\n\nprint({entry})\nassert callable({entry})\n"
            f'if __name__ == "__main__":\n    print({entry}.__name__)\n```'
        ),
        "right:prose around": f"Here is the function:\n\n{full}\n\nIt runs in linear time.",
        "right:two fences": (
            f"Install nothing:\n```bash\necho ok\n```\nThen:\n```python\n{full}```\nDone."
        ),
        "right:body then demo": f"{body}\n\nprint({entry})\n",
        "right:body then stray def": f"{body}\n\ndef unrelated():\n    return 0\n",
    }
    signature = _signature(task)
    if signature is not None:
        params, call = signature
        helper = f"_{entry}_impl"
        impl = task.prompt.replace(f"def {entry}(", f"def {helper}(", 1) + body
        out["right:chat program with imports and helpers"] = (
            "Sure! Here is a complete solution.\n\n```python\nimport math\nimport itertools\n"
            f"from collections import Counter\n\nUNUSED_SCALE = 1\n\n{impl}\n\n"
            f"def {entry}({params}):\n    return {helper}({call})\n\n\n"
            f'if __name__ == "__main__":\n    print({entry})\n```\n\nThe helper does the work.'
        )
        out["right:helper in an earlier block"] = (
            f"First a helper:\n\n```python\n{impl}```\n\nThen the function:\n\n"
            f"```python\ndef {entry}({params}):\n    return {helper}({call})\n```\n"
        )
        out["right:table filled by a loop"] = (
            f"```python\n{impl}\n\nSOLVERS = {{}}\nfor name in ['main']:\n"
            f"    SOLVERS[name] = {helper}\n\n\n"
            f"def {entry}({params}):\n    return SOLVERS['main']({call})\n```\n"
        )
    out["wrong:returns None"] = f"```python\n{task.prompt}    return None\n```"
    out["copy:the prompt"] = task.prompt
    out["none:prose only"] = "I would solve this with a loop over the input."
    return out


def cases(task: Task, solution: str | None = None) -> list[Case]:
    """The corpus of ``task``: for code, ``solution`` is a correct body (HumanEval's
    canonical solution); for math/logic the task's answer is the reference."""
    if is_code_kind(task.verifier):
        if solution is None:
            raise ValueError(f"task {task.id!r}: code cases need a solution body")
        table = _code_cases(task, solution)
    else:
        table = _answer_cases(task)
    return [Case(task, label, completion) for label, completion in table.items()]


def exact_value(text: str) -> Fraction | None:
    """The exact value of a corpus answer (for checks of the corpus itself)."""
    number = read_number(text)
    return None if number is None else number.value
