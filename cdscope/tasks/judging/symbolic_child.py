"""The symbolic-comparison worker: math-verify in a process of its own (``symbolic.py``).

Run as ``python -P -c <this source> MEMORY_MB``: it caps its address space, imports
math-verify (Hugging Face's answer checker, the one TRL and open-r1 use for GRPO
rewards), says ``{"ready": true}`` and then answers one JSON line per request
``{"gold": text, "pred": text, "factor": bool}`` (``factor`` present for transform
tasks only) with ``{"equal": true | false | null}`` (null: one side does not parse),
plus ``"why"`` when math-verify's equality is overruled, or ``{"error": type name}``.
math-verify's own timeouts are signal alarms, which do not work off the main thread;
here they are off, and the parent kills this process at the verdict's deadline instead.
Standard library, math-verify and its sympy only.

Two judgments are added to math-verify's value equality, on the trees it parses (left
unevaluated by its LaTeX reader):

* **kinds kept apart**: a set is never equal to an interval, an ordered pair or a tuple
  (math-verify found ``(1,2)`` and ``\\{1,2\\}`` equal both ways);
* **form** (transform tasks): the answer may not show a feature of an unfinished
  transformation that the reference does not show (``features``): a power of a sum, a
  product with a sum in it, a radical whose radicand has a square (cube, ...) factor or
  is an expression, a radical in a denominator, a fraction not in lowest terms, an
  operation on numbers left to compute, a decimal; and for "factor" tasks, a sum that
  still factors. So restating the question (``\\sqrt{245}`` for 7√5, ``(x+1)^2`` for
  x²+2x+1, ``x^2-1`` for (x-1)(x+1)) is not the answer.
"""

# Executed as a script: no ``from __future__`` and no cdscope imports here.
import json
import logging
import os
import resource
import sys

MAX_NODES = 2000  # of a tree inspected for its form


def _wrap(text):
    return text if "$" in text else "$" + text + "$"


def kind(expr):
    """What a parsed answer is: a set, an interval or pair, a tuple, an expression."""
    import sympy

    if isinstance(expr, sympy.FiniteSet):
        return "a set"
    if isinstance(expr, (sympy.Interval, sympy.Union)):
        return "an interval or pair"  # (1, 2) reads as both
    if isinstance(expr, sympy.Tuple):
        return "a tuple"
    return "an expression"


def _is_root(power):
    exponent = power.args[1]
    return exponent.is_Rational and not exponent.is_Integer


def _has_power_factor(number, degree):
    import sympy

    if number == 0 or abs(number) > 10**30:
        return False
    factors = sympy.factorint(abs(int(number)), limit=10**5)
    return any(p > 1 and e >= degree for p, e in factors.items())


def _factors(mul):
    """The factors of a product, nested products flattened."""
    import sympy

    out = []
    for arg in mul.args:
        out += _factors(arg) if isinstance(arg, sympy.Mul) else [arg]
    return out


def _power_marks(node):
    import sympy

    base, exponent = node.args
    marks = set()
    if _is_root(node):
        if exponent < 0:
            marks.add("a radical in a denominator")
        simplifies = base.is_Integer and _has_power_factor(base, exponent.q)
        if simplifies or (not base.is_Atom and not base.free_symbols):
            marks.add("a radical that simplifies")
    elif exponent.is_Integer and exponent < 0:
        inner = sympy.preorder_traversal(base)
        if any(isinstance(n, sympy.Pow) and _is_root(n) for n in inner):
            marks.add("a radical in a denominator")
    if exponent.is_Integer and abs(exponent) >= 2:
        if isinstance(base, sympy.Add):
            marks.add("a power of a sum")
        elif base.is_Rational:
            marks.add("an operation left to compute")
    return marks


def _product_marks(node):
    import sympy

    factors = _factors(node)
    marks = set()
    if any(isinstance(f, sympy.Add) and f.free_symbols for f in factors):
        marks.add("a product with a sum in it")
    if len([f for f in factors if f.is_Rational and f not in (1, -1)]) >= 2:
        marks.add("an operation left to compute")
    tops = [f for f in factors if f.is_Integer]
    bottoms = [f.args[0] for f in factors if isinstance(f, sympy.Pow) and f.args[1] == -1]
    if any(b.is_Integer and sympy.igcd(t, b) > 1 for t in tops for b in bottoms):
        marks.add("a fraction not in lowest terms")
    return marks


def _sum_marks(node, factor_task):
    import sympy

    marks = set()
    if len([a for a in node.args if a.is_Rational]) >= 2:
        marks.add("an operation left to compute")
    factors = factor_task and node.free_symbols
    if factors and isinstance(sympy.factor(node), (sympy.Mul, sympy.Pow)):
        marks.add("a sum that factors")
    return marks


def features(expr, factor_task):
    """The marks of an unfinished transformation in ``expr`` (module docstring)."""
    import sympy

    found = set()
    if not isinstance(expr, sympy.Basic):
        return found
    for count, node in enumerate(sympy.preorder_traversal(expr)):
        if count > MAX_NODES:
            break
        if isinstance(node, sympy.Float):
            found.add("a decimal")
        elif isinstance(node, sympy.Pow):
            found |= _power_marks(node)
        elif isinstance(node, sympy.Mul):
            found |= _product_marks(node)
        elif isinstance(node, sympy.Add):
            found |= _sum_marks(node, factor_task)
    return found


def judge(parsed_gold, parsed_pred, request):
    """The reply to one request whose sides parsed and math-verify found equal."""
    gold, pred = parsed_gold[0], parsed_pred[0]
    kinds = (kind(gold), kind(pred))
    if kinds[0] != kinds[1] and "a set" in kinds:
        return {"equal": False, "why": f"{kinds[1]} where the reference is {kinds[0]}"}
    if "factor" in request:
        extra = sorted(features(pred, request["factor"]) - features(gold, request["factor"]))
        if extra:
            return {"equal": False, "why": "not in the reference's form: " + ", ".join(extra)}
    return {"equal": True}


def main():
    limit = int(sys.argv[1]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    logging.disable(logging.CRITICAL)  # math-verify warns about its disabled timeouts
    out = os.fdopen(os.dup(1), "w")  # replies only: no library's print reaches the pipe
    os.dup2(2, 1)  # fd 1 (C-level writes too) now goes where stderr goes: nowhere
    sys.stdout = sys.stderr
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def compare(request):
        parsed_gold = parse(_wrap(str(request["gold"])), configs, parsing_timeout=None)
        parsed_pred = parse(_wrap(str(request["pred"])), configs, parsing_timeout=None)
        if not parsed_gold or not parsed_pred:
            return {"equal": None}
        if not verify(parsed_gold, parsed_pred, timeout_seconds=None):
            return {"equal": False}
        return judge(parsed_gold, parsed_pred, request)

    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            reply = compare(json.loads(line))
        except Exception as exc:  # MemoryError, RecursionError, a parser's own errors
            reply = {"error": type(exc).__name__}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
