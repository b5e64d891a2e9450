"""Coverage: every causal-LM ``model_type`` of the installed transformers, measured (issues 12, 24).

A developer tool (nothing in the library imports ``cdscope.tools``). For each type in
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny random config is built
(``cdscope.tools.tiny.tiny_config``: one generic set of small sizes, plus the per-type
tweaks in ``TWEAKS``),
the model is instantiated, saved with ``save_pretrained`` (float32, with a byte-level
tokenizer) and loaded back by path through cdscope's own loader, the way users load
checkpoints (``load_model``: the experts kernel, attention kernel and dtype handling of
``from_pretrained``). Then

1. discovery + proof (``architecture_of``) run on the checkpoint loaded in each of
   ``DTYPES`` (float32, bfloat16, float16, float64): the dtype columns of the page;
2. on the float64 load, inside ``float64_throughout`` (no float32 step left in the
   forward, see ``cdscope.core.models.float64``), C of a two-family, four-row random batch
   by autograd is compared with fourth-order central finite differences on three gates
   at the steps ``FD_STEPS`` (the best agreement counts: a large step can cross a ReLU kink
   near g = 1; MoE routing is held at the nominal experts, ``cdscope.core.routing``, and a
   step that changes routing it cannot hold, PhiMoE's, is left out); the relative error
   must be <= ``FD_TOLERANCE``;
3. whether eap-info supports it (``cdscope.core.eap.eap_support``).

A type is ``supported`` when it loads, is proven in float32 and float64 and passes 2;
otherwise ``refused`` with a one-line reason. ``docs/architectures.md`` is rendered from
these rows (``python -m cdscope.tools.coverage_page --write docs/architectures.md``;
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

from cdscope.tools.tiny import random_batch, save_checkpoint, tiny_model

#: largest relative error of autograd C against finite differences in float64 throughout
#: (see the module docstring for the floor and the gap it sits in)
FD_TOLERANCE = 1e-6
#: a guard against a type that hangs, not a speed test: the slowest measured type takes
#: 22 s on one CPU thread here (cpmant; all 189 in 212 s), so a machine 10x slower draws no
#: row differently (a type known to take longer would go in ``NOT_MEASURED``)
TYPE_BUDGET_S = 600
#: finite-difference (step, stencil order) pairs tried, the best agreement counts: a stencil
#: spanning an MoE routing switch or a ReLU kink near g = 1 is off by up to 1e-2 (measured:
#: Aria at 1e-3, CTRL and OPT up to 1e-4), so the steps go down to 1e-6, where rounding in
#: float64 contributes ~1e-16 * |l| / h ~ 2e-9 (second order: the narrowest stencil)
FD_STEPS = ((1e-2, 4), (1e-3, 4), (1e-4, 4), (1e-5, 2), (1e-6, 2))
#: the dtypes each type is loaded and proven in (the page's dtype columns)
DTYPES = ("float32", "bfloat16", "float16", "float64")


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


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:160].replace("|", "/")


def fd_error(gm, batch, fast: np.ndarray, gates: list[int]) -> float:  # noqa: ANN001
    """Relative error of ``fast`` (autograd dl_m/dg on ``gates``, ``[M, len(gates)]``)
    against the best of the ``FD_STEPS`` central differences; call it float64 throughout."""
    from cdscope.core.control import control_finite_difference
    from cdscope.errors import CdscopeError

    errors, refusal = [], None
    for step, order in FD_STEPS:
        try:
            slow = control_finite_difference(gm, batch, step, order=order, gates=gates)
        except CdscopeError as exc:  # a step across a routing switch it cannot hold (PhiMoE)
            refusal = exc
            continue
        diff = np.linalg.norm(fast - slow.dl_dg[:, gates])
        errors.append(float(diff / max(np.linalg.norm(slow.dl_dg[:, gates]), 1e-300)))
    if not errors:
        raise refusal
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
    return None, reason[:400].replace("|", "/")


def check_type(model_type: str) -> Row:
    """Build, save, load by path in every dtype, prove, C autograd vs finite differences,
    eap support -> a Row."""
    import tempfile

    from cdscope.core.eap import eap_support

    try:
        model = tiny_model(model_type)
    except Exception as exc:  # noqa: BLE001 - the row records why it could not be built
        note = explained(model_type, f"does not build: {_reason(exc)}")
        return Row(model_type, "refused", "", 0, "no", note)
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
    for needed in ("float32", "float64"):  # the float32 reason first: the plainer load
        if needed not in proven:
            note = explained(model_type, failed[needed].removeprefix("CdscopeError: "))
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
    if any(w.mix for w in arch.writes):
        notes.append("several residual streams (expanded writes, mixed carry)")
    elif any(w.expand for w in arch.writes):
        notes.append("several residual streams (expanded writes)")
    if not arch.proof.own_head:
        notes.append("logits through the model's forward")
    notes += [f"{dtype}: {failed[dtype]}" for dtype in DTYPES if dtype in failed]
    eap = eap_support(model, arch)
    return Row(model_type, "supported", roles, arch.K, eap, "; ".join(notes), dtypes, fd_err)


#: what a measured refusal means, where the measured reason alone does not say it:
#: ``model_type -> (text the measured reason contains, the explanation)``; the explanation
#: leads the row only while the measured reason still contains that text, and each is
#: measured again by tests/tools/test_refusals.py
EXPLAINED: dict[str, tuple[str, str]] = {
    **{
        t: (
            "producing a cache is different",
            "a speculative-decoding drafter: its forward takes the target model's "
            "inputs_embeds and shared_kv_states, not token ids, and every layer reuses a "
            "key/value cache no layer of its own produces, which transformers refuses to "
            "build from the config",
        )
        for t in ("gemma4_assistant", "gemma4_unified_assistant")
    },
    **{
        t: (
            "Unrecognized configuration class",
            "an audio-codebook decoder, not a text LM: input_ids hold num_codebooks rows "
            "per sample that its embedding sums into one stream (rows of a sample are not "
            "independent sequences), and AutoModelForCausalLM does not load its decoder "
            "config",
        )
        for t in ("musicgen", "musicgen_melody")
    },
    "gemma3n": (
        "requires the timm library",
        "the multimodal Gemma-3n: its vision tower needs timm (not a cdscope dependency); "
        "its text decoder is gemma3n_text's (refused: AltUp's mixed streams)",
    ),
    "prophetnet": (
        "feed_forward_layer_norm's output plus module outputs",
        "the decoder of ProphetNet's encoder-decoder (ProphetNetForCausalLM drops the "
        "encoder): its blocks are post-LN, their hidden state holds the main stream and "
        "ngram = 2 predicting streams side by side on the sequence axis (3 x T positions), "
        "and the logits read the first predicting stream, not the main one",
    ),
    "reformer": (
        "a reversible residual",
        "reversible residual layers (RevNet): two half-streams, Y1 = X1 + attention(X2) "
        "and Y2 = X2 + feed_forward(Y1), concatenated to 2 x hidden_size before the LM "
        "head; its layers also run under torch.no_grad (a custom backward recomputes them "
        "and asserts model.train()), so no gradient reaches a gate in eval",
    ),
    "xlnet": (
        "ff.layer_norm's output plus module outputs",
        "a permutation LM, not a causal decoder: with its default attn_type 'bi' and no "
        "perm_mask every position attends to later tokens, its query stream (two-stream "
        "attention) runs only given target_mapping, and the content stream's blocks are "
        "post-LN",
    ),
    "cpmant": (
        "the model is not causal",
        "CPM-Ant's causal-LM forward marks every position as context (context = 1), and "
        "its attention mask lets context positions see every other position: scored "
        "teacher-forced, each answer token's logits would see the answer",
    ),
    "xglm": (
        "cannot be converted to type float without overflow",
        "its attention builds float64's most negative value with torch.full and no "
        "dtype (a float32 tensor): the float64 forward fails (float32, bfloat16, "
        "float16 run)",
    ),
}


def explained(model_type: str, note: str) -> str:
    """``note`` (a measured refusal) led by its ``EXPLAINED`` meaning where it applies."""
    needle, meaning = EXPLAINED.get(model_type, ("", ""))
    return f"{meaning} (measured: {note})" if meaning and needle in note else note


#: types whose tiny config took over 120 s to build and run on one CPU thread (measured
#: once; listed so that the generated page does not depend on the machine's speed): none
#: since issue 31 shrank blt's, kimi_linear's and phi4_multimodal's sub-configs
NOT_MEASURED: tuple[str, ...] = ()


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
