"""Target log-likelihood of a probe batch under a (gated) model (SPEC §2).

    log pi(y* | x; g) = sum_t log softmax(logits)[t, y*_t]   over target tokens only

The backbone runs once; the output head is applied only at the positions that predict
target tokens (a fraction of the sequence — the vocabulary projection is the largest
matmul of a small model), in float32 for bfloat16 / float16 models, and the log-softmax
is taken in fp32 (fp64 for float64 models). Where that head is not the model's own (the
proof's ``own_head``: Cohere's ``logit_scale``, Granite's ``logits_scaling``, ...) and
for an FSDP2-sharded model, the model's own forward computes the logits instead
(``cdscope.core.models.head``, docs/precision.md).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from cdscope.core.batch import ProbeBatch
from cdscope.core.models.architecture import architecture_of, check_fits
from cdscope.core.models.head import backbone, output_logits
from cdscope.distributed import is_sharded


def row_target_logprobs(model: nn.Module, batch: ProbeBatch, rows: torch.Tensor) -> torch.Tensor:
    """``[len(rows)]`` tensor: log pi(y* | x) of each row, summed over its target tokens.

    Differentiable with respect to anything the forward depends on (gates included).
    Padding is trimmed to the longest row of ``rows``.
    """
    width = int(batch.lengths[rows].max())
    check_fits(model, width, "a probe row (prompt + target)", "use shorter probe items")
    input_ids = batch.input_ids[rows.to(batch.input_ids.device), :width]
    local, pos, labels = batch.predicting_positions(rows)
    arch = None if is_sharded(model) else architecture_of(model)
    if arch is None or not getattr(arch.proof, "own_head", True):
        logits = _root_logits(model, input_ids, local, pos)
    else:
        hidden = backbone(model, arch.blocks_path)(input_ids=input_ids, use_cache=False)
        hidden = hidden.last_hidden_state
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
    """Logits at the scored positions through the model's own (root) forward: the path of a
    model whose wrapper transforms the logits after its head (``own_head`` false) and of an
    FSDP2-sharded model, whose root forward all-gathers the parameters outside the decoder
    blocks (embedding, final norm, head) and registers their reduce-scatter — calling the
    backbone and the head separately would bypass both (docs/distributed.md). The head runs
    only at the scored positions (``logits_to_keep`` as a boolean ``[rows, width]`` mask, whose
    row-major order is ``predicting_positions``' order) where the forward takes it."""
    local, pos = local.to(input_ids.device), pos.to(input_ids.device)
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return model(input_ids=input_ids, use_cache=False).logits[local, pos]
    keep = torch.zeros(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    keep[local, pos] = True
    return model(input_ids=input_ids, use_cache=False, logits_to_keep=keep).logits
