"""Discovering the residual writes of a decoder from its own forward (SPEC §1, issue 12).

No per-``model_type`` table: for a loaded model,

1. **Blocks.** The decoder blocks are the outermost ``nn.ModuleList`` whose length is the
   config's ``num_hidden_layers`` (else the longest list of modules with parameters).
2. **One captured forward** on ``PROBE_TOKENS`` tokens records, for every block, its
   input ``h_in`` and output ``h_out`` (first element of a tuple), and for every module
   up to ``MAX_DEPTH`` below a block its input and output tensors and its call count.
3. **Writes.** The residual update ``r = h_out - h_in`` must be a sum of module outputs:
   over the block's direct children whose output has the stream's shape (called once,
   not an identity), the smallest subset ``S`` with scalars ``s_k`` such that

       |r_i - sum_{k in S} s_k o_k,i|  <=  8 eps(dtype) * (|h_in,i| + |h_out,i| + sum_k |s_k o_k,i|)

   for every element i (``write_sum_error``; least squares in float64; ``s_k`` within tol of 1 is taken as exactly 1; scales
   other than 1 are residual multipliers such as Granite's). Where no subset of children
   fits (a sublayer that adds the residual itself, Bloom style), grandchildren are tried.
   A Llama ``post_attention_layernorm`` never fits (its output is a normalised *input*
   of the MLP); a Gemma-2 one does (its output *is* the write): the data flow decides.
4. **Roles and wiring.** A chosen module that is a norm is a post-sublayer norm; its
   sublayer is the module whose output is the norm's input, and the role comes from that
   sublayer: ``mixer`` (SSM / linear attention / convolution), ``attn``, ``moe`` (a
   block holding experts) or ``mlp``, read from the module path and class names. A write
   whose sublayer reads the block input (directly or through a norm of it) after an
   earlier write of the block is *parallel* (GPT-J, GPT-NeoX, Falcon, Phi, Cohere).
   The modules inside the sublayer that read its input (q/k/v projections, fused or not)
   and the pre-norm are recorded for EAP.

Every step is checked again on each load by ``cdscope.core.models.proof``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import combinations

import torch
from torch import nn

from cdscope.errors import CdscopeError
from cdscope.hooks import first_tensor

PROBE_TOKENS = 6
MAX_DEPTH = 2
MAX_WRITES = 4  # a block with more residual writes than this is not searched for
#: name tokens of the roles (see ``role_of``)
_MIXER_WORDS = (
    "mixer",
    "ssm",
    "conv",
    "rwkv",
    "retention",
    "recurrent",
    "rglru",
    "hyena",
    "lightning",
    "deltanet",
    "delta",
    "gla",
    "kda",
    "xlstm",
    "mlstm",
    "slstm",
)
_ATTN_WORDS = ("attn", "attention", "attentions")
_MOE_WORDS = ("moe", "sparse", "experts", "expert")
_MLP_WORDS = ("mlp", "ffn", "feed", "feedforward", "mlps")


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of the write-sum identity in ``dtype``: 8 machine epsilons.

    A block that adds its writes to the stream in ``dtype`` rounds once per addition and
    once per scaled write, each time by at most half an epsilon of the value at hand
    (``write_sum_error`` divides by the sum of all magnitudes an element takes part in);
    with at most ``MAX_WRITES`` writes and as many scales that is 4 epsilons, so 8 is a
    margin of 2 over the worst case (measured on the embedded model: 0.8, 0.9, 0.9 half
    epsilons in bfloat16, float16, float32)."""
    return 8 * torch.finfo(dtype).eps


