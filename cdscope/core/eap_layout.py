"""Which output columns of a fused q/k/v projection are q, k and v (SPEC §6, issue 12).

A fused projection W (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``, GPT-NeoX / Falcon / Persimmon
``query_key_value``) computes q, k and v from one input; edge attribution splits its
output columns into three index sets, each applied to its own normed alias of the stream.

Layouts derived from the attention module and the config (``head_dim`` d, H query heads,
G key/value heads, all combinations whose 3-part width (H + 2G) d equals W's width):

- ``blocks``:  [q | k | v], widths (H d, G d, G d)                (GPT-2, Phi-3, Falcon
  multi-query: G = 1);
- ``grouped``: per key/value group g = 0..G-1 the block [q_g | k_g | v_g] of widths
  (H/G d, d, d)                (GPT-NeoX and Persimmon: G = H, [q_h | k_h | v_h] per
  head; Falcon's new decoder architecture: H/G query heads then one k and one v head).

A layout is accepted only when the model confirms it, at position 0 and 1 of the probe,
on the first layer's attention output o (one no-grad forward per check):

1. zeroing the presumed q and k columns at position 0 leaves o[0] unchanged (a causal
   softmax over one key is 1 whatever q and k are), zeroing the v columns does not;
2. zeroing the presumed q columns at position 1 leaves o[2:] unchanged (a query only
   affects its own row), zeroing the k columns at position 1 does not (later rows attend
   to key 1).

(1) pins the v columns exactly (any q/k column labelled v, or v column labelled q/k,
changes o[0]); (2) tells q from k. The first candidate passing both is used for every
fused layer; none passing is refused with one line.
"""

from __future__ import annotations

import torch
from torch import nn

from cdscope.core.models import discovery as d
from cdscope.core.models.placement import execution_device
from cdscope.errors import CdscopeError

Columns = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q, k, v output column indices


def _width(module: nn.Module) -> int | None:
    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() != 2:
        return None
    return weight.shape[0] if isinstance(module, nn.Linear) else weight.shape[1]


def _values(sources: list[object], names: tuple[str, ...]) -> list[int]:
    found = []
    for source in sources:
        for name in names:
            value = getattr(source, name, None)
            if isinstance(value, int) and value > 0 and value not in found:
                found.append(value)
    return found


def _blocks(heads: int, groups: int, dim: int) -> Columns:
    q, k = heads * dim, groups * dim
    cols = torch.arange(q + 2 * k)
    return cols[:q], cols[q : q + k], cols[q + k :]


def _grouped(heads: int, groups: int, dim: int) -> Columns:
    per = heads // groups  # query heads per key/value group
    block = (per + 2) * dim
    start = torch.arange(groups)[:, None] * block
    within = torch.arange(dim)[None, :]
    q = (start[:, :, None] + torch.arange(per * dim)[None, None, :]).reshape(-1)
    k = (start + per * dim + within).reshape(-1)
    return q, k, (start + (per + 1) * dim + within).reshape(-1)


def candidate_layouts(model: nn.Module, attention: nn.Module, fused: nn.Module) -> list[Columns]:
    """Every distinct ``blocks`` / ``grouped`` layout of the right width (module docstring)."""
    width, config = _width(fused), d.text_config(model)
    if width is None:
        return []
    sources = [attention, config]
    heads = _values(sources, ("num_heads", "num_attention_heads", "n_head"))
    groups = _values(sources, ("num_kv_heads", "num_key_value_heads", "multi_query_group_num"))
    hidden = _values([config], ("hidden_size", "n_embd"))
    dims = _values(sources, ("head_dim", "head_size"))
    dims += [h // n for h in hidden for n in heads if h % n == 0 and h // n not in dims]
    out, seen = [], set()
    for h in heads:
        for g in [*groups, h, 1]:
            for dim in dims:
                if g < 1 or h % g or (h + 2 * g) * dim != width:
                    continue
                for layout in (_blocks(h, g, dim), _grouped(h, g, dim)):
                    key = tuple(tuple(c.tolist()) for c in layout)
                    if key not in seen:
                        seen.add(key)
                        out.append(layout)
    return out


def _output_with_zeroed(
    model: nn.Module, fused: nn.Module, attention: nn.Module, cols: torch.Tensor, position: int
) -> torch.Tensor:
    """The attention output ``[B, T, D]`` with fused columns ``cols`` zeroed at ``position``."""
    seen: list[torch.Tensor] = []

    def zero(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        out = output.clone()
        out[:, position, cols.to(out.device)] = 0
        return out

    def grab(module: nn.Module, args: tuple, output: object) -> None:
        seen.append(d.first_tensor(output).detach().clone())

    handles = [fused.register_forward_hook(zero), attention.register_forward_hook(grab)]
    try:
        with d.eval_mode(model):
            d.run_probe(model, d.probe_ids(model, execution_device(model)))
    finally:
        for handle in handles:
            handle.remove()
    return seen[0]


def confirms(
    model: nn.Module, fused: nn.Module, attention: nn.Module, layout: Columns, base: torch.Tensor
) -> bool:
    """Checks (1) and (2) of the module docstring; ``base``: the unchanged output."""
    q, k, v = layout

    def out(cols: torch.Tensor, position: int) -> torch.Tensor:
        return _output_with_zeroed(model, fused, attention, cols, position)

    if not torch.allclose(out(torch.cat([q, k]), 0)[:, 0], base[:, 0]):
        return False
    if torch.allclose(out(v, 0)[:, 0], base[:, 0]):
        return False
    if not torch.allclose(out(q, 1)[:, 2:], base[:, 2:]):
        return False
    return not torch.allclose(out(k, 1)[:, 2:], base[:, 2:])


def fused_columns(model: nn.Module, fused_path: str, attention_path: str, where: str) -> Columns:
    """The confirmed q, k, v columns of the fused projection, or a one-line CdscopeError."""
    fused, attention = model.get_submodule(fused_path), model.get_submodule(attention_path)
    layouts = candidate_layouts(model, attention, fused)
    if not layouts:
        raise CdscopeError(
            f"{where}: fused projection {fused_path} does not have q + k + v columns"
        )
    base = _output_with_zeroed(model, fused, attention, torch.arange(0), 0)
    for layout in layouts:
        if confirms(model, fused, attention, layout, base):
            return layout
    raise CdscopeError(
        f"{where}: fused projection {fused_path}: none of its {len(layouts)} q/k/v column "
        "layouts (contiguous or per-head groups) passes the zeroing check"
    )
