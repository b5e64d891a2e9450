"""Generation engines behind ``cdscope eval`` (docs/eval.md "Engines"): one contract,
three implementations, chosen by ``--backend`` / ``--endpoint``:

- ``hf.HFEngine``: ``transformers.generate`` through ``core.generation.sample`` (the
  reference path; one problem per call);
- ``vllm.VLLMEngine``: vLLM's ``LLM`` in this process, many problems per call;
- ``endpoint.EndpointEngine``: any OpenAI-compatible completions server.

Each takes a list of ``GenRequest`` (prompt, n, max_tokens, seed) and returns one
``Generation`` per request. A request's completions depend on its own seed only, never
on which other requests share the call, so ``--resume`` gives the samples an
uninterrupted run would have given (tested per engine).
"""

from cdscope.core.engines.base import Engine, Generation, GenRequest

__all__ = ["Engine", "GenRequest", "Generation"]