def adding_dtype(h_out: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype a block added its writes in: float32 when a float64 block's output is a
    float32 value in every element (HY-V4's hyper-connections add in float32 whatever the
    model's dtype: random float64 sums are never all float32-exact), else ``dtype``. The
    write-sum identity of such a block holds to float32's rounding, not float64's."""
    if dtype == torch.float64 and torch.equal(h_out, h_out.float().to(h_out.dtype)):
        return torch.float32
    return dtype


def write_sum_error(
    h_in: torch.Tensor, h_out: torch.Tensor, terms: list[torch.Tensor] | torch.Tensor
) -> float:
    """``max_i |h_out_i - h_in_i - sum_k t_k,i| / (|h_in_i| + |h_out_i| + sum_k |t_k,i|)``.

    Relative per element, in float64: rounding in the model's dtype is relative to the
    values an element takes part in, and one dimension of the stream can be thousands of
    times larger than the others (massive activations), so a single scale over the whole
    tensor would hide every write smaller than the largest element's rounding (bfloat16 on
    the embedded model: the attention writes of layers 0-9). A floor of one float64
    epsilon of the largest magnitude keeps exact zeros from dividing by zero.
    ``terms`` is a list of tensors shaped like ``h_in`` or one ``[N, k]`` matrix of
    flattened terms.
    """
    h_in, h_out = h_in.double().reshape(-1), h_out.double().reshape(-1)
    if isinstance(terms, torch.Tensor):
        stacked = terms.double()
    else:
        stacked = torch.stack([t.double().reshape(-1) for t in terms], dim=1)
    magnitude = h_in.abs() + h_out.abs() + stacked.abs().sum(dim=1)
    floor = torch.finfo(torch.float64).eps * float(magnitude.max()) + 1e-300
    residual = h_out - h_in - stacked.sum(dim=1)
    return float((residual.abs() / (magnitude + floor)).max())


@dataclass
class Record:
    """What one module saw in the captured forward."""

    name: str  # path in the model
    depth: int  # 1 = direct child of its block
    order: int = -1  # position of its (last) output among all hooked outputs
    calls: int = 0
    inp: torch.Tensor | None = None
    out: torch.Tensor | None = None
    inp_ptr: int = 0  # storage addresses: tell equal-valued tensors apart (Falcon's two
    out_ptr: int = 0  # freshly initialised pre-norms)
    #: every tensor of a tuple output (a hyper-connection's stream weights are not its first)
    outs: tuple[torch.Tensor, ...] = ()


@dataclass
class BlockTrace:
    """Block ``h_in`` / ``h_out`` and the records of its modules, in call order."""

    h_in: torch.Tensor | None = None
    h_out: torch.Tensor | None = None
    records: dict[str, Record] = field(default_factory=dict)
    calls: int = 0  # > 1: a block run several times in one forward (a recurrent stack)
    #: every tensor of h_in's shape the block took / returned, in call order (a reversible
    #: block's two half-streams: ``diagnosis.reversible``)
    ins: tuple[torch.Tensor, ...] = ()
    outs: tuple[torch.Tensor, ...] = ()


@dataclass
class Trace:
    """One captured forward: logits, per-block traces, and the modules outside the blocks."""

    logits: torch.Tensor
    blocks: list[BlockTrace]
    outside: dict[str, Record]


def input_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The hidden-state input of a call: first positional tensor or ``hidden_states``."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    hidden = kwargs.get("hidden_states")
    if isinstance(hidden, torch.Tensor):
        return hidden
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


def text_config(model: nn.Module) -> object:
    """The (text) config of ``model``; None for a bare module without one."""
    config = getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """``(path, list)`` of the decoder blocks (see the module docstring)."""
    expected = getattr(text_config(model), "num_hidden_layers", None)
    lists = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList)
        and len(m)
        and all(any(True for _ in b.parameters()) for b in m)
    ]
    matching = [x for x in lists if len(x[1]) == expected] or sorted(
        lists, key=lambda x: -len(x[1])
    )[:1]
    if not matching:
        raise CdscopeError(
            f"{type(model).__name__}: no list of decoder blocks found (no nn.ModuleList of "
            "modules): cdscope needs a decoder-only transformer"
        )
    return min(matching, key=lambda x: x[0].count("."))


def probe_ids(model: nn.Module, device: torch.device) -> torch.Tensor:
    """``[1, PROBE_TOKENS]`` deterministic token ids inside the vocabulary."""
    vocab = int(getattr(text_config(model), "vocab_size", 0) or 0) or 2
    return ((torch.arange(PROBE_TOKENS) * 37 + 11) % max(vocab - 1, 1) + 1).view(1, -1).to(device)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off for the duration (training flags restored afterwards)."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def run_probe(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits of one no-grad forward (no cache). The first forward cdscope runs on a
    loaded model: a model that cannot compute in its dtype on its device (a kernel without
    that dtype, ``torch._grouped_mm`` on misaligned bfloat16 experts, ...) stops here with
    one line naming both and the way out, not with the model's traceback."""
    try:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=False)
    except CdscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model's own code: any failure is reported
        raise forward_failed(model, exc) from None
    return out.logits if hasattr(out, "logits") else first_tensor(out)


