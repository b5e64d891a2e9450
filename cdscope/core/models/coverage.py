"""Coverage: every causal-LM ``model_type`` of the installed transformers, measured (issues 12, 24).

For each type in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny random config is built
(``tiny_config``: one generic set of small sizes, plus the per-type tweaks in ``TWEAKS``),
the model is instantiated, saved with ``save_pretrained`` (float32, with a byte-level
tokenizer) and loaded back by path through cdscope's own loader, the way users load
checkpoints (``load_model``: the experts kernel, attention kernel and dtype handling of
``from_pretrained``). Then

1. discovery + proof (``architecture_of``) run on the checkpoint loaded in each of
   ``DTYPES`` (float32, bfloat16, float16, float64): the dtype columns of the page;
2. on the float64 load, inside ``float64_throughout`` (no float32 step left in the
   forward, see ``cdscope.core.models.float64``), C of a two-family, four-row random batch
   by autograd is compared with fourth-order central finite differences on three gates
   at the steps ``FD_STEPS`` (the best agreement counts: a large step can cross an MoE
   routing switch or a ReLU kink near g = 1); the relative error must be <= ``FD_TOLERANCE``;
3. whether eap-info supports it (``cdscope.core.eap.eap_support``).

A type is ``supported`` when it loads, is proven in float32 and float64 and passes 2;
otherwise ``refused`` with a one-line reason. ``docs/architectures.md`` is rendered from
these rows (``python -m cdscope.core.models.coverage --write docs/architectures.md``;
``--check`` exits 1 when the page is stale). The rows hold no measured number that
rounding could move across a line, nor a temporary path or a timing: the
finite-difference check has float64's own floor (worst supported type 1.7e-9, nanochat,
against a 1e-6 bound: 580x; no type is refused by it), the dtype columns are proofs whose
tolerance bounds the rounding they allow with a margin of 2 (``discovery.tolerance``), and
the time budget only guards against a hang (``TYPE_BUDGET_S``).
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

#: largest relative error of autograd C against finite differences in float64 throughout
#: (see the module docstring for the floor and the gap it sits in)
FD_TOLERANCE = 1e-6
#: a guard against a type that hangs, not a speed test: the slowest measured type takes
#: 53 s on one CPU thread here (gemma4_text), so a machine 10x slower still draws no
#: row differently (the types known to take longer are ``NOT_MEASURED``)
TYPE_BUDGET_S = 600
#: finite-difference (step, stencil order) pairs tried, the best agreement counts: a stencil
#: spanning an MoE routing switch or a ReLU kink near g = 1 is off by up to 1e-2 (measured:
#: Aria at 1e-3, CTRL and OPT up to 1e-4), so the steps go down to 1e-6, where rounding in
#: float64 contributes ~1e-16 * |l| / h ~ 2e-9 (second order: the narrowest stencil)
FD_STEPS = ((1e-2, 4), (1e-3, 4), (1e-4, 4), (1e-5, 2), (1e-6, 2))
#: the dtypes each type is loaded and proven in (the page's dtype columns)
DTYPES = ("float32", "bfloat16", "float16", "float64")
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
    note: str  # refusal reason, scales, parallel, dtypes not proven
    dtypes: tuple[str, ...] = ()  # the DTYPES the checkpoint loads and is proven in
    #: autograd vs finite differences (relative; NaN when not measured): reported by the
    #: full run's summary, never rendered (its last digits follow the CPU's rounding)
    fd_error: float = field(default=float("nan"), compare=False)


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


def byte_tokenizer():  # noqa: ANN201
    """A real fast tokenizer, one token per character (code points < 256) and three
    specials (ids 256-258), saved with every tiny checkpoint so it loads like a user's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(c): c for c in range(256)} | {"<s>": 256, "</s>": 257, "<pad>": 258}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def save_checkpoint(model, directory, dtype: torch.dtype = torch.float32):  # noqa: ANN001, ANN201
    """``model`` saved in ``dtype`` with ``save_pretrained`` and the byte tokenizer: a
    directory ``cdscope --model DIR`` loads like any user's checkpoint."""
    model.to(dtype).save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:160].replace("|", "/")


def fd_error(gm, batch, fast: np.ndarray, gates: list[int]) -> float:  # noqa: ANN001
    """Relative error of ``fast`` (autograd dl_m/dg on ``gates``, ``[M, len(gates)]``)
    against the best of the ``FD_STEPS`` central differences; call it float64 throughout."""
    from cdscope.core.control import control_finite_difference

    errors = []
    for step, order in FD_STEPS:
        slow = control_finite_difference(gm, batch, step, order=order, gates=gates)
        diff = np.linalg.norm(fast - slow.dl_dg[:, gates])
        errors.append(float(diff / max(np.linalg.norm(slow.dl_dg[:, gates]), 1e-300)))
    return min(errors)


