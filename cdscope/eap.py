"""Edge attribution (zero-ablation EAP) on a layer-level graph (SPEC §6).

Graph. A model with L layers has the nodes ``emb`` (the residual stream's initial state
h_0), ``attn{l}`` and ``mlp{l}`` (their residual writes: the very modules the gates of
``cdscope.gates`` multiply) and ``logits``. In topological order emb = 0,
attn{l} = 2l + 1, mlp{l} = 2l + 2, logits = 2L + 1, and every node reads the residual
stream, the sum of all writes before it:

    x_v = sum_{u before v} a_u

A node reads x_v through one or more *paths*: an attention node through three (q, k, v:
one shared pre-attention norm feeding three projections), an MLP node through its
pre-MLP norm, the logits through the final norm. An edge (u -> v, path) exists for every
u before v, so there are 3(2l+1) edges into attn{l}, 2l+2 into mlp{l} and 2L+1 into
the logits:

    E = sum_l [3(2l+1) + (2l+2)] + (2L+1) = 4L^2 + 3L + 1          (L = 28: 3221)

Scores (SPEC §6). Zero-ablating u on one path changes only that path's input, by -a_u;
to first order the change of the loss is

    s(u -> v, p) = sum_{t, d} (-a_u[t, d]) * dLoss / dx_{v,p}[t, d]

with Loss = mean NLL of the sample's answer tokens and x_{v,p} the residual stream as
path p of v reads it. As a_u enters every path after u, dLoss/da_u is the sum of those
path gradients, which gives the consistency identity checked in the tests:

    sum_{(v, p) after u} s(u -> v, p) = -a_u . dLoss/da_u = -dLoss/dg_u   (at g = 1)

Mechanism: on the Hugging Face model itself, one forward and one backward per batch.
Forward hooks record a_u (the embedding output and the adapter's write modules).
Forward pre-hooks give every consumer path its own alias x_{v,p} of the residual
stream (a view: no copy, but a separate autograd node):

- q/k/v: a pre-hook on the pre-attention norm stashes its input x; pre-hooks on the
  q/k/v projections replace their input by ``norm.forward(alias_p(x))``, so the shared
  norm is re-run once per path and its original output goes unused. GPT-2 fuses q, k, v
  into one ``Conv1D`` (c_attn); its output is rebuilt from the three column blocks of its
  weight, each applied to its own normed alias (the same ``addmm`` Conv1D runs).
- MLP and logits: a pre-hook on the pre-MLP norm / final norm replaces its input by an
  alias.

``torch.autograd.grad(sum_b Loss_b, aliases)`` then yields every path gradient at once
(rows are independent, so each row's gradient is that sample's), and per row
S = -A G^T with A the stacked activations [U, T*D] and G the path gradients
[C, T*D]; only the E pairs with u before v are kept. Pad positions (right padding, no
attention mask, see ``cdscope.batch``) have exactly zero gradient; A is zeroed there too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import numpy as np
import torch
from scipy import stats as _sps
from torch import nn
from torch.utils.hooks import RemovableHandle

from cdscope.batch import ProbeBatch
from cdscope.control import _chunks, frozen_parameters
from cdscope.errors import CdscopeError
from cdscope.finite import require_finite
from cdscope.gates import _first_tensor
from cdscope.likelihood import row_target_logprobs
from cdscope.models.adapters import adapter_for

PATHS = ("q", "k", "v")
STATISTICS = ("intensity", "info_complexity", "kurtosis")


def edge_count(num_layers: int) -> int:
    """E = 4L^2 + 3L + 1 (SPEC §6)."""
    return 4 * num_layers**2 + 3 * num_layers + 1


@dataclass(frozen=True)
class EdgeGraph:
    """The layer-level graph of an L-layer model.

    ``upstream`` are the 2L + 1 writing nodes (emb, attn0, mlp0, ...), ``consumers`` the
    4L + 1 reading paths ``(node, path)`` in order attn{l}.q, .k, .v, mlp{l}.in, ...,
    logits.in; edge ``e`` goes from ``upstream[edge_up[e]]`` into ``consumers[edge_cons[e]]``.
    """

    num_layers: int
    upstream: tuple[str, ...]
    consumers: tuple[tuple[str, str], ...]
    edge_up: np.ndarray
    edge_cons: np.ndarray

    @classmethod
    def from_layers(cls, num_layers: int) -> EdgeGraph:
        if num_layers < 1:
            raise ValueError(f"a graph needs at least one layer; got {num_layers}")
        upstream = ("emb", *(f"{s}{i}" for i in range(num_layers) for s in ("attn", "mlp")))
        consumers, reads_at = [], []  # reads_at: topological position of the reading node
        for i in range(num_layers):
            consumers += [(f"attn{i}", p) for p in PATHS] + [(f"mlp{i}", "in")]
            reads_at += [2 * i + 1] * 3 + [2 * i + 2]
        consumers.append(("logits", "in"))
        reads_at.append(2 * num_layers + 1)
        up, cons = np.nonzero(np.arange(len(upstream))[:, None] < np.array(reads_at)[None, :])
        return cls(num_layers, upstream, tuple(consumers), up, cons)

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
class EapLayout:
    """Where the consumers of one architecture family read the residual stream."""

    embedding: Callable[[nn.Module], nn.Module]  # output = h_0
    attn_norm: Callable[[nn.Module], nn.Module]
    qkv: Callable[[nn.Module], tuple[nn.Module, ...]]  # q, k, v projections, or (fused,)
    mlp_norm: Callable[[nn.Module], nn.Module]
    final_norm: Callable[[nn.Module], nn.Module]


_LLAMA = EapLayout(
    embedding=lambda m: m.model.embed_tokens,
    attn_norm=lambda b: b.input_layernorm,
    qkv=lambda b: (b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj),
    mlp_norm=lambda b: b.post_attention_layernorm,
    final_norm=lambda m: m.model.norm,
)
_GPT2 = EapLayout(
    embedding=lambda m: m.transformer.drop,  # token + position embeddings (dropout: eval)
    attn_norm=lambda b: b.ln_1,
    qkv=lambda b: (b.attn.c_attn,),
    mlp_norm=lambda b: b.ln_2,
    final_norm=lambda m: m.transformer.ln_f,
)
#: ``config.model_type`` -> layout. Sequential pre-norm blocks only: GPT-NeoX's parallel
#: residual (the MLP reads h_l, not h_l + attn_l) and Gemma's scaled embeddings and
#: post-sublayer norms need their own dataflow and are refused for now.
LAYOUTS: dict[str, EapLayout] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gpt2": _GPT2,
}


def layout_for(model: nn.Module) -> EapLayout:
    """The EAP layout of ``model``, or a CdscopeError naming the supported architectures."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in LAYOUTS:
        raise CdscopeError(
            f"eap-info does not support architecture {model_type!r} yet; supported: "
            f"{', '.join(sorted(LAYOUTS))} (sequential pre-norm blocks)"
        )
    if model_type == "gpt2" and getattr(model.config, "add_cross_attention", False):
        raise CdscopeError("eap-info: GPT-2 with cross-attention is not supported")
    return LAYOUTS[model_type]