def forward_failed(model: nn.Module, exc: BaseException) -> CdscopeError:
    """One line for a forward that raised: model type, dtype, device, the error, the fix."""
    parameter = next(model.parameters(), None)
    dtype = parameter.dtype if parameter is not None else torch.float32
    device = parameter.device if parameter is not None else "cpu"
    name = str(dtype).removeprefix("torch.")
    kind = getattr(text_config(model), "model_type", type(model).__name__)
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    hint = "" if dtype == torch.float32 else "; try --dtype float32"
    return CdscopeError(
        f"{kind}: the forward fails in {name} on {device}: {type(exc).__name__}: {first}{hint}"
    )


def record_modules(
    block: nn.Module,
    prefix: str,
    depth: int,
    trace: BlockTrace,
    counter: list[int],
    hooks: list,
) -> None:
    """Hook every module of ``block`` up to ``depth`` below it, recording into ``trace``
    under the name ``prefix.relative_path`` (the model's own name for the module, also when
    ``block`` is a copy); ``counter`` orders outputs across blocks, ``hooks`` collects the
    handles."""
    for rel, module in block.named_modules():
        level = rel.count(".") + 1 if rel else 0
        if 1 <= level <= depth:
            record = Record(f"{prefix}.{rel}", level)
            trace.records[record.name] = record
            hooks.append(module.register_forward_hook(_recorder(record, counter), with_kwargs=True))


def _recorder(record: Record, counter: list[int]):  # noqa: ANN202
    def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        record.calls += 1
        counter[0] += 1
        record.order = counter[0]
        inp, out = input_tensor(args, kwargs), first_tensor(output)
        record.inp = None if inp is None else inp.detach().clone()
        record.out = None if out is None else out.detach().clone()
        if isinstance(output, (tuple, list)) and len(output) > 1:
            record.outs = tuple(t.detach().clone() for t in output if isinstance(t, torch.Tensor))
        else:
            record.outs = () if record.out is None else (record.out,)
        record.inp_ptr = 0 if inp is None else inp.data_ptr()
        record.out_ptr = 0 if out is None else out.data_ptr()

    return hook


def block_io_hook(trace: BlockTrace):  # noqa: ANN201 - torch hook signature
    """A forward hook (with kwargs) storing a block's input and output in ``trace``."""

    def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        h_in, h_out = input_tensor(args, kwargs), first_tensor(output)
        trace.calls += 1
        trace.h_in = None if h_in is None else h_in.detach().clone()
        trace.h_out = None if h_out is None else h_out.detach().clone()
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        shape = None if h_in is None else h_in.shape
        for key, values in (("ins", (*args, *kwargs.values())), ("outs", outputs)):
            kept = (t for t in values if isinstance(t, torch.Tensor) and t.shape == shape)
            setattr(trace, key, tuple(t.detach().clone() for t in kept))

    return hook


