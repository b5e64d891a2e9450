"""One CD-RFT run on TRL's GRPOTrainer, started by ``tests/train/test_trl_ddp.py`` under torchrun or alone.

    python tests/train/trl_ddp_run.py WORKDIR LAMBDA STEPS [fsdp]

The rollouts are sampled from the policy with one seeded generator per row of the
*global* generation batch (row = rank x rows-per-rank + i, the order in which TRL
slices the global batch over processes), so 1 process and 2 processes roll out the
same global batch; rewards are the deterministic ``parity_reward``. Everything else is
cdscope's TRL route unchanged. Rank 0 writes WORKDIR/run/final (weights) and the log.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from cdscope.commands.train import prepare  # noqa: E402
from cdscope.integrations.trl import train_with_trl  # noqa: E402
from tests.helpers import (  # noqa: E402
    byte_tokenizer,
    config,
    parity_reward,
    tiny_model,
    write_pool,
    write_tasks_file,
)


def seeded_rollout(max_new_tokens: int, temperature: float, seed: int):  # noqa: ANN201
    """TRL rollout_func: ancestral sampling from the policy, one generator per global row."""

    def rollout(prompts: list, trainer) -> dict:  # noqa: ANN001
        tokenizer = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        first = trainer.accelerator.process_index * len(prompts)
        step = trainer.state.global_step
        prompt_ids, completion_ids = [], []
        for i, prompt in enumerate(prompts):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            rng = torch.Generator().manual_seed(seed * 1_000_003 + step * 10_007 + first + i)
            seq, new = torch.tensor([ids]), []
            with torch.no_grad():
                for _ in range(max_new_tokens):
                    logits = model(input_ids=seq).logits[0, -1].float() / temperature
                    token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=rng))
                    new.append(token)
                    seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
            prompt_ids.append(ids)
            completion_ids.append(new)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def main(workdir: Path, lam: float, steps: int, fsdp: bool) -> None:
    rank = int(os.environ.get("RANK", "0"))
    own = workdir / f"inputs-{rank}"  # every rank writes its own copy: no races on files
    own.mkdir(parents=True, exist_ok=True)
    files = {
        "tasks": write_tasks_file(own / "tasks.jsonl"),
        "pool": write_pool(own / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }
    cfg = config(
        files, workdir / "run", steps=steps, lam=lam, save_every=1000, micro_batch_size=4,
        prompts_per_step=4, group_size=2,
    )  # fmt: skip
    inputs = prepare(cfg, None, tiny_model("llama", "eager"), byte_tokenizer(), parity_reward)
    # plain SGD: the weight change is linear in the gradient, so a regulariser counted
    # twice (or a backbone gradient summed instead of averaged) shows in the weights
    overrides: dict = {"optim": "sgd"}
    if fsdp:
        overrides |= {"fsdp": "full_shard", "fsdp_config": {"use_orig_params": True}}
    train_with_trl(
        inputs,
        rollout_func=seeded_rollout(cfg.max_new_tokens, cfg.temperature, cfg.seed),
        **overrides,
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), "fsdp" in sys.argv[4:])
