"""Edge attribution (zero-ablation EAP) on a layer-level graph (SPEC §6).

Graph (``cdscope.core.eap_graph``, built from the same architecture description as the gates).
An ordinary decoder with L layers has the nodes ``emb`` (the residual stream's initial
state h_0, the first block's input, or the output of the embedding norm inside block 0
where the stream starts there: RWKV's ``pre_ln``, ``Architecture.stream_start``), ``attn{l}`` and ``mlp{l}`` (their residual writes:
the very modules the gates of ``cdscope.core.gating.model`` multiply) and ``logits``; MoE blocks
give ``moe{l}`` nodes, SSM / linear-attention / convolution mixers ``mixer{l}`` nodes,
parallel-residual blocks read their block input. In topological order emb = 0,
attn{l} = 2l + 1, mlp{l} = 2l + 2, logits = 2L + 1, and every node reads the residual
stream, the sum of all writes before it:

    x_v = sum_{u before v} a_u        (a_u = s_u * module output; s_u = 1 but for
                                       residual multipliers such as MiniCPM's)

A node reads x_v through one or more *paths*: an attention node through three (q, k, v:
one shared pre-attention norm feeding three projections) or two (q, kv: multi-head
latent attention, where ``kv_a_proj_with_mqa`` feeds both k and v), an MLP / MoE / mixer
node through its pre-norm (``in``), the logits through the final norm. An edge
(u -> v, path) exists for every u before v, so there are 3(2l+1) edges into attn{l},
2l+2 into mlp{l} and 2L+1 into the logits:

    E = sum_l [3(2l+1) + (2l+2)] + (2L+1) = 4L^2 + 3L + 1          (L = 28: 3221)

(3L^2 + 3L + 1 with latent attention; see ``cdscope.core.eap_graph`` for the general count.)

Scores (SPEC §6). Zero-ablating u on one path changes only that path's input, by -a_u;
to first order the change of the loss is

    s(u -> v, p) = sum_{t, d} (-a_u[t, d]) * dLoss / dx_{v,p}[t, d]

with Loss = mean NLL of the sample's answer tokens and x_{v,p} the residual stream as
path p of v reads it. As a_u enters every path after u, dLoss/da_u is the sum of those
path gradients, which gives the consistency identity checked in the tests:

    sum_{(v, p) after u} s(u -> v, p) = -a_u . dLoss/da_u = -dLoss/dg_u   (at g = 1)

Mechanism: on the Hugging Face model itself, one forward and one backward per batch.
Hooks record a_u (the first block's input and the described write modules).
Forward pre-hooks give every consumer path its own alias x_{v,p} of the residual
stream (a view: no copy, but a separate autograd node):

- q/k/v (or q/kv): a pre-hook on the pre-attention norm stashes its input x; pre-hooks on
  the projections replace their input by ``norm.forward(alias_p(x))``, so the shared
  norm is re-run once per path and its original output goes unused. A fused projection
  (GPT-2's ``Conv1D`` c_attn, Phi-3's qkv_proj, GPT-NeoX / Falcon / Persimmon
  query_key_value) is rebuilt from its q, k and v output column sets — contiguous
  blocks or interleaved per head / per key-value group, as confirmed on the model by
  ``cdscope.core.eap_layout`` — each applied to its own normed alias (the same ``addmm`` /
  ``linear`` the module runs), and the columns put back in their places.
- MLP / MoE / mixer and logits: a pre-hook on the pre-norm / final norm replaces its
  input by an alias; where the pre-norm is shared with another node (GPT-J's ln_1), a
  pre-hook on the sublayer replaces its input by ``norm.forward(alias_p(x))`` instead.
- Writes are recorded as s_u * output, and the forward continues with a copy of the
  output, so that a block adding into it in place (Falcon: ``mlp_output +=
  attention_output``) leaves the recorded a_u intact.

``torch.autograd.grad(sum_b Loss_b, aliases)`` then yields every path gradient at once
(rows are independent, so each row's gradient is that sample's), and per row
S = -A G^T with A the stacked activations [U, T*D] and G the path gradients
[C, T*D]; only the E pairs with u before v are kept. Pad positions (right padding, no
attention mask, see ``cdscope.core.batch``) have exactly zero gradient; A is zeroed there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

import numpy as np
import torch
from scipy import stats as _sps
from torch import nn

from cdscope.core.batch import ProbeBatch, row_chunks
from cdscope.core.control import frozen_parameters
from cdscope.core.eap_graph import PATHS, EdgeGraph, eap_plan, eap_support, edge_count
from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.models.architecture import architecture_of
from cdscope.core.models.discovery import input_tensor
from cdscope.errors import CdscopeError
from cdscope.finite import require_finite
from cdscope.hooks import HookSet, first_tensor, replace_first, replace_input

__all__ = ["PATHS", "EdgeGraph", "edge_count", "eap_plan", "eap_support"]

STATISTICS = ("intensity", "info_complexity", "kurtosis")


def _leaf(x: torch.Tensor) -> torch.Tensor:
    """With frozen parameters nothing upstream of h_0 needs a gradient: start the graph here."""
    return x if x.requires_grad else x.detach().requires_grad_()


class EdgeHooks:
    """Owns the recording and aliasing hooks of one forward (see the module docstring).

    Inside ``with EdgeHooks(model) as hooks:`` a forward fills ``hooks.activations``
    (``[B, T, D]`` per upstream node, detached) and ``hooks.path_inputs`` (the per-path
    aliases, differentiable). Forward values are those of the unhooked model.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.arch = architecture_of(model)
        self.plan = eap_plan(model, self.arch)
        self.blocks = list(self.arch.layers(model))
        self.graph = EdgeGraph.from_plan(self.arch, self.plan)
        self.activations: list[torch.Tensor | None] = [None] * len(self.graph.upstream)
        self.path_inputs: list[torch.Tensor | None] = [None] * len(self.graph.consumers)
        self._stash: dict[str, torch.Tensor] = {}
        self._hooks = HookSet("EdgeHooks")

    def __enter__(self) -> EdgeHooks:
        self._hooks.install(self._install)  # removed again if installing fails
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._hooks.remove()
        self._stash.clear()
        self.activations = [None] * len(self.activations)
        self.path_inputs = [None] * len(self.path_inputs)

    def _install(self, hooks: HookSet) -> None:
        add, get = hooks.add, self.model.get_submodule
        if self.arch.stream_start:  # h_0 is a norm's output inside block 0 (RWKV's pre_ln)
            add(get(self.arch.stream_start).register_forward_hook(self._stream_start))
        else:
            add(self.blocks[0].register_forward_pre_hook(self._embedding, with_kwargs=True))
        consumer = 0
        for k, reads in enumerate(self.plan):
            w = reads.write
            add(get(w.path).register_forward_hook(self._record(k + 1, w.scale)))
            stream = reads.pre_norm or w.sublayer  # the module whose input is the stream
            norm = get(reads.pre_norm) if reads.pre_norm else None
            if reads.projections or reads.shared_norm or norm is None:
                hook = self._stash_input(stream)
                add(get(stream).register_forward_pre_hook(hook, with_kwargs=True))
            if reads.columns is not None:
                hook = self._fused_qkv(consumer, stream, norm, reads.columns)
                add(get(reads.projections[0]).register_forward_hook(hook))
            elif reads.projections:
                for p, proj in enumerate(reads.projections):
                    hook = self._path_rerun(consumer + p, stream, norm)
                    add(get(proj).register_forward_pre_hook(hook, with_kwargs=True))
            elif reads.shared_norm or norm is None:
                hook = self._path_rerun(consumer, stream, norm)
                add(get(w.sublayer).register_forward_pre_hook(hook, with_kwargs=True))
            else:
                add(norm.register_forward_pre_hook(self._path_alias(consumer), with_kwargs=True))
            consumer += len(reads.paths)
        final = get(self.arch.final_norm)
        add(final.register_forward_pre_hook(self._path_alias(consumer), with_kwargs=True))

    # -- hooks -----------------------------------------------------------------------
    def _alias(self, consumer: int, x: torch.Tensor) -> torch.Tensor:
        alias = x.view_as(x)
        self.path_inputs[consumer] = alias
        return alias

    def _embedding(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        x = _leaf(input_tensor(args, kwargs))
        self.activations[0] = x.detach()
        return replace_input(args, kwargs, x)

    def _stream_start(self, module: nn.Module, args: tuple, output: object) -> object:
        x = _leaf(first_tensor(output))
        self.activations[0] = x.detach()
        return replace_first(output, x)

    def _record(self, index: int, scale: float):  # noqa: ANN202 - torch hook signature
        """a_u = s_k * output (the block adds s_k times the module output). The forward
        continues with a copy: blocks that add into the output in place (Falcon's
        ``mlp_output += attention_output``) must not change the recorded write."""

        def hook(module: nn.Module, args: tuple, output: object) -> object:
            write = first_tensor(output)
            self.activations[index] = (write.detach() * scale) if scale != 1 else write.detach()
            return replace_first(output, write.clone())

        return hook

    def _stash_input(self, key: str):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._stash[key] = input_tensor(args, kwargs)

        return hook

    def _path_rerun(self, consumer: int, stream: str, norm: nn.Module | None):  # noqa: ANN202
        """Replace a reader's input by ``norm(alias(x))`` (or ``alias(x)`` without a norm)."""

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
            alias = self._alias(consumer, self._stash[stream])
            return replace_input(args, kwargs, norm.forward(alias) if norm else alias)

        return hook

    def _fused_qkv(self, consumer: int, stream: str, norm: nn.Module | None, columns: tuple):  # noqa: ANN202
        """Rebuild the fused output from its q, k, v column sets (``cdscope.core.eap_layout``),
        each computed from its own normed alias, and put the columns back in place."""
        inverse = torch.argsort(torch.cat(columns))

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            linear = isinstance(module, nn.Linear)  # else GPT-2 Conv1D: out = x @ W + b
            weight, bias = module.weight, module.bias
            if weight.device.type == "meta":
                raise CdscopeError(
                    "eap-info re-runs the fused q/k/v projection, which cannot be offloaded "
                    "to disk: raise --max-memory so the attention layers stay in memory"
                )
            if output.shape[-1] != len(inverse):
                raise CdscopeError(f"unexpected fused q/k/v projection {module!r}")
            parts = []
            for p, cols in enumerate(columns):
                alias = self._alias(consumer + p, self._stash[stream])
                normed = norm.forward(alias) if norm else alias
                cols = cols.to(weight.device)
                if linear:
                    part = nn.functional.linear(
                        normed, weight[cols], None if bias is None else bias[cols]
                    )
                else:
                    flat = torch.addmm(
                        bias[cols], normed.reshape(-1, normed.shape[-1]), weight[:, cols]
                    )
                    part = flat.view(*normed.shape[:-1], len(cols))
                parts.append(part)
            return torch.cat(parts, dim=-1)[..., inverse.to(output.device)]

        return hook

    def _path_alias(self, consumer: int):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
            return replace_input(args, kwargs, self._alias(consumer, input_tensor(args, kwargs)))

        return hook


def answer_token_counts(batch: ProbeBatch, rows: torch.Tensor) -> torch.Tensor:
    """Number of scored answer (target) tokens of each row."""
    return batch.lengths[rows] - batch.target_start[rows]


def edge_products(
    hooks: EdgeHooks, batch: ProbeBatch, rows: torch.Tensor, objective: torch.Tensor
) -> torch.Tensor:
    """``[b, E]``: a_u . d objective_b / d x_{v,p} of every row and edge (u -> v, p), summed
    over real positions and hidden dims, from one backward of ``objective.sum()`` (rows
    are independent). ``objective`` ``[b]`` comes from the hooked forward of ``rows``.

    With objective = Loss this is -s(u -> v, p); with objective = log pi it is the
    gradient of log pi in a gate on the edge at g = 1 (``cdscope.core.edge_control``).
    """
    grads = torch.autograd.grad(objective.sum(), hooks.path_inputs)
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
    full = torch.bmm(acts.flatten(2), path_grads.flatten(2).transpose(1, 2))  # [b, U, C]
    return full[:, hooks.graph.edge_up, hooks.graph.edge_cons]


def _scores_of_rows(
    hooks: EdgeHooks, batch: ProbeBatch, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward + one backward: ``([b, E] edge scores, [b] losses)`` of ``rows``."""
    logp = row_target_logprobs(hooks.model, batch, rows)
    losses = -logp / answer_token_counts(batch, rows).to(logp)
    return -edge_products(hooks, batch, rows, losses), losses.detach()


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
        for rows in row_chunks(batch.B, batch_size, batch.lengths):
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
