"""Finite differences and the first-order regulariser on tiny MoE checkpoints (issue 36).

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/moe_routing.py --seeds 0,1,2

Per model type and seed: a tiny random model (``cdscope.tools.tiny``) saved with
``save_pretrained`` and loaded by path in float64 with eager attention and experts (the
user path), then on a random probe-sized batch (``probe_batch``: 3 families x 3 rows of
24-40 tokens, the last 6-9 scored):

* the relative Frobenius error ||C_fd - C_autograd|| / ||C_autograd|| of the fd twin at
  the default step (``ProbeSettings.fd_step``, second order);
* the cosine and relative error of the default regulariser estimator (``folded`` at
  ``DEFAULT_EPS``) against the exact double-backward gradient;
* where the code holds expert routing (``cdscope.core.routing``), the routing decisions
  the perturbed forwards would have switched, out of all decisions they made.

The script only uses names that exist before and after the routing hold, so the same file
measures both (run it with PYTHONPATH pointing at either tree).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "jamba")


def probe_batch(seed: int):  # noqa: ANN201
    """3 families x 3 rows of random tokens, 24-40 long, the last 6-9 tokens scored."""
    import torch

    from cdscope.core.batch import ProbeBatch
    from cdscope.tools.tiny import VOCAB

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(24, 41, (9,), generator=gen)
    ids = torch.randint(3, VOCAB, (9, 40), generator=gen)
    ids[torch.arange(40)[None, :] >= lengths[:, None]] = 0
    return ProbeBatch(
        input_ids=ids,
        lengths=lengths,
        target_start=lengths - torch.randint(6, 10, (9,), generator=gen),
        families=["a", "b", "c"],
        row_family=torch.arange(3).repeat_interleave(3),
        item_ids=[f"{f}/{i}" for f in "abc" for i in range(3)],
    )


def measure(model_type: str, seed: int, folder: Path) -> dict:
    import torch

    from cdscope.core.control import control_autograd, control_finite_difference
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.models.loading import load_model
    from cdscope.core.regularizer import exact_grad, fidelity, regularizer_grad
    from cdscope.settings import DEFAULT_EPS, DEFAULT_ESTIMATOR, ProbeSettings
    from cdscope.tools import tiny

    directory = tiny.save_checkpoint(tiny.tiny_model(model_type, seed), folder / model_type)
    model = load_model(str(directory), device="cpu", dtype="float64", attn="eager").model
    batch = probe_batch(seed)
    step = ProbeSettings.__dataclass_fields__["fd_step"].default
    with GatedModel(model) as gm:
        start = time.perf_counter()
        fast = control_autograd(gm, batch)
        slow = control_finite_difference(gm, batch, step=step)
        c_error = float(np.linalg.norm(slow.C - fast.C) / np.linalg.norm(fast.C))
        exact = exact_grad(gm, batch)
        approx = regularizer_grad(gm, batch, DEFAULT_ESTIMATOR, DEFAULT_EPS)
        seconds = time.perf_counter() - start
    row = {"type": model_type, "seed": seed, "c_rel_error": c_error, **fidelity(approx, exact)}
    row["fd_switched"] = _count(getattr(slow, "routing", None))
    row["reg_switched"] = _count(getattr(approx, "routing", None))
    row["seconds"] = seconds
    del torch
    return row


def _count(routing: object) -> str | None:
    """'4 / 1360' (switched / decisions) of a RoutingCount; None before the hold existed."""
    if routing is None:
        return None
    unheld = f" ({routing.unheld} not held)" if routing.unheld else ""
    return f"{routing.switched} / {routing.decisions}{unheld}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--types", default=",".join(TYPES))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print("| type | seed | C rel. error (fd h default) | folded cosine | folded rel. error "
          "| fd switched | regulariser switched | s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in args.types.split(","):
            for seed in seeds:
                r = measure(model_type, seed, Path(tmp) / f"s{seed}")
                print(
                    f"| {r['type']} | {r['seed']} | {r['c_rel_error']:.1e} | {r['cosine']:.6f} "
                    f"| {r['rel_error']:.1e} | {r['fd_switched'] or '-'} "
                    f"| {r['reg_switched'] or '-'} | {r['seconds']:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
