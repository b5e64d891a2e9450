"""One hf-loop run of ``run_train``, started by ``tests/train/test_fsdp.py`` under torchrun or alone.

    python tests/train/fsdp_run.py WORKDIR [--sharding fsdp] [--activation-checkpointing]
        [--steps N] [--estimator E] [--beta B] [--resume] [--stop-after N]

A tiny Llama with its head tied to its embedding (``tied_llama``: the same seeded weights
on every rank; tied, like the embedded SmolLM2), cdscope's own probe and rollouts,
and the deterministic ``parity_reward`` (so the GRPO gradient is not zero). The task and
probe files are WORKDIR/tasks.jsonl and WORKDIR/pool.jsonl (``write_inputs``, called once
before a launch: every rank reads the same files); rank 0 writes WORKDIR/run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from cdscope.commands.train import run_train  # noqa: E402
from tests.helpers import (  # noqa: E402
    byte_tokenizer,
    config,
    parity_reward,
    tiny_model,
    write_pool,
    write_tasks_file,
)


def write_inputs(workdir: Path) -> dict[str, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    return {
        "tasks": write_tasks_file(workdir / "tasks.jsonl"),
        "pool": write_pool(workdir / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }


def tied_llama() -> torch.nn.Module:
    model = tiny_model("llama", "eager")
    model.lm_head.weight = model.model.embed_tokens.weight
    model.config.tie_word_embeddings = True
    return model


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--sharding", default="none")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--estimator", default="folded")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args(argv)
    files = {"tasks": args.workdir / "tasks.jsonl", "pool": args.workdir / "pool.jsonl"}
    if "RANK" not in os.environ and not files["tasks"].is_file():  # one process: no race
        write_inputs(args.workdir)
    cfg = config(
        files, args.workdir / "run", steps=args.steps, save_every=1, micro_batch_size=2,
        prompts_per_step=2, group_size=2, estimator=args.estimator, beta=args.beta,
        sharding=args.sharding, activation_checkpointing=args.activation_checkpointing,
        k_max=1, tau=34.0,
    )  # fmt: skip
    run_train(
        cfg, resume=args.resume, stop_after=args.stop_after, model=tied_llama(),
        tokenizer=byte_tokenizer(), reward_fn=parity_reward,
    )  # fmt: skip


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1:])
