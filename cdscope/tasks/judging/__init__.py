"""How an answer is judged: the verifiers behind the GRPO reward (SPEC §5) and pass@k (§7).

* ``verifiers`` -- ``verify`` / ``verify_many`` and the built-in kinds; ``registry``: the
  kinds, ``register_verifier`` and the ``cdscope.verifiers`` entry points
* ``answers``   -- where a completion states its final answer (formats, precedence, hedges)
* ``numeric``   -- exact numbers in every spelling, bounded; the fraction form rule
* ``symbolic``  -- math-verify in killable worker processes (``symbolic_child``)
* ``logic``     -- structural checks per logic generator; ``claims``: what a logic
  answer claims (Yes/No, roles) and whether it hedges
* ``sanitize``, ``code`` -- completion -> the program a code task's entry point needs;
  its verdict comes from the sandbox's harness (``cdscope.tasks.sandbox``)
* ``corpus``    -- the verifiers' own corpus: right answers in the formats models write,
  wrong, hedged and copy-the-prompt answers

This face is the package's one door for the rest of cdscope; names load on first use.
"""

from __future__ import annotations

from cdscope.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        (
            "HEDGE",
            "NO_ANSWER",
            "VERIFIERS",
            "Verdict",
            "register_verifier",
            "verifier_kinds",
            "verify",
            "verify_many",
        ),
        "cdscope.tasks.judging.verifiers",
    ),
    **dict.fromkeys(("FinalAnswer", "find_final_answer"), "cdscope.tasks.judging.answers"),
    **dict.fromkeys(("Case", "cases"), "cdscope.tasks.judging.corpus"),
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