def check_residual_shapes(traces: list[BlockTrace]) -> None:
    for index, trace in enumerate(traces):
        if trace.calls == 0:
            raise CdscopeError(
                f"layer {index}: the block does not run in a forward on token ids alone (a "
                "layer that needs other inputs, e.g. cross-attention to image states): its "
                "writes cannot be gated on text"
            )
        if trace.h_in is None or trace.h_out is None or trace.h_in.shape != trace.h_out.shape:
            raise CdscopeError(
                f"layer {index}: the block does not map a hidden state to a hidden state of "
                "the same shape: not a residual decoder block cdscope can gate"
            )


def trace_forward(
    model: nn.Module,
    blocks: nn.ModuleList,
    ids: torch.Tensor,
    depth: int = MAX_DEPTH,
    extra: Callable[[list], None] | None = None,
) -> Trace:
    """One forward recording block in/out, every module up to ``depth`` below a block, and
    the modules outside the blocks (embeddings, final norm). ``extra(hooks)`` may add
    hooks of its own (removed with these)."""
    traces = [BlockTrace() for _ in blocks]
    inside = {id(m) for block in blocks for m in block.modules()} | {id(blocks)}
    outside: dict[str, Record] = {}
    counter = [0]
    handles: list = []
    prefix = next(n for n, m in model.named_modules() if m is blocks)
    try:
        for index, block in enumerate(blocks):
            handles.append(
                block.register_forward_hook(block_io_hook(traces[index]), with_kwargs=True)
            )
            record_modules(block, f"{prefix}.{index}", depth, traces[index], counter, handles)
        for name, module in model.named_modules():
            if name and id(module) not in inside:
                outside[name] = Record(name, 0)
                handles.append(
                    module.register_forward_hook(
                        _recorder(outside[name], counter), with_kwargs=True
                    )
                )
        if extra is not None:
            extra(handles)
        logits = run_probe(model, ids)
    finally:
        for handle in handles:
            handle.remove()
    check_residual_shapes(traces)
    return Trace(logits, traces, outside)


def is_norm(module: nn.Module) -> bool:
    """A normalisation module (by class name, or a LayerNorm / RMSNorm subclass)."""
    return (
        isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm))
        or "norm" in type(module).__name__.lower()
    )


