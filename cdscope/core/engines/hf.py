"""The reference engine: ``transformers.generate`` via ``core.generation.sample``.

One request per ``sample`` call (its n samples in chunks of ``batch_size`` rows) under
the request's seed, so a problem's samples are the same whatever else the run holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from cdscope.core.engines.base import Generation, GenRequest
from cdscope.core.generation import sample


class HFEngine:
    """Samples with ``model`` itself (``temperature`` 0: greedy): a loaded model's, or
    the one in training (in-training evaluation)."""

    per_call = 1

    def __init__(
        self,
        model: nn.Module,
        tokenizer: object,
        temperature: float,
        top_p: float,
        batch_size: int | None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p, self.batch_size = temperature, top_p, batch_size

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out = []
        for request in requests:
            rollouts = sample(
                self.model,
                self.tokenizer,
                [request.prompt],
                num_samples=request.n,
                max_new_tokens=request.max_tokens,
                temperature=self.temperature,
                seed=request.seed,
                batch_size=self.batch_size,
                top_p=self.top_p,
            )
            out.append(Generation(rollouts.texts, rollouts.completion_mask.sum(dim=1).tolist()))
        return out

    def describe(self) -> dict:
        import transformers

        return {"engine": "hf", "transformers": transformers.__version__}

    def close(self) -> None:
        return None
