"""inspect: the discovered and proven layout of a model (issue 12; SPEC §1).

What a user runs first on a new checkpoint: per layer the residual writes (gate module
paths, roles, post-norms, parallel reads, residual multipliers), K, the proof at load
(``cdscope.core.models.proof``), whether exact second-order gradients need ``--attn eager``,
whether eap-info supports the model (``cdscope.core.eap_graph.eap_support``) and, where it
does, the paths through which each write node reads the stream (q/k/v, q/kv or in).
"""

from __future__ import annotations

import time

from cdscope.core.eap_graph import eap_support_and_plan
from cdscope.core.models.architecture import Architecture, architecture_of
from cdscope.core.models.loading import LoadedModel
from cdscope.core.models.opening import ModelOptions
from cdscope.settings.names import SUBLAYER


def second_order_note(loaded: LoadedModel, arch: Architecture) -> str:
    """Whether the exact double backward (gradcheck, exact regulariser) needs eager attention."""
    if not any(w.role == "attn" for w in arch.writes):
        return "no attention: exact second-order gradients work as loaded"
    impl = getattr(loaded.model.config, "_attn_implementation", None) or "unknown"
    if impl == "eager":
        return "eager attention: exact second-order gradients work as loaded"
    return f"loaded with {impl} attention: exact second-order gradients need --attn eager"


def describe(loaded: LoadedModel, arch: Architecture, seconds: float) -> dict:
    """The JSON-ready record of ``arch`` (one entry per layer)."""
    eap, plan = eap_support_and_plan(loaded.model, arch)
    layers = []
    for layer in range(arch.num_layers):
        writes = [
            {
                "gate": k,
                "role": w.role,
                "module": w.path,
                SUBLAYER: w.sublayer,
                "post_norm": w.post_norm,
                "parallel": w.parallel,
                "scale": w.scale,
                # several residual streams: how the write enters them (core/models/streams.py)
                "streams": (
                    f"expanded by {w.expand.rsplit('.', 1)[-1]}"
                    + (f", mixed carry of {w.mix.path.rsplit('.', 1)[-1]}" if w.mix else "")
                    if w.expand
                    else ""
                ),
                "pre_norm": w.pre_norm,
                "readers": list(w.readers),
                "eap_paths": list(plan[k].paths) if plan else [],
            }
            for k, w in enumerate(arch.writes)
            if w.layer == layer
        ]
        layers.append({"layer": layer, "writes": writes})
    return {
        "model": loaded.name,
        "source": loaded.source,
        "model_type": arch.model_type,
        "blocks": arch.blocks_path,
        "num_layers": arch.num_layers,
        "K": arch.K,
        "source_of_layout": arch.source,
        "final_norm": arch.final_norm,
        # h_0 is this module's output (inside block 0: RWKV's pre_ln), else the blocks' input
        "stream_start": arch.stream_start,
        "proof": {**arch.proof.as_dict(), "discovery_and_proof_s": round(seconds, 3)},
        "second_order": second_order_note(loaded, arch),
        "eap_info": eap,
        "layers": layers,
    }


def run_inspect(model: str, options: ModelOptions = ModelOptions(device="cpu")) -> dict:
    """Load ``model`` (on the CPU unless ``options`` say otherwise), discover and prove its
    writes, and describe them."""
    loaded = options.load(model)
    start = time.perf_counter()
    arch = architecture_of(loaded.model)
    return describe(loaded, arch, time.perf_counter() - start)
