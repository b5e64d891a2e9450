"""The edge graph of edge attribution and where its consumers read, from the one
architecture description (SPEC §6, issue 12).

Nodes: ``emb`` (h_0, the first block's input), one node per residual write of the
architecture description (``attn{l}``, ``mlp{l}``, ``moe{l}``: the gated modules) and
``logits``. A write node reads the stream through paths: an attention node through
three (q, k, v projections, separate or one fused projection split into its column
blocks), an MLP / MoE node through one (``in``), the logits through the final norm. A
sequential node reads every write before it; a parallel one (GPT-J, GPT-NeoX, Falcon)
reads the block input, i.e. every write before its block's first write. An edge
(u -> v, path) exists for every u that v reads. For an ordinary L-layer sequential
decoder this is

    E = sum_l [3(2l+1) + (2l+2)] + (2L+1) = 4L^2 + 3L + 1          (L = 28: 3221)

Supported: every write is ``attn`` / ``mlp`` / ``moe``; attention reads its input through
exactly q, k, v projections or one fused projection whose columns are [q | k | v]
(checked on the model: zeroing the presumed q and k columns at position 0 leaves the
attention output at position 0 unchanged, zeroing the v columns does not); the LM head
reads the last block through a module (the final norm); every node reads the stream
through a pre-norm or directly (OLMo-2). Anything else is refused with a one-line reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cdscope.errors import CdscopeError
from cdscope.models import discovery as d
from cdscope.models.adapters import Architecture, Write, architecture_of
from cdscope.models.placement import execution_device

PATHS = ("q", "k", "v")


def edge_count(num_layers: int) -> int:
    """E = 4L^2 + 3L + 1 for an ordinary sequential decoder (SPEC §6)."""
    return 4 * num_layers**2 + 3 * num_layers + 1


@dataclass(frozen=True)
class EdgeGraph:
    """The graph of one architecture.

    ``upstream`` are the K + 1 writing nodes (emb, then the writes in gate order),
    ``consumers`` the reading paths ``(node, path)``; edge ``e`` goes from
    ``upstream[edge_up[e]]`` into ``consumers[edge_cons[e]]``.
    """

    num_layers: int
    upstream: tuple[str, ...]
    consumers: tuple[tuple[str, str], ...]
    edge_up: np.ndarray
    edge_cons: np.ndarray

    @classmethod
    def build(cls, num_layers: int, writes: list[tuple[int, str, bool]]) -> EdgeGraph:
        """``writes``: ``(layer, role, parallel)`` in gate order."""
        if num_layers < 1:
            raise ValueError(f"a graph needs at least one layer; got {num_layers}")
        upstream, consumers, reads_at, first = ["emb"], [], [], {}
        for k, (layer, role, parallel) in enumerate(writes):
            name = f"{role}{layer}"
            while name in upstream:
                name += "'"
            upstream.append(name)
            first.setdefault(layer, k + 1)
            paths = PATHS if role == "attn" else ("in",)
            consumers += [(name, p) for p in paths]
            reads_at += [first[layer] if parallel else k + 1] * len(paths)
        consumers.append(("logits", "in"))
        reads_at.append(len(upstream))
        up, cons = np.nonzero(np.arange(len(upstream))[:, None] < np.array(reads_at)[None, :])
        return cls(num_layers, tuple(upstream), tuple(consumers), up, cons)

    @classmethod
    def from_layers(cls, num_layers: int) -> EdgeGraph:
        """The ordinary sequential decoder: attn, mlp per layer."""
        writes = [(i, s, False) for i in range(num_layers) for s in ("attn", "mlp")]
        return cls.build(num_layers, writes)

    @classmethod
    def from_architecture(cls, arch: Architecture) -> EdgeGraph:
        return cls.build(arch.num_layers, [(w.layer, w.role, w.parallel) for w in arch.writes])

    @property
    def E(self) -> int:  # noqa: N802 - the SPEC's symbol
        return len(self.edge_up)

    @property
    def nodes(self) -> tuple[str, ...]:
        return (*self.upstream, "logits")

    @property
    def consumer_names(self) -> list[str]:
        return [f"{node}.{path}" for node, path in self.consumers]

    def edges(self) -> list[tuple[str, str, str]]:
        """``(upstream, downstream, path)`` of every edge, in score order."""
        return [
            (self.upstream[u], *self.consumers[c])
            for u, c in zip(self.edge_up.tolist(), self.edge_cons.tolist(), strict=True)
        ]

    def matrix(self, values: np.ndarray) -> np.ndarray:
        """Edge values ``[E]`` -> ``[upstream, consumer]`` matrix, NaN where no edge."""
        out = np.full((len(self.upstream), len(self.consumers)), np.nan)
        out[self.edge_up, self.edge_cons] = values
        return out


@dataclass(frozen=True)
class Reads:
    """How one write node reads the stream: its pre-norm and its input modules."""

    write: Write
    pre_norm: str | None  # the norm whose input is the stream; None: the sublayer reads it
    shared_norm: bool  # the pre-norm also feeds another node (GPT-J's ln_1)
    projections: tuple[str, ...]  # attn: q, k, v paths, or one fused projection
    split: tuple[int, int, int] | None  # fused: column widths of q, k, v


def _path_key(name: str) -> str:
    """``q_proj`` / ``query`` / ``Wq`` / ``to_q`` -> ``q`` (else the bare name)."""
    key = name.rsplit(".", 1)[-1].lower().replace("_proj", "").replace("to_", "").strip("_")
    key = {"query": "q", "key": "k", "value": "v"}.get(key, key)
    return key[1:] if len(key) == 2 and key[0] == "w" else key


def _qkv_order(readers: tuple[str, ...]) -> tuple[str, ...] | None:
    order = []
    for p in PATHS:
        hits = [r for r in readers if _path_key(r) == p]
        if len(hits) != 1:
            return None
        order.append(hits[0])
    return tuple(order)


def _fused_split(model: nn.Module, module: nn.Module) -> tuple[int, int, int] | None:
    config = d.text_config(model)
    heads = getattr(config, "num_attention_heads", None)
    if not heads:
        return None
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() != 2:
        return None
    width = weight.shape[0] if isinstance(module, nn.Linear) else weight.shape[1]
    q, k = heads * head_dim, kv * head_dim
    if 3 * q == width:  # multi-head: three equal blocks (GPT-2 c_attn)
        return (q, q, q)
    return (q, k, k) if q + 2 * k == width else None  # grouped-query (Phi-3 qkv_proj)


def _reads(model: nn.Module, arch: Architecture, w: Write) -> Reads:
    where = f"eap-info: {arch.model_type} layer {w.layer}"
    if w.role not in ("attn", "mlp", "moe"):
        raise CdscopeError(
            f"{where} has a {w.role} write (SSM / linear-attention / conv mixer): "
            "edges need attention read through q/k/v projections"
        )
    if w.pre_norm is None and not w.reads_stream:
        raise CdscopeError(
            f"{where}: neither a norm nor the stream itself feeds its {w.role} sublayer "
            f"{w.sublayer}: the path through which it reads the stream is not identifiable"
        )
    shared = w.pre_norm is not None and (
        sum(1 for o in arch.layer_writes(w.layer) if o.pre_norm == w.pre_norm) > 1
    )
    if w.role != "attn":
        return Reads(w, w.pre_norm, shared, (), None)
    qkv = _qkv_order(w.readers)
    if qkv is not None and len(w.readers) == 3:
        return Reads(w, w.pre_norm, shared, qkv, None)
    if len(w.readers) == 1:
        split = _fused_split(model, model.get_submodule(w.readers[0]))
        if split is not None:
            return Reads(w, w.pre_norm, shared, w.readers, split)
        raise CdscopeError(
            f"{where}: fused projection {w.readers[0]} does not have q + k + v columns"
        )
    names = ", ".join(r.rsplit(".", 1)[-1] for r in w.readers) or "no module inside the write"
    raise CdscopeError(f"{where}: attention reads its input through {names}, not q/k/v")


def _attention_at_zero(model: nn.Module, reads: Reads, cols: slice) -> torch.Tensor:
    """The attention output at position 0 with fused columns ``cols`` zeroed there."""
    fused = model.get_submodule(reads.projections[0])
    sub = model.get_submodule(reads.write.sublayer)
    seen: list[torch.Tensor] = []

    def zero(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        out = output.clone()
        out[:, 0, cols] = 0
        return out

    def grab(module: nn.Module, args: tuple, output: object) -> None:
        seen.append(d.first_tensor(output)[:, 0].detach().clone())

    handles = [fused.register_forward_hook(zero), sub.register_forward_hook(grab)]
    try:
        with d.eval_mode(model):
            d.run_probe(model, d.probe_ids(model, execution_device(model)))
    finally:
        for handle in handles:
            handle.remove()
    return seen[0]


def _check_contiguous(model: nn.Module, arch: Architecture, reads: Reads) -> None:
    """Zeroing q and k columns at position 0 must not change attention output 0; v must."""
    q, k, _ = reads.split
    base = _attention_at_zero(model, reads, slice(0, 0))
    qk = _attention_at_zero(model, reads, slice(0, q + k))
    v = _attention_at_zero(model, reads, slice(q + k, None))
    if not torch.allclose(qk, base) or torch.equal(v, base):
        raise CdscopeError(
            f"eap-info: {arch.model_type} layer {reads.write.layer}: fused projection "
            f"{reads.projections[0]} is not laid out as contiguous q, k, v column blocks "
            "(interleaved heads?)"
        )


def eap_plan(model: nn.Module, arch: Architecture | None = None) -> list[Reads]:
    """How every write node reads the stream, or a CdscopeError naming why not."""
    arch = arch or architecture_of(model)
    if arch.final_norm is None:
        raise CdscopeError(f"eap-info: {arch.model_type}: no module reads the last block's output")
    plan = [_reads(model, arch, w) for w in arch.writes]
    fused = [r for r in plan if r.split is not None]
    if fused:
        _check_contiguous(model, arch, fused[0])
    return plan


def eap_support(model: nn.Module, arch: Architecture | None = None) -> str:
    """``"yes"`` when eap-info supports ``model``, else the one-line reason."""
    try:
        eap_plan(model, arch)
    except CdscopeError as exc:
        return str(exc).removeprefix("eap-info: ")
    return "yes"
