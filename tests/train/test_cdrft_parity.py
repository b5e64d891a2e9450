"""One CD-RFT step through the hf loop and through TRL's GRPOTrainer takes the same step.

Both backends start from identical copies of a tiny float64 Llama, see the same rollouts
(4 fixed completions of different lengths: the hf loop's ``generation.sample`` is
replaced by them, TRL gets them through its ``rollout_func``) and the same rewards
(``parity_reward``: groups (0, 1) and (2, 3), one 0 and one 1 each). Every prompt of the
task file is the same string, so the hf loop's seeded order and TRL's sampler pick the
same prompt tokens; completions are assigned by row, and both group consecutive rows.

What runs is each backend's own code: the hf loop's ``group_advantages`` +
``backbone_backward`` (micro-batches of 2) and ``torch.optim.AdamW``; TRL's advantages,
``_compute_loss`` (``loss_type="dapo"``, 2 accumulation steps) and its Trainer's AdamW
(``optim="adamw_torch"``: the same betas / eps, weight decay 0, cosine schedule without
warmup, so the step's lr is ``--lr`` in both). The CD-RFT part is the one shared
``CDRFTStep``, spied on: ``before_update`` (lambda grad R, proxy estimator) and
``after_update`` (one projection iteration: tau 34 % is below B_shared) run once per
backend, from the backend's own hook.

The GRPO gradients cannot be made bit-identical: the two paths score tokens differently
(the hf loop's ``completion_logprobs`` takes log-softmax of fp32-cast logits; TRL patches
the model with its own chunked, fused LM head, ``add_fused_lm_head``), so with equal
rewards the backbone gradients at the hook (each after its own backward) agree to
~1e-7 of their largest entry (measured 9e-8; asserted < 1e-5), not to float64 round-off.
AdamW's first step maps g to lr * g / (|g| + 1e-8), which amplifies such a difference on
coordinates whose gradient is near 1e-8: end to end, the weights then differ by up to
1e-8 (cdrft) or 1e-6 (none) at lr 1e-3 -- a test of that amplification, not of the step.
So, plainly: the parity assertion is on **the CD-RFT step given the same backbone
gradient** -- at ``before_update`` the TRL run's ``.grad`` (its own GRPO gradient,
checked close above) is replaced by the hf run's, and from there both backends add
lambda grad R, take their own optimizer step and project. The weights must then agree to
1e-12 (room for float64 round-off between two AdamW calls; measured: 0, bit for bit),
while the regulariser + projection move them by ~lr = 1e-3 (the second test: a run
without them lands more than lr / 10 away).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from cdscope.commands.train import prepare
from cdscope.core.generation import Rollouts
from cdscope.train import loop
from cdscope.train.step import CDRFTStep
from tests.helpers import byte_tokenizer, config, parity_reward, tiny_model, write_pool

trl = pytest.importorskip("trl", reason="trl not installed: pip install 'cdscope[trl]'")

from cdscope.integrations.trl import train_with_trl  # noqa: E402

PROMPT = "what is 1 + 1?\nSolution:\n"
#: four completions (printable bytes: they decode to themselves), groups (0, 1) and (2, 3)
COMPLETIONS = ["k7 Qa2", "x=4", "2 is it", "abc"]
TOLERANCE = 1e-12
LR = 1e-3


def same_prompt_tasks(path: Path) -> Path:
    records = [
        {
            "id": f"{family}/{i}",
            "family": family,
            "prompt": PROMPT,
            "verifier": "math",
            "answer": "2",
        }
        for family in ("code", "logic", "math")
        for i in range(2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def hf_sample(model, tokenizer, prompts, *, num_samples: int, **kwargs) -> Rollouts:
    """``generation.sample`` with the fixed completions, rows grouped by prompt."""
    rows = [p for p in prompts for _ in range(num_samples)]
    assert len(rows) == len(COMPLETIONS)
    prompt_ids = torch.tensor([tokenizer(p, add_special_tokens=False)["input_ids"] for p in rows])
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS]
    width = max(map(len, ids))
    completion_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
    completion_mask = torch.zeros(len(ids), width, dtype=torch.bool)
    for i, row in enumerate(ids):
        completion_ids[i, : len(row)] = torch.tensor(row)
        completion_mask[i, : len(row)] = True
    return Rollouts(
        torch.arange(len(prompts)).repeat_interleave(num_samples),
        prompt_ids,
        torch.ones_like(prompt_ids, dtype=torch.bool),
        completion_ids,
        completion_mask,
        torch.zeros(len(ids), dtype=torch.bool),  # every completion ends in its EOS
        list(COMPLETIONS),
        int(completion_mask.sum()),
        0.0,
    )


def trl_rollout(prompts: list, trainer) -> dict:
    """TRL's ``rollout_func`` with the same completions, by row of the generation batch."""
    tokenizer = trainer.processing_class
    assert len(prompts) == len(COMPLETIONS)  # one generation per optimizer step
    return {
        "prompt_ids": [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts],
        "completion_ids": [
            tokenizer(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS
        ],
        "logprobs": None,
    }


@pytest.fixture
def spied(monkeypatch) -> dict:
    """Counts the shared step object's calls, whichever backend makes them; records the
    backbone gradient each backend arrives with and, on the second run, replaces it by
    the first run's (see the module docstring)."""
    calls: dict = {"before_update": 0, "after_update": 0, "backbone": []}
    before, after = CDRFTStep.before_update, CDRFTStep.after_update

    def before_update(self, *args, **kwargs):
        calls["before_update"] += 1
        calls["backbone"].append([p.grad.detach().clone() for p in self.params])
        if len(calls["backbone"]) == 2:
            with torch.no_grad():
                for p, g in zip(self.params, calls["backbone"][0], strict=True):
                    p.grad.copy_(g)
        return before(self, *args, **kwargs)

    def after_update(self, *args, **kwargs):
        calls["after_update"] += 1
        return after(self, *args, **kwargs)

    monkeypatch.setattr(CDRFTStep, "before_update", before_update)
    monkeypatch.setattr(CDRFTStep, "after_update", after_update)
    return calls


def one_step(tmp_path: Path, backend: str, monkeypatch, **changes):
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = {
        "tasks": same_prompt_tasks(tmp_path / "tasks.jsonl"),
        "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }
    cfg = config(
        files, tmp_path / backend, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8,
        temperature=1.0, lr=LR, micro_batch_size=2, k_max=1, save_every=1, **changes,
    )  # fmt: skip
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    inputs = prepare(cfg, None, model, byte_tokenizer(), parity_reward)
    if backend == "hf":
        monkeypatch.setattr(loop, "sample", hf_sample)
        result = loop.train_hf(inputs)
    else:
        result = train_with_trl(inputs, rollout_func=trl_rollout, optim="adamw_torch")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, result.log


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_one_cdrft_step_is_the_same_through_trl_and_the_hf_loop(
    tmp_path: Path, monkeypatch, spied
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    start = tiny_model("llama", "sdpa", dtype=torch.float64).state_dict()
    hf, hf_log = one_step(tmp_path, "hf", monkeypatch)
    assert (spied["before_update"], spied["after_update"]) == (1, 1)
    ours, trl_log = one_step(tmp_path, "trl", monkeypatch)
    assert (spied["before_update"], spied["after_update"]) == (2, 2)  # the same object

    # each backend's own GRPO gradient, at the hook: the same up to float32 scoring
    hf_grad, trl_grad = spied["backbone"]
    scale = max(float(g.abs().max()) for g in hf_grad)
    backbone = max(float((a - b).abs().max()) for a, b in zip(hf_grad, trl_grad, strict=True))
    diff, moved = max_diff(hf, ours), max_diff(hf, start)
    print(
        f"backbone gradients: max difference {backbone / scale:.3g} of the largest entry; "
        f"weights after the CD-RFT step: max |w(hf) - w(trl)| = {diff:.3g}, moved {moved:.3g}"
    )
    assert scale > 1e-3 and backbone < 1e-5 * scale
    assert diff < TOLERANCE, diff
    assert moved > 0.5 * LR

    # the same step in both logs: rewards, the probe before / after, the projection
    for log in (hf_log, trl_log):
        assert list(log["step"]) == [1] and log["reward"].iloc[0] == 0.5
        assert log["proj_iters"].iloc[0] == 1 and log["r_regularizer"].notna().all()
    for column in ("b_shared_before", "r_before", "r_regularizer"):  # at the same theta
        assert hf_log[column].iloc[0] == trl_log[column].iloc[0], column
    for column in ("b_shared_after_update", "b_shared_after", "r_after"):
        assert hf_log[column].iloc[0] == pytest.approx(trl_log[column].iloc[0], abs=1e-12), column
    assert hf_log["loss"].iloc[0] == pytest.approx(trl_log["loss"].iloc[0], rel=1e-6)
    on_disk = pd.read_parquet(tmp_path / "trl" / "log.parquet")  # the hf log's column order
    assert list(on_disk.columns) == [c for c in hf_log.columns if c in on_disk.columns]


def test_the_regulariser_moves_the_weights_far_more_than_the_tolerance(
    tmp_path: Path, monkeypatch
) -> None:
    """Without lambda grad R and the projection the hf step lands elsewhere: a backend
    that skipped the shared step could not pass the parity test above."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    with_it, _ = one_step(tmp_path / "a", "hf", monkeypatch)
    without, log = one_step(tmp_path / "b", "hf", monkeypatch, regularizer="none")
    assert log["proj_iters"].iloc[0] == 0
    assert max_diff(with_it, without) > 0.1 * LR  # 1e8 times the tolerance