def _require_grad(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
    """With frozen parameters nothing upstream of h_0 needs a gradient: start the graph here."""
    return None if output.requires_grad else output.detach().requires_grad_()


class EdgeHooks:
    """Owns the recording and aliasing hooks of one forward (see the module docstring).

    Inside ``with EdgeHooks(model) as hooks:`` a forward fills ``hooks.activations``
    (``[B, T, D]`` per upstream node, detached) and ``hooks.path_inputs`` (the per-path
    aliases, differentiable). Forward values are those of the unhooked model.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layout = layout_for(model)
        adapter = adapter_for(model)
        self.blocks = list(adapter.layers(model))
        self.graph = EdgeGraph.from_layers(len(self.blocks))
        self._writes = [module for _, _, module in adapter.write_modules(model)]
        self.activations: list[torch.Tensor | None] = [None] * len(self.graph.upstream)
        self.path_inputs: list[torch.Tensor | None] = [None] * len(self.graph.consumers)
        self._stash: dict[int, torch.Tensor] = {}
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> EdgeHooks:
        if self._handles:
            raise RuntimeError("EdgeHooks are already installed")
        try:
            self._install()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stash.clear()
        self.activations = [None] * len(self.activations)
        self.path_inputs = [None] * len(self.path_inputs)

    def _install(self) -> None:
        add, lay = self._handles.append, self.layout
        embedding = lay.embedding(self.model)
        add(embedding.register_forward_hook(self._record(0)))
        add(embedding.register_forward_hook(_require_grad))
        for index, module in enumerate(self._writes, start=1):
            add(module.register_forward_hook(self._record(index)))
        for layer, block in enumerate(self.blocks):
            norm = lay.attn_norm(block)
            add(norm.register_forward_pre_hook(self._stash_input(layer)))
            projections = lay.qkv(block)
            if len(projections) == 1:
                add(projections[0].register_forward_hook(self._fused_qkv(layer, norm)))
            else:
                for p, proj in enumerate(projections):
                    add(proj.register_forward_pre_hook(self._path_qkv(layer, p, norm)))
            add(lay.mlp_norm(block).register_forward_pre_hook(self._path_alias(4 * layer + 3)))
        final = 4 * len(self.blocks)
        add(lay.final_norm(self.model).register_forward_pre_hook(self._path_alias(final)))

    # -- hooks -----------------------------------------------------------------------
    def _alias(self, consumer: int, x: torch.Tensor) -> torch.Tensor:
        alias = x.view_as(x)
        self.path_inputs[consumer] = alias
        return alias

    def _record(self, index: int):  # noqa: ANN202 - torch hook signature
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            self.activations[index] = _first_tensor(output).detach()

        return hook

    def _stash_input(self, layer: int):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple) -> None:
            self._stash[layer] = args[0]

        return hook

    def _path_qkv(self, layer: int, path: int, norm: nn.Module):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple) -> tuple:
            alias = self._alias(4 * layer + path, self._stash[layer])
            return (norm.forward(alias), *args[1:])

        return hook

    def _fused_qkv(self, layer: int, norm: nn.Module):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            weight, bias = module.weight, module.bias  # Conv1D: out = x @ weight + bias
            if weight.device.type == "meta":
                raise CdscopeError(
                    "eap-info re-runs GPT-2's fused q/k/v projection, which cannot be offloaded "
                    "to disk: raise --max-memory so the attention layers stay in memory"
                )
            if weight.shape[1] != output.shape[-1] or output.shape[-1] % 3:
                raise CdscopeError(f"unexpected fused q/k/v projection {module!r}")
            width, parts = output.shape[-1] // 3, []
            for p in range(3):
                normed = norm.forward(self._alias(4 * layer + p, self._stash[layer]))
                cols = slice(p * width, (p + 1) * width)
                flat = torch.addmm(
                    bias[cols], normed.reshape(-1, normed.shape[-1]), weight[:, cols]
                )
                parts.append(flat.view(*normed.shape[:-1], width))
            return torch.cat(parts, dim=-1)

        return hook

    def _path_alias(self, consumer: int):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple) -> tuple:
            return (self._alias(consumer, args[0]), *args[1:])

        return hook


def answer_token_counts(batch: ProbeBatch, rows: torch.Tensor) -> torch.Tensor:
    """Number of scored answer (target) tokens of each row."""
    return batch.lengths[rows] - batch.target_start[rows]


def _scores_of_rows(
    hooks: EdgeHooks, batch: ProbeBatch, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward + one backward: ``([b, E] edge scores, [b] losses)`` of ``rows``."""
    logp = row_target_logprobs(hooks.model, batch, rows)
    losses = -logp / answer_token_counts(batch, rows).to(logp)
    grads = torch.autograd.grad(losses.sum(), hooks.path_inputs)
    wide = torch.promote_types(grads[0].dtype, torch.float32)
    device = grads[0].device  # under a device map the nodes live on several devices
    acts = torch.stack([a.to(device) for a in hooks.activations], dim=1).to(wide)  # [b, U, T, D]
    width = acts.shape[2]
    real = (
        torch.arange(width, device=acts.device)[None, :]
        < batch.lengths[rows].to(acts.device)[:, None]
    )
    acts = acts * real[:, None, :, None]
    path_grads = torch.stack([g.to(device) for g in grads], dim=1).to(wide)  # [b, C, T, D]
    full = -torch.bmm(acts.flatten(2), path_grads.flatten(2).transpose(1, 2))  # [b, U, C]
    graph = hooks.graph
    return full[:, graph.edge_up, graph.edge_cons], losses.detach()


@dataclass
class EdgeScores:
    """Per-sample edge scores ``[N, E]`` (float64) with each sample's loss and token count."""

    graph: EdgeGraph
    scores: np.ndarray
    loss: np.ndarray
    n_answer_tokens: np.ndarray

    def __post_init__(self) -> None:
        """NaN/inf losses or scores (non-finite weights) are refused, naming the first."""
        require_finite(
            (f"{name} of sample {i}", values[i])
            for i in range(len(self.loss))
            for name, values in (("answer loss", self.loss), ("edge scores", self.scores))
        )


def edge_scores(model: nn.Module, batch: ProbeBatch, batch_size: int | None = None) -> EdgeScores:
    """Zero-ablation EAP scores of every row of ``batch`` (SPEC §6).

    One forward + one backward per micro-batch of at most ``batch_size`` rows (rows of
    similar length go together); parameters are frozen for the duration.
    """
    scores, losses = [None] * batch.B, torch.zeros(batch.B, dtype=torch.float64)
    with EdgeHooks(model) as hooks, frozen_parameters(model):
        for rows in _chunks(batch.B, batch_size, batch.lengths):
            part, loss = _scores_of_rows(hooks, batch, rows)
            part = part.double().cpu()
            for i, b in enumerate(rows.tolist()):
                scores[b] = part[i]
            losses[rows] = loss.double().cpu()
        graph = hooks.graph
    counts = answer_token_counts(batch, torch.arange(batch.B)).numpy()
    return EdgeScores(graph, torch.stack(scores).numpy(), losses.numpy(), counts)


def edge_statistics(scores: np.ndarray) -> dict[str, np.ndarray]:
    """Per-sample statistics over the E edge magnitudes |s_e| (SPEC §6); ``scores`` [N, E].

    intensity       = mean_e |s_e|
    info_complexity = H(p) / log E with p_e = |s_e| / sum |s|   (in [0, 1])
    kurtosis        = Pearson (non-excess) kurtosis of |s_e|
    """
    mags = np.abs(np.asarray(scores, dtype=np.float64))
    if mags.ndim != 2 or mags.shape[1] < 2:
        raise ValueError(f"scores must be [N, E] with E >= 2; got shape {mags.shape}")
    return {
        "intensity": mags.mean(axis=1),
        "info_complexity": _sps.entropy(mags, axis=1) / np.log(mags.shape[1]),
        "kurtosis": _sps.kurtosis(mags, axis=1, fisher=False),
    }
