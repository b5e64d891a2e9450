"""The output head cdscope applies to final hidden states, and its check against the model.

``cdscope.core.likelihood`` runs the decoder stack once and the output head only at the
positions that predict target tokens (SPEC §2), which means re-doing what the causal-LM
wrapper's forward does after the stack: the LM head and Gemma-style soft-capping. Other
wrappers transform the logits further (Cohere multiplies them by ``logit_scale``,
Granite divides them by ``logits_scaling``, Falcon-H1 multiplies by
``lm_head_multiplier``, others slice the vocabulary) and a missed transform changes every
log-likelihood and C silently. So the proof (``cdscope.core.models.proof``) runs
``own_head``: the head path on the backbone's hidden states must give the model's own
logits, ``max |ours - theirs| <= 8 eps(dtype) * max |theirs|`` (the same matmul on
another shape rounds differently, by far less; a transform that is not the identity
moves logits by a fraction of their size: Cohere's 0.0625 by 94 %). Where it does not,
the likelihood runs the model's own forward instead (``logits_to_keep`` as a mask) —
exact for any wrapper, without the float32 head below.

Mixed precision (issue 24, docs/precision.md): for a bfloat16 / float16 model the head
runs in float32 (its weight cast ``HEAD_CHUNK`` rows at a time, so the extra memory is
bounded): a logit of 20 rounded to bfloat16 is off by up to 0.06.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from cdscope.core.models.discovery import tolerance

#: vocabulary rows of a half-precision output head cast to float32 at a time
HEAD_CHUNK = 16384


def output_logits(model: nn.Module, hidden: torch.Tensor, wide: bool = True) -> torch.Tensor:
    """The model's output head on final hidden states (with Gemma-style soft-capping); in
    float32 for bfloat16 / float16 models when ``wide`` (a plain ``nn.Linear`` head whose
    weight is resident: under an accelerate hook the head runs as it is)."""
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


def backbone(model: nn.Module, blocks_path: str) -> nn.Module:
    """The decoder stack under the LM head: ``base_model``, or where that is the causal-LM
    wrapper itself (Llama-4, Mllama) the module holding the decoder blocks at ``blocks_path``."""
    base = model.base_model
    if base is model:
        path = blocks_path.rpartition(".")[0]
        base = model.get_submodule(path) if path else model
    return base


def own_head(model: nn.Module, blocks_path: str, ids: torch.Tensor, logits: torch.Tensor) -> bool:
    """Whether ``output_logits`` (in the model's dtype) on the backbone's last hidden state
    for ``ids`` gives ``logits``, the model's own (see the module docstring for the bound)."""
    with torch.no_grad():
        try:
            hidden = backbone(model, blocks_path)(input_ids=ids, use_cache=False)
            ours = output_logits(model, hidden.last_hidden_state, wide=False)
        except Exception:  # noqa: BLE001 - no separable stack and head: the model's forward
            return False
    if ours.shape != logits.shape:  # a wrapper that slices the vocabulary
        return False
    bound = tolerance(logits.dtype) * logits.double().abs().max().item()
    return (ours.double() - logits.double()).abs().max().item() <= bound
