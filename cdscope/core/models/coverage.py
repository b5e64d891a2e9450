"""Coverage: every causal-LM ``model_type`` of the installed transformers, measured (issue 12).

For each type in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny random config is built
(``tiny_config``: one generic set of small sizes, plus the per-type tweaks in ``TWEAKS``),
the model is instantiated in float64, and

1. discovery + proof (``architecture_of``) run;
2. C of a two-family, four-row random batch is measured by autograd and by central
   finite differences on a few gates (``control_finite_difference``, h = 1e-2, order 4);
   the relative error must be <= ``FD_TOLERANCE``;
3. whether eap-info supports it (``cdscope.core.eap.eap_support``).

The outcome per type is ``supported`` or ``refused`` with a one-line reason.
``docs/architectures.md`` is rendered from these rows (``python -m cdscope.core.models.coverage
--write docs/architectures.md``); the table is deterministic (fixed seeds, no timings).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import signal
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import torch

FD_TOLERANCE = 1e-3
TYPE_BUDGET_S = 60
#: finite-difference steps tried (the better agreement counts): 1e-2 keeps the rounding of
#: fp32-internal norms small; smaller steps stay clear of MoE routing switches and ReLU
#: kinks near g = 1
FD_STEPS = (1e-2, 1e-3, 1e-4)
VOCAB = 512
#: generic tiny sizes, passed to every config (unknown keys are ignored by the models)
SMALL: dict = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    n_group=1,
    first_k_dense_replace=1,
    topk_group=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    state_size=8,
    ssm_state_size=8,
    mamba_d_state=8,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_d_ssm=128,
    mamba_chunk_size=16,
    chunk_size=16,
    num_heads=8,
    n_groups=1,
    time_step_rank=8,
    conv_kernel=4,
    expand=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    residual_in_fp32=False,
    tie_word_embeddings=False,
)
#: per-type changes to SMALL where the generic sizes do not instantiate or hide a feature
#: (a value of None removes the key: the config derives it and refuses it as an argument)
TWEAKS: dict[str, dict] = {
    "jamba": dict(
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1
    ),
    "gpt_neox": dict(use_parallel_residual=True),
    "gptj": dict(rotary_dim=8),
    **{  # multi-head latent attention: as many key/value heads as query heads
        t: dict(num_key_value_heads=4)
        for t in (
            "deepseek_v2",
            "deepseek_v3",
            "deepseek_v32",
            "glm4_moe_lite",
            "glm_moe_dsa",
            "minicpm3",
            "longcat_flash",
            "axk1",
            "axk2",
            "kimi_linear",
        )
    },
    "codegen": dict(rotary_dim=8),
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "gemma4": dict(head_dim=None),
    "gemma4_text": dict(head_dim=None),
    "gemma4_unified": dict(head_dim=None),
    "gemma4_unified_text": dict(head_dim=None),
    "falcon": dict(head_dim=None, new_decoder_architecture=True, num_kv_heads=2),
}


@dataclass(frozen=True)
class Row:
    model_type: str
    status: str  # "supported" | "refused"
    roles: str  # roles of the layers, e.g. "attn+mlp | attn+moe"
    K: int  # noqa: N815
    eap: str  # "yes" | reason
    note: str  # refusal reason, fd error, scales, parallel


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str):  # noqa: ANN201
    """A small random config of ``model_type`` (text sub-config shrunk too)."""
    from transformers import AutoConfig

    kwargs = {k: v for k, v in {**SMALL, **TWEAKS.get(model_type, {})}.items() if v is not None}
    config = AutoConfig.for_model(model_type, **kwargs)
    text = config.get_text_config()
    if text is not config:
        sub_type = getattr(text, "model_type", None)
        fresh = AutoConfig.for_model(sub_type, **{**kwargs, **TWEAKS.get(sub_type, {})})
        for key, value in fresh.to_dict().items():
            if hasattr(text, key) and key not in ("model_type", "architectures"):
                with contextlib.suppress(AttributeError, TypeError, ValueError):
                    setattr(text, key, value)
    for key in ("use_cache",):
        setattr(config, key, False)
    return config


def tiny_model(model_type: str, seed: int = 0):  # noqa: ANN201
    """The float64 random model of ``tiny_config`` (weights scaled so gates matter)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(model_type)
    if getattr(config, "is_encoder_decoder", False):
        from cdscope.errors import CdscopeError

        raise CdscopeError(f"{model_type} is an encoder-decoder model: decoder-only only")
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager"
    )
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(2.0)
    return model


def random_batch(seed: int = 0):  # noqa: ANN201
    """Two families x two rows of random tokens, 7-10 tokens with 3-4 target tokens."""
    from cdscope.core.batch import ProbeBatch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([10, 8, 9, 7])
    ids = torch.randint(3, VOCAB, (4, 10), generator=gen)
    ids[torch.arange(10)[None, :] >= lengths[:, None]] = 0
    return ProbeBatch(
        input_ids=ids,
        lengths=lengths,
        target_start=lengths - torch.tensor([4, 3, 3, 4]),
        families=["a", "b"],
        row_family=torch.tensor([0, 0, 1, 1]),
        item_ids=["a/0", "a/1", "b/0", "b/1"],
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:160].replace("|", "/")


def _fd_error(gm, batch, fast: np.ndarray, gates: list[int], step: float) -> float:  # noqa: ANN001
    from cdscope.core.control import control_finite_difference

    slow = control_finite_difference(gm, batch, step=step, order=4, gates=gates).dl_dg[:, gates]
    return float(np.linalg.norm(fast - slow) / max(np.linalg.norm(slow), 1e-300))


