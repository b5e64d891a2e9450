"""Sharded parameters whose gradient comes back None, and the exact estimator sharded,
started by ``tests/train/test_fsdp.py`` under torchrun. Each None case must stop with one
``CdscopeError`` line naming the parameter:

    torchrun --nproc_per_node 2 tests/train/fsdp_none_run.py WORKDIR

1. ``blocks-only``: FSDP2 on the decoder blocks but not on the root, so the probe takes the
   unsharded path (backbone, then head); ``torch.autograd.grad`` cannot reach the blocks'
   DTensor shards and returns None for them -- what used to become a silent zero.
2. ``bypass``: a fully sharded model whose MLP output in one block is detached (a forward
   that bypasses autograd), so FSDP's reduce-scatter leaves that MLP's shards' ``.grad``
   None after the regulariser's backward.
3. ``step``: the training step's check, on a sharded model whose one parameter holds no
   gradient after a backbone backward that reached the others.

4. ``exact``: the exact (double backward) regulariser gradient of a sharded model against
   the same model unsharded: ``exact: <relative L2 difference>``.

Rank 0 writes one line per case to WORKDIR/outcome.txt: ``case: error message``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from cdscope.core.batch import encode_probe  # noqa: E402
from cdscope.core.gating.model import GatedModel  # noqa: E402
from cdscope.core.models.architecture import architecture_of  # noqa: E402
from cdscope.core.probes import draw_probe, load_pool  # noqa: E402
from cdscope.core.regularizer import regularizer_grad  # noqa: E402
from cdscope.errors import CdscopeError  # noqa: E402
from cdscope.train.engine import shard  # noqa: E402
from cdscope.train.step import CDRFTStep  # noqa: E402
from tests.helpers import byte_tokenizer, config, tiny_model, write_pool  # noqa: E402


def _model(root: bool) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = tiny_model("llama", "eager")
    architecture_of(model)  # discovered and proven unsharded
    if root:
        shard(model)
    else:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.model.layers:
            fully_shard(block, mesh=mesh)
    return model


def main(workdir: Path) -> None:
    rank = dist.get_rank()
    own = workdir / f"inputs-{rank}"
    own.mkdir(parents=True, exist_ok=True)
    pool = load_pool([str(write_pool(own / "pool.jsonl", {"a": 2, "b": 2, "c": 2}))])
    batch = encode_probe(draw_probe(pool, 0, 2, pool.families), byte_tokenizer())
    outcomes = []

    def case(name: str, run) -> None:  # noqa: ANN001
        try:
            run()
            outcomes.append(f"{name}: no error")
        except CdscopeError as exc:
            outcomes.append(f"{name}: {exc}")

    def blocks_only() -> None:
        with GatedModel(_model(root=False)) as gm:
            regularizer_grad(gm, batch, "folded", 0.01, batch_size=1)

    def bypass() -> None:
        model = _model(root=True)
        mlp = model.model.layers[1].mlp
        mlp.register_forward_hook(lambda module, args, out: out.detach())
        with GatedModel(model) as gm:
            regularizer_grad(gm, batch, "folded", 0.01, batch_size=1)

    def step() -> None:
        model = _model(root=True)
        params = [p for p in model.parameters() if p.requires_grad]
        model(input_ids=batch.input_ids[:1]).logits.sum().backward()
        params[-1].grad = None  # the one a backward did not reach
        cfg = config({"tasks": own, "pool": own}, workdir / "run", regularizer="none")
        with GatedModel(model) as gm:
            CDRFTStep(cfg, gm, batch, params, lambda: None).before_update(1)

    def exact() -> None:
        plain = tiny_model("llama", "eager")
        with GatedModel(plain) as gm:
            expected = regularizer_grad(gm, batch, "exact", batch_size=2).flat()
        with GatedModel(_model(root=True)) as gm:
            result = regularizer_grad(gm, batch, "exact", batch_size=2)
        got = torch.cat([g.full_tensor().reshape(-1).double() for g in result.grads])
        outcomes.append(f"exact: {float((got - expected).norm() / expected.norm())!r}")

    exact()
    case("blocks-only", blocks_only)
    case("bypass", bypass)
    case("step", step)
    if rank == 0:
        (workdir / "outcome.txt").write_text("\n".join(outcomes) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        main(Path(sys.argv[1]))
        dist.barrier()  # both ranks past every collective before the group goes
    finally:
        dist.destroy_process_group()
    # Everything is written. The refused cases leave FSDP state whose gloo work can still be
    # freed at interpreter teardown, which aborted rank 1 once in CI ("terminate called
    # without an active exception", SIGABRT; pytorch/pytorch#190489): leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
