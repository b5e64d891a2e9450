"""Target log-likelihood of a probe batch under a (gated) model (SPEC §2).

    log pi(y* | x; g) = sum_t log softmax(logits)[t, y*_t]   over target tokens only

The backbone runs once; the output head is applied only at the positions that predict
target tokens (a fraction of the sequence — the vocabulary projection is the largest
matmul of a small model), and the log-softmax is taken in fp32 (fp64 for float64 models).

Mixed precision (issue 24, docs/precision.md): for a bfloat16 / float16 model the output
head itself also runs in float32 at those positions (its weight cast ``HEAD_CHUNK`` rows
at a time, so the extra memory is bounded): a logit of 20 rounded to bfloat16 is off by up
to 0.06, and the head in float32 removed a quarter of l_m's error and a tenth of C's on
the embedded model. The rest of the error is the blocks' own bfloat16 arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from cdscope.core.batch import ProbeBatch
from cdscope.core.models.adapters import check_fits
from cdscope.distributed import is_sharded

#: vocabulary rows of a half-precision output head cast to float32 at a time
HEAD_CHUNK = 16384


def output_logits(model: nn.Module, hidden: torch.Tensor, wide: bool = True) -> torch.Tensor:
    """The model's own output head on final hidden states (with Gemma-style soft-capping);
    in float32 for bfloat16 / float16 models when ``wide`` (a plain ``nn.Linear`` head
    whose weight is resident: under an accelerate hook the head runs as it is)."""
    head = model.get_output_embeddings()
    narrow = hidden.dtype in (torch.float16, torch.bfloat16)
    if wide and narrow and type(head) is nn.Linear and not hasattr(head, "_hf_hook"):
        x = hidden.float()
        bias = head.bias
        logits = torch.cat(
            [
                F.linear(
                    x,
                    head.weight[i : i + HEAD_CHUNK].float(),
                    None if bias is None else bias[i : i + HEAD_CHUNK].float(),
                )
                for i in range(0, head.weight.shape[0], HEAD_CHUNK)
            ],
            dim=-1,
        )
    else:
        logits = head(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _backbone(model: nn.Module) -> nn.Module:
    """The decoder stack under the LM head: ``base_model``, or where that is the causal-LM
    wrapper itself (Llama-4, Mllama) the module holding the described decoder blocks."""
    base = model.base_model
    if base is model:
        from cdscope.core.models.adapters import architecture_of

        path = architecture_of(model).blocks_path.rpartition(".")[0]
        base = model.get_submodule(path) if path else model
    return base


def row_target_logprobs(model: nn.Module, batch: ProbeBatch, rows: torch.Tensor) -> torch.Tensor:
    """``[len(rows)]`` tensor: log pi(y* | x) of each row, summed over its target tokens.

    Differentiable with respect to anything the forward depends on (gates included).
    Padding is trimmed to the longest row of ``rows``.
    """
    width = int(batch.lengths[rows].max())
    check_fits(model, width, "a probe row (prompt + target)", "use shorter probe items")
    input_ids = batch.input_ids[rows.to(batch.input_ids.device), :width]
    local, pos, labels = batch.predicting_positions(rows)
    if is_sharded(model):
        logits = _root_logits(model, input_ids, local, pos)
    else:
        hidden = _backbone(model)(input_ids=input_ids, use_cache=False).last_hidden_state
        # under a device map the last layer and the output head may sit on other devices
        logits = output_logits(model, hidden[local.to(hidden.device), pos.to(hidden.device)])
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least, fp64 kept
    token_logp = -F.cross_entropy(logits, labels.to(logits.device), reduction="none")
    return torch.zeros(len(rows), dtype=token_logp.dtype, device=token_logp.device).index_add(
        0, local.to(token_logp.device), token_logp
    )


def _root_logits(
    model: nn.Module, input_ids: torch.Tensor, local: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """Logits at the scored positions through the model's own (root) forward: the path of an
    FSDP2-sharded model, whose root forward all-gathers the parameters outside the decoder
    blocks (embedding, final norm, head) and registers their reduce-scatter — calling the
    backbone and the head separately would bypass both (docs/distributed.md). The head runs
    only at the scored positions (``logits_to_keep`` as a boolean ``[rows, width]`` mask, whose
    row-major order is ``predicting_positions``' order); the forward applies soft-capping."""
    keep = torch.zeros(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    keep[local.to(keep.device), pos.to(keep.device)] = True
    return model(input_ids=input_ids, use_cache=False, logits_to_keep=keep).logits