def _tokens(name: str) -> list[str]:
    """``GptOssMLP`` -> ``[gpt, oss, mlp]``; ``self_attn`` -> ``[self, attn]``."""
    return [t.lower() for t in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", name)]


def _family_prefix(model: nn.Module) -> list[str]:
    words = _tokens(type(model).__name__)
    return words[: words.index("for")] if "for" in words else []


def _class_words(module: nn.Module, prefix: list[str]) -> list[str]:
    """Class-name tokens without the model family's own prefix (``RecurrentGemmaMlp`` -> mlp)."""
    words = _tokens(type(module).__name__)
    i = 0
    while i < min(len(prefix), len(words) - 1) and words[i] == prefix[i]:
        i += 1
    return words[i:]


def _kind(words: list[str]) -> str | None:
    if any(w in _MIXER_WORDS or w.startswith("mamba") for w in words) or (
        "linear" in words and any(w in _ATTN_WORDS for w in words)
    ):
        return "mixer"
    if any(w in _ATTN_WORDS for w in words):
        return "attn"
    return None


def role_of(model: nn.Module, path: str, within: str = "") -> str:
    """``mixer`` / ``attn`` / ``moe`` / ``mlp`` from the class and attribute names on
    ``path`` below ``within`` (the block), deepest first (Bloom: ``self_attention.dense``)."""
    prefix = _family_prefix(model)
    parts = path[len(within) :].strip(".").split(".") if path.startswith(within) else [path]
    for depth in range(len(parts), 0, -1):
        module = model.get_submodule(".".join(([within] if within else []) + parts[:depth]))
        cls, name = _class_words(module, prefix), _tokens(parts[depth - 1])
        kind = _kind(cls) or _kind(name)
        if kind:
            return kind
        if any("expert" in n.rsplit(".", 1)[-1].lower() for n, _ in module.named_modules() if n):
            return "moe"
        if any(w in _MLP_WORDS for w in name):
            return "mlp"
        if any(w in _MOE_WORDS for w in cls + name):
            return "moe"
        if any(w in _MLP_WORDS for w in cls):
            return "mlp"
    return "mlp"


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


def candidates(trace: BlockTrace, depth: int) -> list[Record]:
    """Modules whose single output has the stream's shape and is not a copy of its input."""
    out, seen = [], []
    shape = trace.h_in.shape
    for rec in sorted(trace.records.values(), key=lambda r: r.order):
        if rec.depth > depth or rec.calls != 1 or rec.out is None:
            continue
        if (
            rec.out.shape != shape
            and rec.out.shape[-1] == shape[-1]
            and rec.out.numel() == trace.h_in.numel()
        ):
            rec.out = rec.out.reshape(shape)  # rows flattened to [B*T, H] (OPT's MLP)
        if rec.out.shape != trace.h_in.shape or _same(rec.out, rec.inp):
            continue
        if _same(rec.out, trace.h_in) or _same(rec.out, trace.h_out):
            continue
        if any(_same(rec.out, s.out) for s in seen):
            continue  # an identical output (o_proj of an attention whose output it is)
        seen.append(rec)
        out.append(rec)
    return out


@dataclass(frozen=True)
class Fit:
    names: tuple[str, ...]
    scales: tuple[float, ...]
    error: float  # relative, see ``tolerance``


def fit(trace: BlockTrace, chosen: list[Record], dtype: torch.dtype) -> Fit:
    """The error (``write_sum_error``) of ``chosen`` outputs as the block's update: with
    every scale 1 when that fits, else with least-squares scales (a scale within 64
    tolerances of 1 taken as exactly 1). Unit scales first, because least squares can
    miss 1 by more than the tolerance when a write is small next to another (measured:
    1.8e-13 on the embedded model's layer 11 in float64, whose unit fit errs 1.2e-16)."""
    names = tuple(rec.name for rec in chosen)
    X = torch.stack([rec.out.double().reshape(-1) for rec in chosen], dim=1)  # noqa: N806
    unit = write_sum_error(trace.h_in, trace.h_out, X)
    if unit <= tolerance(dtype):
        return Fit(names, (1.0,) * len(chosen), unit)
    r = (trace.h_out.double() - trace.h_in.double()).reshape(-1)
    scales = torch.linalg.lstsq(X, r[:, None]).solution[:, 0]
    tol = tolerance(dtype)
    scales = torch.where((scales - 1).abs() <= 64 * tol, torch.ones_like(scales), scales)
    error = write_sum_error(trace.h_in, trace.h_out, X * scales)
    return Fit(names, tuple(scales.tolist()), error)


def solve_block(trace: BlockTrace, dtype: torch.dtype, hint: tuple[str, ...] | None) -> Fit:
    """The smallest set of module outputs that sums to the block's update (see docstring)."""
    tol = tolerance(dtype)
    best: Fit | None = None
    for depth in range(1, MAX_DEPTH + 1):
        pool = candidates(trace, depth)
        by_name = {rec.name: rec for rec in pool}
        if hint and all(n in by_name for n in hint):
            found = fit(trace, [by_name[n] for n in hint], dtype)
            if found.error <= tol:
                return found
        for size in range(1, min(MAX_WRITES if depth == 1 else 3, len(pool)) + 1):
            fits = [fit(trace, list(combo), dtype) for combo in combinations(pool, size)]
            ok = [f for f in fits if f.error <= tol and all(abs(s) > 1e-6 for s in f.scales)]
            if ok:
                return min(ok, key=lambda f: sum(abs(s - 1) for s in f.scales))
            for f in fits:
                best = f if best is None or f.error < best.error else best
    detail = f" (closest: {', '.join(best.names)}, rel. error {best.error:.1e})" if best else ""
    raise NotAdditive(
        f"no set of module outputs sums to the block's residual update h_out - h_in{detail}"
    )


class NotAdditive(CdscopeError):
    """No write set fits a block; ``cdscope.core.models.diagnosis`` says why, measured."""