def check_type(model_type: str) -> Row:
    """Build, discover, prove, C autograd vs finite differences, eap support -> a Row."""
    from cdscope.core.control import control_autograd
    from cdscope.core.eap import eap_support
    from cdscope.core.gates import GatedModel
    from cdscope.core.models.adapters import architecture_of
    from cdscope.errors import CdscopeError

    try:
        model = tiny_model(model_type)
    except Exception as exc:  # noqa: BLE001 - the row records why it could not be built
        return Row(model_type, "refused", "", 0, "no", f"does not build: {_reason(exc)}")
    try:
        arch = architecture_of(model)
    except CdscopeError as exc:
        return Row(model_type, "refused", "", 0, "no", _reason(exc).removeprefix("CdscopeError: "))
    except Exception as exc:  # noqa: BLE001
        return Row(model_type, "refused", "", 0, "no", f"forward fails: {_reason(exc)}")
    layers = [arch.roles(layer) for layer in range(arch.num_layers)]
    roles = " / ".join("+".join(r) for r in layers)
    gates = sorted({0, arch.K - 1, arch.K // 2})
    try:
        batch = random_batch()
        with GatedModel(model, arch) as gm:
            fast = control_autograd(gm, batch).dl_dg[:, gates]
            fd_err = min(_fd_error(gm, batch, fast, gates, step) for step in FD_STEPS)
    except Exception as exc:  # noqa: BLE001
        return Row(model_type, "refused", roles, arch.K, "no", f"C fails: {_reason(exc)}")
    if not fd_err <= FD_TOLERANCE:
        note = f"autograd vs finite differences rel. error {fd_err:.0e} > {FD_TOLERANCE:.0e}"
        return Row(model_type, "refused", roles, arch.K, "no", note)
    notes = []
    if any(w.parallel for w in arch.writes):
        notes.append("parallel residual")
    if any(w.post_norm for w in arch.writes):
        notes.append("post-sublayer norms")
    if any(w.scale != 1.0 for w in arch.writes):
        notes.append("residual multiplier")
    notes.append(f"C vs FD < 1e-{min(6, int(-math.log10(max(fd_err, 1e-300))))}")
    return Row(model_type, "supported", roles, arch.K, eap_support(model, arch), "; ".join(notes))


#: types whose tiny config still takes over TYPE_BUDGET_S to build and run on one CPU thread
#: (measured once; listed so that the generated page does not depend on the machine's speed)
NOT_MEASURED = ("blt", "kimi_linear", "phi4_multimodal")


class _Timeout(BaseException):  # not caught by check_type's `except Exception`
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout


def run(types: list[str] | None = None, budget_s: int = TYPE_BUDGET_S) -> list[Row]:
    """Rows of every causal-LM type (quietly: the models' own output is dropped); a type
    that takes over ``budget_s`` seconds at tiny size is refused as too slow."""
    import transformers.models.auto.modeling_auto  # noqa: F401 - imports outside the budget

    import cdscope.core.control  # noqa: F401
    import cdscope.core.eap  # noqa: F401

    rows = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for model_type in types or causal_lm_types():
            quiet = (
                contextlib.redirect_stderr(io.StringIO()),
                contextlib.redirect_stdout(io.StringIO()),
            )
            with warnings.catch_warnings(), quiet[0], quiet[1]:
                warnings.simplefilter("ignore")
                signal.alarm(budget_s)
                try:
                    if model_type in NOT_MEASURED:
                        raise _Timeout
                    rows.append(check_type(model_type))
                except _Timeout:
                    note = f"too slow at tiny size (> {budget_s} s on one CPU thread)"
                    rows.append(Row(model_type, "refused", "", 0, "no", note))
                finally:
                    signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return rows


def _compress(roles: str) -> str:
    layers = roles.split(" / ")
    return layers[0] if len(set(layers)) == 1 else roles


def render(rows: list[Row]) -> str:
    """The Markdown page ``docs/architectures.md``."""
    import transformers

    from cdscope.core.models.adapters import ROLES

    ok = [r for r in rows if r.status == "supported"]
    moe = [r for r in ok if "moe" in r.roles]
    hybrid = [r for r in ok if "mixer" in r.roles]
    eap = [r for r in ok if r.eap == "yes"]
    lines = [
        "# Architectures",
        "",
        "Generated by `python -m cdscope.core.models.coverage --write docs/architectures.md` "
        f"(transformers {transformers.__version__}); `tests/core/models/test_coverage.py` fails when this "
        "page is stale. Every `model_type` of transformers' causal-LM mapping is built from "
        "a tiny random config (2 layers, width 64, float64), its residual writes are "
        "discovered and proven (`cdscope inspect`), and C by autograd is compared with "
        "fourth-order finite differences on three gates (must agree to <= 1e-3).",
        "",
        f"**{len(ok)} of {len(rows)} types supported** — {len(moe)} with MoE blocks, "
        f"{len(hybrid)} with SSM / linear-attention / convolution mixers; eap-info supports "
        f"{len(eap)}. Roles: {', '.join(ROLES)}; layers are separated by `/` when they differ.",
        "",
        "| type | status | roles per layer | K | eap-info | notes |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model_type} | {r.status} | {_compress(r.roles)} | {r.K or ''} | {r.eap} | {r.note} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", help="write the Markdown page here")
    parser.add_argument("types", nargs="*", help="only these model types (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = run(args.types or None)
    page = render(rows)
    if args.write:
        from pathlib import Path

        from cdscope.io import atomic_write_bytes

        atomic_write_bytes(args.write, lambda tmp: Path(tmp).write_text(page))
    else:
        sys.stdout.write(page)


if __name__ == "__main__":
    main()
