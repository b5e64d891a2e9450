"""The edge graph of edge attribution and where its consumers read, from the one
architecture description (SPEC §6, issue 12).

Nodes: ``emb`` (h_0, the first block's input or ``Architecture.stream_start``'s output), one node per residual write of the
architecture description (``attn{l}``, ``mlp{l}``, ``moe{l}``, ``mixer{l}``: the gated
modules) and ``logits``. A write node reads the stream through paths:

- attention through three, ``q``, ``k``, ``v`` (separate projections, or one fused
  projection split into its q, k, v output column sets: ``cdscope.core.eap_layout``), or
  through two, ``q`` and ``kv``, for multi-head latent attention (DeepSeek-V2/V3,
  MiniCPM3, GLM-4-MoE-Lite): q through ``q_a_proj`` (``q_proj`` without a q LoRA), k and
  v both through ``kv_a_proj_with_mqa``;
- an MLP, MoE or mixer (SSM / linear attention / convolution) node through one, ``in``
  (its pre-norm, or the stream itself);
- the logits through the final norm.

A sequential node reads every write before it; a parallel one (GPT-J, GPT-NeoX, Falcon)
reads the block input, i.e. every write before its block's first write; a node whose
pre-norm an earlier write of its block already used reads what that write reads
(GraniteMoeHybrid's MoE and shared MLP, Falcon-H1's mixer and attention). An edge
(u -> v, path) exists for every u that v reads. With P_l paths into layer l's attention
(3, or 2 for latent attention), an ordinary sequential L-layer decoder has

    E = sum_l [P_l (2l+1) + (2l+2)] + (2L+1)
      = 4L^2 + 3L + 1   (P = 3; L = 28: 3221)     = 3L^2 + 3L + 1   (P = 2; L = 61: 11347)

Supported: every node reads the stream through a pre-norm or directly (OLMo-2);
attention reads it through exactly q, k, v projections, latent q + kv_a_proj_with_mqa,
or one fused projection whose q/k/v column layout the model confirms (zeroing q and k
columns at position 0 leaves attention output 0 unchanged, zeroing v does not; zeroing q
at position 1 leaves later rows unchanged, zeroing k does not); the LM head reads the
last block through a module (the final norm). Anything else (an attention with an extra
reader such as DeepSeek-V3.2's indexer or an output gate projection, a sublayer fed by no
identifiable norm) is refused with a one-line reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from cdscope.core.eap_layout import fused_columns
from cdscope.core.models.architecture import Architecture, Write, architecture_of
from cdscope.errors import CdscopeError

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
    def build(
        cls,
        num_layers: int,
        writes: list[tuple[int, str, bool]],
        paths: list[tuple[str, ...]] | None = None,
        reads: list[int] | None = None,
    ) -> EdgeGraph:
        """``writes``: ``(layer, role, parallel)`` in gate order; ``paths``: each write's
        reading paths (default: q, k, v for ``attn``, else ``in``); ``reads``: how many
        upstream nodes each write reads (default: all before it, or all before its block's
        first write when parallel)."""
        if num_layers < 1:
            raise ValueError(f"a graph needs at least one layer; got {num_layers}")
        if paths is None:
            paths = [PATHS if role == "attn" else ("in",) for _, role, _ in writes]
        if reads is None:
            first: dict[int, int] = {}
            reads = []
            for k, (layer, _, parallel) in enumerate(writes):
                start = first.setdefault(layer, k + 1)
                reads.append(start if parallel else k + 1)
        upstream, consumers, reads_at = ["emb"], [], []
        for (layer, role, _), node_paths, count in zip(writes, paths, reads, strict=True):
            name = f"{role}{layer}"
            while name in upstream:
                name += "'"
            upstream.append(name)
            consumers += [(name, p) for p in node_paths]
            reads_at += [count] * len(node_paths)
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
    def from_plan(cls, arch: Architecture, plan: list[Reads]) -> EdgeGraph:
        """The graph of a model: its writes, read through the paths of ``eap_plan``. A write
        whose pre-norm an earlier write of its block already used reads that write's input
        (GraniteMoeHybrid's MoE and shared MLP both read post_attention_layernorm)."""
        reads, first, norms = [], {}, {}
        for k, r in enumerate(plan):
            start = first.setdefault(r.write.layer, k + 1)
            own = start if r.write.parallel else k + 1
            reads.append(norms.setdefault((r.write.layer, r.pre_norm), own) if r.pre_norm else own)
        writes = [(w.layer, w.role, w.parallel) for w in arch.writes]
        return cls.build(arch.num_layers, writes, [r.paths for r in plan], reads)

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
    """How one write node reads the stream: its pre-norm, paths and input modules."""

    write: Write
    pre_norm: str | None  # the norm whose input is the stream; None: the sublayer reads it
    shared_norm: bool  # the pre-norm also feeds another node (GPT-J's ln_1)
    paths: tuple[str, ...]  # ("q", "k", "v"), ("q", "kv") (latent attention) or ("in",)
    projections: tuple[str, ...] = ()  # one module per path, or one fused q/k/v module
    columns: tuple[torch.Tensor, ...] | None = field(default=None, compare=False)  # fused


def _path_key(name: str) -> str:
    """``q_proj`` / ``query`` / ``Wq`` / ``to_q`` -> ``q`` (else the bare name)."""
    key = name.rsplit(".", 1)[-1].lower().replace("_proj", "").replace("to_", "").strip("_")
    key = {"query": "q", "key": "k", "value": "v"}.get(key, key)
    return key[1:] if len(key) == 2 and key[0] == "w" else key


def _ordered(readers: tuple[str, ...], keys: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """One reader per path, in path order: ``keys`` maps a path to its accepted name keys."""
    order = []
    for accepted in keys.values():
        hits = [r for r in readers if _path_key(r) in accepted]
        if len(hits) != 1:
            return None
        order.append(hits[0])
    return tuple(order) if len(readers) == len(keys) else None


#: multi-head latent attention (DeepSeek-V2/V3, MiniCPM3): q through q_a_proj (or q_proj
#: without a q LoRA), k and v both through kv_a_proj_with_mqa
LATENT = {"q": ("q_a", "q"), "kv": ("kv_a_with_mqa",)}


def _attention_reads(model: nn.Module, w: Write, where: str, shared: bool) -> Reads:
    qkv = _ordered(w.readers, {p: (p,) for p in PATHS})
    if qkv is not None:
        return Reads(w, w.pre_norm, shared, PATHS, qkv)
    latent = _ordered(w.readers, LATENT)
    if latent is not None:
        return Reads(w, w.pre_norm, shared, tuple(LATENT), latent)
    if len(w.readers) == 1:
        columns = fused_columns(model, w.readers[0], w.sublayer, where)
        return Reads(w, w.pre_norm, shared, PATHS, w.readers, columns)
    names = ", ".join(r.rsplit(".", 1)[-1] for r in w.readers) or "no module inside the write"
    raise CdscopeError(
        f"{where}: attention reads its input through {names}, not q/k/v "
        "(nor latent q + kv_a_proj_with_mqa)"
    )


def _reads(model: nn.Module, arch: Architecture, w: Write, fused: dict) -> Reads:
    where = f"eap-info: {arch.model_type} layer {w.layer}"
    if w.pre_norm is None and not w.reads_stream:
        raise CdscopeError(
            f"{where}: neither a norm nor the stream itself feeds its {w.role} sublayer "
            f"{w.sublayer}: the path through which it reads the stream is not identifiable"
        )
    shared = w.pre_norm is not None and (
        sum(1 for o in arch.layer_writes(w.layer) if o.pre_norm == w.pre_norm) > 1
    )
    if w.role != "attn":  # MLP, MoE, SSM / linear-attention / conv mixer: one input path
        return Reads(w, w.pre_norm, shared, ("in",))
    if len(w.readers) == 1 and fused:  # the layout found on the first fused layer
        layout = fused["columns"]
        if model.get_submodule(w.readers[0]).weight.shape == fused["shape"]:
            return Reads(w, w.pre_norm, shared, PATHS, w.readers, layout)
    reads = _attention_reads(model, w, where, shared)
    if reads.columns is not None:
        fused.update(columns=reads.columns, shape=model.get_submodule(w.readers[0]).weight.shape)
    return reads


def eap_plan(model: nn.Module, arch: Architecture | None = None) -> list[Reads]:
    """How every write node reads the stream, or a CdscopeError naming why not."""
    arch = arch or architecture_of(model)
    if arch.final_norm is None:
        raise CdscopeError(f"eap-info: {arch.model_type}: no module reads the last block's output")
    if any(w.expand for w in arch.writes):
        raise CdscopeError(
            f"eap-info: {arch.model_type}: several residual streams (hyper-connections): the "
            "edge graph reads one stream"
        )
    fused: dict = {}
    return [_reads(model, arch, w, fused) for w in arch.writes]


def eap_support_and_plan(
    model: nn.Module, arch: Architecture | None = None
) -> tuple[str, list[Reads] | None]:
    """``("yes", plan)`` when eap-info supports ``model``, else ``(reason, None)``."""
    try:
        return "yes", eap_plan(model, arch)
    except CdscopeError as exc:
        return str(exc).removeprefix("eap-info: "), None


def eap_support(model: nn.Module, arch: Architecture | None = None) -> str:
    """``"yes"`` when eap-info supports ``model``, else the one-line reason."""
    return eap_support_and_plan(model, arch)[0]


def edge_graph(model: nn.Module) -> EdgeGraph:
    """The edge graph of ``model`` (its proven writes read through ``eap_plan``'s paths),
    or a CdscopeError naming why the architecture has no EAP support."""
    arch = architecture_of(model)
    return EdgeGraph.from_plan(arch, eap_plan(model, arch))
