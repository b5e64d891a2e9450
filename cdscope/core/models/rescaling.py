"""RWKV's inference rescaling, turned off so eval and training compute one function (issue 31).

transformers' RWKV (``config.rescale_every = R > 0``, 6 by default and in the RWKV-4
checkpoints) keeps two forms of the same weights. In training mode the blocks are plain
residual blocks (SPEC §1). On the first forward in eval mode it divides block l's two
output projections (``attention.output``, ``feed_forward.value``) by ``2^(l // R)`` in
place and halves the stream after every R-th block (a float16 overflow guard); back in
training mode it multiplies the weights again. Both are powers of two, so block l of the
eval form sees exactly ``h_l / 2^(l // R)`` and writes exactly its writes divided by the
same factor, except that every LayerNorm reading the scaled stream then adds its epsilon
to ``var / 4^(l // R)`` instead of ``var``: the two forms differ by LayerNorm's epsilon
alone (measured: ``docs/decisions.md``). The halving between blocks is no residual
write, and the proof's zero-gate check refuses it ("something else writes to the
residual stream").

``unscaled`` therefore gives the model the training form for good: weights already
divided by an eval forward are multiplied back (by transformers' own ``_rescale_layers``,
exact) and ``rescale_every`` is set to 0, so every later forward, in eval or training
mode, is the plain residual decoder that training optimises and the proof checks.
Detected by the attributes of that mechanism (``layers_are_rescaled``,
``_rescale_layers``), not by ``model_type``.
"""

from __future__ import annotations

from torch import nn

from cdscope.core.models import discovery as d


def unscaled(model: nn.Module) -> bool:
    """Turn the inference rescaling of ``model`` off (see the module docstring); True when
    it was on."""
    config = d.text_config(model)
    every = getattr(config, "rescale_every", None)
    owners = [
        m
        for m in model.modules()
        if hasattr(m, "layers_are_rescaled") and callable(getattr(m, "_rescale_layers", None))
    ]
    if not isinstance(every, int) or every <= 0 or not owners:
        return False
    for owner in owners:
        if owner.layers_are_rescaled:  # an eval forward divided the weights: undo it
            training = owner.training
            owner.training = True
            try:
                owner._rescale_layers()
            finally:
                owner.training = training
    config.rescale_every = 0
    return True
