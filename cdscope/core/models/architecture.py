"""The architecture description: where each block writes into the residual stream (SPEC §1).

One description serves the gates (``cdscope.core.gating.model``), edge attribution (``cdscope.core.eap``)
and ``cdscope inspect``. For block ``l`` it lists the residual writes in call order,

    h_{l+1} = h_l + sum_k s_k * write_{l,k}          (s_k = 1 except residual multipliers)

each with the module whose forward *output* is the write (the gate site: the sublayer,
or its post-sublayer norm in Gemma-2/3 / OLMo-2 style blocks), its role (``attn``,
``mlp``, ``moe``, ``mixer``), whether it reads the block input in parallel with an
earlier write (GPT-J / GPT-NeoX / Falcon / Phi), its pre-norm and the modules inside
the sublayer that read the stream (q/k/v projections, for EAP).

The description is *discovered* from the model's own forward (``cdscope.core.models.discovery``)
and *proven* on every load (``cdscope.core.models.proof``), not looked up by ``model_type``.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from cdscope.core.models import diagnosis, rescaling, stream_start, streams, widened
from cdscope.core.models import discovery as d
from cdscope.core.models.placement import execution_device
from cdscope.errors import CdscopeError

ROLES = ("attn", "mlp", "moe", "mixer")

#: ``model_type`` -> write module paths relative to a block, in call order (see docstring).
OVERRIDES: dict[str, tuple[str, ...]] = {
    # two attention + MLP sublayer pairs and a shortcut MoE that reads the stream after the
    # first attention and writes last: five writes, past the search's four (issue 31)
    "longcat_flash": ("self_attn.0", "mlp.experts", "mlps.0", "self_attn.1", "mlps.1"),
}
#: ``model_type`` -> {sublayer path relative to a block: role} where the names mislead
#: ``discovery.role_of``: RWKV calls its time mixing ``attention`` (RwkvSelfAttention), a
#: recurrent linear attention that reads the stream through ln1 and a token shift, with no
#: q/k/v projections of the stream: a mixer, read through one path (SPEC §6)
ROLE_OVERRIDES: dict[str, dict[str, str]] = {"rwkv": {"attention": "mixer"}}


@dataclass(frozen=True)
class Write:
    """One residual write of one block (paths are ``model.named_modules()`` names)."""

    layer: int
    role: str  # one of ROLES
    path: str  # module whose output is the write: the gate site
    sublayer: str  # the sublayer producing it (== path unless post_norm)
    scale: float = 1.0  # s_k: the block adds scale * output
    post_norm: bool = False
    parallel: bool = False  # reads the block input, not the stream after earlier writes
    pre_norm: str | None = None  # module whose input is the stream the sublayer reads
    readers: tuple[str, ...] = ()  # modules inside the sublayer reading its input
    reads_stream: bool = False  # the sublayer's input is the stream itself (no pre-norm)
    #: several residual streams (``cdscope.core.models.streams``): the write enters them as
    #: ``e (x) output`` with ``e`` element ``expand_index`` of module ``expand``'s output
    expand: str | None = None
    expand_index: int = 0
    #: a mixed carry (DeepSeek-V4): the step of this write carries ``M^T H``, not ``H``
    mix: streams.Mixing | None = None


@dataclass(frozen=True)
class Architecture:
    """Blocks and residual writes of one loaded model, with the proof that they are exact."""

    model_type: str
    blocks_path: str
    num_layers: int
    writes: tuple[Write, ...]
    final_norm: str | None  # module reading the last block's output (the LM head's input)
    #: how the layout was found: "discovered", or "override" (OVERRIDES named the writes;
    #: proven like any other)
    source: str = "discovered"
    #: the module inside block 0 whose output is h_0 when block 0 normalises the embeddings
    #: first (RWKV's ``pre_ln``, ``cdscope.core.models.stream_start``); None: h_0 is the
    #: first block's input
    stream_start: str | None = None
    proof: object = field(default=None, compare=False)  # cdscope.core.models.proof.ProofResult

    @property
    def K(self) -> int:  # noqa: N802 - the SPEC's symbol
        return len(self.writes)

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return model.get_submodule(self.blocks_path)

    def write_modules(self, model: nn.Module) -> list[tuple[int, str, nn.Module]]:
        """``(layer, role, module)`` for every residual write, in gate order."""
        return [(w.layer, w.role, model.get_submodule(w.path)) for w in self.writes]

    def layer_writes(self, layer: int) -> list[Write]:
        return [w for w in self.writes if w.layer == layer]

    def roles(self, layer: int) -> tuple[str, ...]:
        return tuple(w.role for w in self.layer_writes(layer))


def _reads_block_input(trace: d.BlockTrace, sub: d.Record) -> bool:
    if d._same(sub.inp, trace.h_in):
        return True
    return any(
        d._same(r.inp, trace.h_in) and d._same(r.out, sub.inp) for r in trace.records.values()
    )


def _wire(
    model: nn.Module, layer: int, block_path: str, trace: d.BlockTrace, found: d.Fit
) -> list[Write]:
    """Roles, post-norms, parallelism, pre-norms and readers of the writes ``found``."""
    recs = trace.records
    entries = []
    for name, scale in zip(found.names, found.scales, strict=True):
        rec, sub, post = recs[name], recs[name], False
        if d.is_norm(model.get_submodule(name)):
            producers = [
                r
                for r in recs.values()
                if r.calls == 1 and r.order < rec.order and d._same(r.out, rec.inp)
            ]
            if producers:  # the latest one: equal outputs of earlier norms are coincidences
                sub, post = max(producers, key=lambda r: (r.order, -r.depth)), True
        entries.append((sub.order, name, scale, sub, post))
    writes, stream = [], trace.h_in.double()  # the stream after the writes so far
    tol = d.tolerance(trace.h_in.dtype)
    for position, (_, name, scale, sub, post) in enumerate(sorted(entries, key=lambda e: e[0])):
        parallel = position > 0 and _reads_block_input(trace, sub)
        read = trace.h_in.double() if parallel else stream
        reads_stream = (
            sub.inp is not None
            and sub.inp.shape == read.shape
            and bool((sub.inp.double() - read).abs().max() <= tol * read.abs().max())
        )
        stream = stream + scale * recs[name].out.double().reshape(stream.shape)
        pre = [
            r
            for r in recs.values()
            if r.depth == 1
            and r.order < sub.order
            and d.is_norm(model.get_submodule(r.name))
            and d._same(r.out, sub.inp)
        ]
        # the latest one; one whose output *is* the sublayer's input first (equal values
        # can be a coincidence: two freshly initialised norms of the same input)
        pre = [r for r in pre if r.out_ptr == sub.inp_ptr] or pre
        pre_norm = max(pre, key=lambda r: r.order).name if pre else None
        readers = tuple(
            r.name
            for r in sorted(recs.values(), key=lambda r: r.order)
            if r.name.startswith(sub.name + ".") and d._same(r.inp, sub.inp)
        )
        writes.append(
            Write(
                layer=layer,
                role=d.role_of(model, sub.name, block_path),
                path=name,
                sublayer=sub.name,
                scale=float(scale),
                post_norm=post,
                parallel=parallel,
                pre_norm=pre_norm,
                reads_stream=reads_stream,
                readers=readers,
            )
        )
    return writes


def _wire_expanded(
    model: nn.Module, layer: int, block_path: str, found: streams.ExpandedFit
) -> list[Write]:
    """The expanded writes of a multi-stream block (no pre-norms or readers: eap-info
    refuses several streams)."""
    return [
        Write(
            layer=layer,
            role=d.role_of(model, name, block_path),
            path=name,
            sublayer=name,
            scale=float(scale),
            expand=e.path,
            expand_index=e.index,
            mix=mix,
        )
        for name, scale, e, mix in zip(
            found.fit.names, found.fit.scales, found.expansions, found.mixings, strict=True
        )
    ]


def overflow_check(model_type: str, layer: int, h: torch.Tensor, dtype: torch.dtype) -> None:
    """Refuse hidden states whose square overflows the dtype norms compute in (float32 for
    fp32/bf16/fp16 models: |h| > 1.8e19): RMSNorm / LayerNorm then divide by inf and every
    write comes out 0, which would read as an unknown architecture. Real models keep
    |h| below ~1e4; such magnitudes mean absurdly scaled weights."""
    limit = torch.finfo(torch.promote_types(dtype, torch.float32)).max ** 0.5
    peak = float(h.detach().abs().max()) if h.numel() else 0.0
    if peak > limit:
        raise CdscopeError(
            f"{model_type}: layer {layer}: hidden states reach |h| = {peak:.1e}, whose square "
            f"overflows {str(torch.promote_types(dtype, torch.float32)).removeprefix('torch.')} "
            "in the norms: the weights are absurdly scaled (check the weights; a real model "
            "stays far below 1e19), not an unsupported architecture"
        )


def discover(model: nn.Module) -> tuple[Architecture, d.Trace, torch.Tensor]:
    """Blocks and writes of ``model`` from one captured forward (not yet proven)."""
    config = getattr(model, "config", None)
    model_type = str(getattr(config, "model_type", type(model).__name__))
    if getattr(config, "is_encoder_decoder", False):
        raise CdscopeError(
            f"{model_type} is an encoder-decoder model: cdscope gates decoder-only models"
        )
    blocks_path, blocks = d.find_blocks(model)
    device = execution_device(model)  # offloaded parameters sit on 'meta'
    dtype = next(model.parameters()).dtype
    ids = d.probe_ids(model, device)
    if dtype in widened.WIDENED:  # half precision: search float32 copies of each block
        trace, searched = widened.trace_widened(model, blocks, ids)
    else:
        trace = d.trace_forward(model, blocks, ids)
        searched = trace.blocks
    search_dtype = widened.search_dtype(dtype)
    override = OVERRIDES.get(model_type)
    start: str | None = None
    writes: list[Write] = []
    hints: dict[str, tuple[str, ...]] = {}
    for layer, (block, bt) in enumerate(zip(blocks, searched, strict=True)):
        prefix = f"{blocks_path}.{layer}."
        key = (
            type(block).__name__
            + "|"
            + ",".join(
                n[len(prefix) :] for n, r in bt.records.items() if r.depth == 1 and r.calls == 1
            )
        )
        own = trace.blocks[layer]
        if not all(torch.isfinite(t).all() for t in (own.h_in, own.h_out, bt.h_in, bt.h_out)):
            why = (
                "values beyond float16's range (65504)? use --dtype bfloat16 or float32"
                if dtype == torch.float16
                else "NaN/inf weights?"
            )
            raise CdscopeError(
                f"{model_type}: layer {layer}: non-finite hidden states in the probe forward in "
                f"{str(dtype).removeprefix('torch.')} on {device} ({why}): the gates cannot be "
                "proven"
            )
        for h in (bt.h_in, bt.h_out):
            overflow_check(model_type, layer, h, dtype)
        hint = override or hints.get(key)
        block_dtype = d.adding_dtype(bt.h_out, search_dtype)
        if reason := diagnosis.recurrent(own) or diagnosis.reversible(bt, prefix, block_dtype):
            raise CdscopeError(f"{model_type}: layer {layer}: {reason}")
        try:
            found = d.solve_block(
                bt, block_dtype, tuple(prefix + h for h in hint) if hint else None
            )
        except d.NotAdditive as exc:
            restart = stream_start.solve_after_norm(bt, model, block_dtype) if layer == 0 else None
            if restart is None:
                expanded = streams.solve_expanded(bt, block_dtype)
                if expanded is None:
                    why = diagnosis.why_not_additive(bt, model, prefix, block_dtype)
                    raise CdscopeError(f"{model_type}: layer {layer}: {exc}: {why}") from None
                writes += _wire_expanded(model, layer, prefix[:-1], expanded)
                continue
            bt, found, start = restart
        except CdscopeError as exc:
            raise CdscopeError(f"{model_type}: layer {layer}: {exc}") from None
        hints[key] = tuple(n[len(prefix) :] for n in found.names)
        roles = ROLE_OVERRIDES.get(model_type, {})
        writes += [
            replace(w, role=roles.get(w.sublayer[len(prefix) :], w.role))
            for w in _wire(model, layer, prefix[:-1], bt, found)
        ]
    last = trace.blocks[-1].h_out
    final = [r for r in trace.outside.values() if d._same(r.inp, last)]
    arch = Architecture(
        model_type=model_type,
        blocks_path=blocks_path,
        num_layers=len(blocks),
        writes=tuple(writes),
        final_norm=min(final, key=lambda r: r.order).name if final else None,
        source="override" if override else "discovered",
        stream_start=start,
    )
    return arch, trace, ids


_CACHE: weakref.WeakKeyDictionary[nn.Module, Architecture] = weakref.WeakKeyDictionary()


def architecture_of(model: nn.Module) -> Architecture:
    """The proven architecture description of ``model`` (discovered once per model object).

    Raises ``CdscopeError`` (one line: layer, check, error size) when no description is
    found or the proof fails.
    """
    if model in _CACHE:
        return _CACHE[model]
    from cdscope.core.models.proof import prove

    start = time.perf_counter()
    rescaling.unscaled(model)  # RWKV: the training form in eval mode too
    with d.eval_mode(model):
        arch, trace, ids = discover(model)
        result = prove(model, arch, ids, trace.logits, start)
    arch = replace(arch, proof=result)
    _CACHE[model] = arch
    return arch


def position_limit(model: nn.Module) -> int | None:
    """The longest sequence ``model`` can embed, where that is a hard limit: models with
    learned absolute positions (GPT-2's ``n_positions``) fail on longer inputs; rotary
    models (every other supported architecture) have none."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) == "gpt2":
        return int(config.n_positions)
    return None


def check_fits(model: nn.Module, length: int, what: str, fix: str) -> None:
    """One line when ``length`` tokens of ``what`` exceed the model's positions."""
    limit = position_limit(model)
    if limit is not None and length > limit:
        raise CdscopeError(
            f"{what} is {length} tokens but the model has only {limit} positions; {fix}"
        )
