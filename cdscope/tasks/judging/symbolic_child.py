"""The symbolic-comparison worker: math-verify in a process of its own (``symbolic.py``).

Run as ``python -P -c <this source> MEMORY_MB``: it caps its address space, imports
math-verify (Hugging Face's answer checker, the one TRL and open-r1 use for GRPO
rewards), says ``{"ready": true}`` and then answers one JSON line per request
``{"gold": text, "pred": text}`` with ``{"equal": true | false | null}`` (null: one side
does not parse) or ``{"error": type name}``. math-verify's own timeouts are signal
alarms, which do not work off the main thread; here they are off, and the parent kills
this process at the verdict's deadline instead. Standard library and math-verify only.
"""

# Executed as a script: no ``from __future__`` and no cdscope imports here.
import json
import logging
import os
import resource
import sys


def _wrap(text):
    return text if "$" in text else "$" + text + "$"


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

    def compare(gold, pred):
        parsed_gold = parse(_wrap(gold), configs, parsing_timeout=None)
        parsed_pred = parse(_wrap(pred), configs, parsing_timeout=None)
        if not parsed_gold or not parsed_pred:
            return None
        return bool(verify(parsed_gold, parsed_pred, timeout_seconds=None))

    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = {"equal": compare(str(request["gold"]), str(request["pred"]))}
        except Exception as exc:  # MemoryError, RecursionError, a parser's own errors
            reply = {"error": type(exc).__name__}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
