"""What a logic answer claims, and whether it commits to it (SPEC §5 reward, §7 pass@k).

Two kinds of claim, read from the final answer's text (``answers.find_final_answer``):

* **Yes or No** (``polarity``): the answer's first word (yes, true, valid, follows,
  correct / no, false, invalid, not, incorrect), else what it says: "It does not follow"
  and "The argument is invalid" are No, "It follows" and "The conclusion is valid" Yes.
* **Roles** (``roles``): "<Name> is a <role>", "<Name> is not a <role>" (the other role,
  where the task has two), "<Name>: <role>", "<Name> - <role>", "<Name> (<role>)", in any
  case (``JACK IS A KNIGHT``), several on one line or one per line.

Only the *answer* counts, not its justification: the text from the first "because",
"since", "given that" or "as" on is reasoning, and may name any role or polarity ("No,
because the conclusion is not true" is No). In the answer, a claim that names more than
one outcome or depends on a condition is a **hedge**, and a hedge is wrong -- it gains
nothing over a bare answer, and a verifier that passes it teaches a model that a
non-answer is right:

* two outcomes: "Yes or No", "yes/no", "True or False", "Yes. No." (a clause that is a
  bare opposite answer), "a knight/knave",
  "a knight or a knave", "a knight (or knave)", a name given two roles;
* a condition: "if", "iff", "unless", "otherwise", "assuming", "suppose", "provided",
  "whether", "depends", "maybe", "perhaps", "possibly", "might", "could" -- "Yes, if the
  premises hold", or the prompt's own "Jack is a knight if and only if Abigail is a
  knight" restated.

Every pattern here is linear in the text (a name starts where no name character precedes
it: ``\\b`` also matched inside ``a-a-a-…``, 14 s at 32k characters before).
"""

from __future__ import annotations

import re

JUSTIFICATION = re.compile(r"\b(?:because|since|given\s+that|as)\b", re.IGNORECASE)
_CONDITION_WORDS = (
    "if iff unless otherwise assuming assume suppose supposing provided whether depends "
    "depending maybe perhaps possibly might could"
)
CONDITIONS = frozenset(_CONDITION_WORDS.split())
YES_WORDS = frozenset({"yes", "true", "valid", "follows", "correct"})
NO_WORDS = frozenset({"no", "false", "invalid", "not", "incorrect"})
_AFFIRMING = frozenset({"follows", "follow", "valid", "true", "correct", "holds", "hold"})
_DENYING = frozenset({"invalid", "false", "incorrect", "wrong"})
_NEGATIONS = frozenset({"not", "doesn't", "doesnt", "cannot", "can't", "never", "isn't", "no"})
_BOTH = re.compile(r"\b(yes|no|true|false)\b\s*+(?:/|\bor\b)\s*+(yes|no|true|false)\b", re.I)
_SAID = {"yes": "yes", "true": "yes", "no": "no", "false": "no"}
_CLAUSE = re.compile(r"[.,;:!?\n\u2014]")
_WORDS = re.compile(r"[a-z']+")

_NAME = r"(?<![A-Za-z'\-])([A-Za-z][A-Za-z'\-]*+)"
_STATED = re.compile(rf"{_NAME}\s++is\s++(not\s++)?an?\s++([A-Za-z]+)", re.IGNORECASE)
_LABELLED = re.compile(
    rf"{_NAME}[ \t]*+(?::|=|->|-|\u2013|\u2014|\u2192|\()[ \t]*+(?:an?[ \t]++)?([A-Za-z]+)",
    re.IGNORECASE,
)
_ROLE_PAIR = re.compile(r"\bis an? ([A-Za-z]+)/([A-Za-z]+)")
_SLASHED = re.compile(r"[A-Za-z]\s*+/\s*+[A-Za-z]")


def answer_part(text: str) -> str:
    """``text`` up to its justification (module docstring)."""
    cut = JUSTIFICATION.search(text)
    return text if cut is None else text[: cut.start()]


def condition(text: str) -> str | None:
    """The first condition word of ``text`` ("if", "unless", ...), or None."""
    return next((w for w in _WORDS.findall(text.casefold()) if w in CONDITIONS), None)


def _clause_polarity(clause: str) -> str | None:
    words = _WORDS.findall(clause.casefold())
    if not words:
        return None
    if words[0] in YES_WORDS:
        return "yes"
    if words[0] in NO_WORDS:
        return "no"
    if any(w in _DENYING for w in words):
        return "no"
    if any(w in _AFFIRMING for w in words):
        return "no" if any(w in _NEGATIONS for w in words) else "yes"
    return None


def polarity(text: str) -> str | None:
    """ "yes", "no", "hedge" (module docstring) or None when ``text`` says neither: the
    first clause that says Yes or No decides; another clause that is a bare opposite
    answer ("Yes. No.") or both joined ("Yes or No") or a condition make it a hedge."""
    said = answer_part(text)
    both = _BOTH.search(said)
    if both is not None and _SAID[both.group(1).lower()] != _SAID[both.group(2).lower()]:
        return "hedge"
    if condition(said) is not None:
        return "hedge"
    clauses = [c.strip().casefold() for c in _CLAUSE.split(said)]
    found = next((p for p in map(_clause_polarity, clauses) if p is not None), None)
    if found is not None and any(_SAID.get(c, found) != found for c in clauses):
        return "hedge"
    return found


def role_pair(prompt: str, reference_roles: set[str]) -> tuple[str, str] | None:
    """The task's two roles (``knight``/``knave`` from the prompt's "is a knight/knave"
    format line, else the reference's two), case-folded; None when not known."""
    pair = _ROLE_PAIR.search(prompt)
    if pair is not None:
        return pair.group(1).casefold(), pair.group(2).casefold()
    if len(reference_roles) == 2:
        first, second = sorted(reference_roles)
        return first, second
    return None


def roles(
    text: str, known: set[str] | None = None, pair: tuple[str, str] | None = None
) -> tuple[dict[str, str], str | None]:
    """``{name: role}`` (case-folded) that ``text``'s answer part states, with roles among
    ``known`` only (so "Answer: Jack" names no role; None: any word), and why it is a
    hedge (None when it is not): a name given two roles, two roles offered, a condition."""
    said = answer_part(text)
    word = condition(said)
    if word is not None:
        return {}, f"a condition ({word!r})"
    if re.search(r"\bor\b|\beither\b", said, re.IGNORECASE) or _two_roles(said, known or set()):
        return {}, "two roles offered"
    found: dict[str, str] = {}
    stated = [(n, bool(neg), r) for n, neg, r in _STATED.findall(said)]
    stated += [(n, False, r) for n, r in _LABELLED.findall(said)]
    for name, negated, role in stated:
        name, role = name.casefold(), role.casefold()
        if known is not None and role not in known:
            continue
        if negated:
            if pair is None or role not in pair:
                continue
            role = pair[1] if role == pair[0] else pair[0]
        if found.get(name, role) != role:
            return found, f"{name} is given two roles"
        found[name] = role
    return found, None


def _two_roles(text: str, known: set[str]) -> bool:
    """``knight/knave``: two known roles around a slash."""
    for match in _SLASHED.finditer(text):
        left = re.findall(r"[A-Za-z]+", text[max(0, match.start() - 30) : match.start() + 1])
        right = re.findall(r"[A-Za-z]+", text[match.end() - 1 : match.end() + 30])
        if left and right and left[-1].casefold() in known and right[0].casefold() in known:
            return True
    return False