def fd_agreement(model) -> float:  # noqa: ANN001
    """Relative error of autograd C against finite differences (``fd_error``) on three
    gates (first, middle, last) of ``random_batch``, float64 throughout (the model is
    cast to float64 first: transformers keeps some modules, e.g. MoE routers, in float32)."""
    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.models.architecture import architecture_of
    from cdscope.core.models.float64 import float64_throughout

    model.to(torch.float64)
    arch = architecture_of(model)
    gates = sorted({0, arch.K - 1, arch.K // 2})
    batch = random_batch()
    with float64_throughout(), GatedModel(model, arch) as gm:
        return fd_error(gm, batch, control_autograd(gm, batch).dl_dg[:, gates], gates)


def _load_and_prove(directory, dtype: str):  # noqa: ANN001, ANN202
    """The checkpoint loaded by path in ``dtype`` and its proven architecture, or the
    one-line reason it is not proven."""
    from cdscope.core.models.architecture import architecture_of
    from cdscope.core.models.loading import load_model
    from cdscope.errors import CdscopeError

    try:
        loaded = load_model(str(directory), device="cpu", dtype=dtype)
        return loaded.model, architecture_of(loaded.model)
    except CdscopeError as exc:
        reason = str(exc).splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - the row records why
        reason = f"forward fails: {_reason(exc)}"
    # neither the temporary directory's random name nor the closest fit of a refused
    # block (its names and error follow the CPU's rounding when two fits nearly tie:
    # openai-gpt's attn vs attn.c_proj) may make the page differ between runs
    reason = re.sub(r" \(closest: [^()]*\)", "", reason.replace(str(directory), "DIR"))
    return None, reason[:160].replace("|", "/")


def check_type(model_type: str) -> Row:
    """Build, save, load by path in every dtype, prove, C autograd vs finite differences,
    eap support -> a Row."""
    import tempfile

    from cdscope.core.eap import eap_support

    try:
        model = tiny_model(model_type)
    except Exception as exc:  # noqa: BLE001 - the row records why it could not be built
        return Row(model_type, "refused", "", 0, "no", f"does not build: {_reason(exc)}")
    proven: dict[str, object] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="cdscope-coverage-") as directory:
        try:
            save_checkpoint(model, directory)
        except Exception as exc:  # noqa: BLE001
            return Row(model_type, "refused", "", 0, "no", f"does not save: {_reason(exc)}")
        model = None
        for dtype in DTYPES:
            loaded, arch = _load_and_prove(directory, dtype)
            if loaded is None:
                failed[dtype] = arch
            else:
                proven[dtype] = arch
                if dtype == "float64":
                    model = loaded  # kept for the finite differences and eap support
    dtypes = tuple(proven)
    for needed in ("float64", "float32"):
        if needed not in proven:
            note = failed[needed].removeprefix("CdscopeError: ")
            return Row(model_type, "refused", "", 0, "no", note, dtypes)
    arch = proven["float64"]
    roles = " / ".join("+".join(arch.roles(layer)) for layer in range(arch.num_layers))
    try:
        fd_err = fd_agreement(model)
    except Exception as exc:  # noqa: BLE001
        return Row(model_type, "refused", roles, arch.K, "no", f"C fails: {_reason(exc)}", dtypes)
    if not fd_err <= FD_TOLERANCE:
        note = f"autograd vs finite differences rel. error > {FD_TOLERANCE:.0e}"
        return Row(model_type, "refused", roles, arch.K, "no", note, dtypes, fd_err)
    notes = []
    if any(w.parallel for w in arch.writes):
        notes.append("parallel residual")
    if any(w.post_norm for w in arch.writes):
        notes.append("post-sublayer norms")
    if any(w.scale != 1.0 for w in arch.writes):
        notes.append("residual multiplier")
    if not arch.proof.own_head:
        notes.append("logits through the model's forward")
    notes += [f"{dtype}: {failed[dtype]}" for dtype in DTYPES if dtype in failed]
    eap = eap_support(model, arch)
    return Row(model_type, "supported", roles, arch.K, eap, "; ".join(notes), dtypes, fd_err)


#: types whose tiny config took over 120 s to build and run on one CPU thread (measured
#: once; listed so that the generated page does not depend on the machine's speed)
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
                        note = "not measured: too slow at tiny size (> 120 s on one CPU thread)"
                        rows.append(Row(model_type, "refused", "", 0, "no", note))
                    else:
                        rows.append(check_type(model_type))
                except _Timeout:
                    note = f"too slow at tiny size (> {budget_s} s on one CPU thread)"
                    rows.append(Row(model_type, "refused", "", 0, "no", note))
                finally:
                    signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return rows
