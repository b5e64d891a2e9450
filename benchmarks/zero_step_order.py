"""Why ``--backend trl`` refuses DeepSpeed ZeRO: the weights move before the callback's hook.

Runs TRL's ``GRPOTrainer`` for one optimizer step under DeepSpeed ZeRO (stage 2 or 3,
CPU accelerator, gloo) on a tiny random Llama with a callback that prints, at each hook of
the step, the sum of |weights| (``deepspeed.utils.safe_get_full_fp32_param``) and whether
the parameters hold a ``.grad``. Under accelerate the DeepSpeed engine steps inside
``accelerator.backward`` of the last micro-batch, so ``on_pre_optimizer_step`` -- where
cdscope's CD-RFT callback adds lambda grad R on every other engine -- already sees the
updated weights and no ``.grad``. DeepSpeed is not a cdscope dependency:

    pip install deepspeed            # 0.19.8 was used (DS_BUILD_OPS=0: nothing compiled up front)
    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 \\
        benchmarks/zero_step_order.py 2
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "train"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl_ddp_run import seeded_rollout  # noqa: E402

from tests.helpers import byte_tokenizer, tiny_model  # noqa: E402


class StepOrder(TrainerCallback):
    """Prints the weights' |sum| and whether .grad is set at each hook of the step."""

    def _say(self, hook: str, model) -> None:  # noqa: ANN001
        from deepspeed.utils import safe_get_full_fp32_param

        total = sum(
            float(safe_get_full_fp32_param(p).double().abs().sum()) for p in model.parameters()
        )
        grads = any(p.grad is not None for p in model.parameters())
        print(
            f"rank {os.environ.get('RANK', '0')} {hook:<15} sum|w| {total:.10f}  .grad set: {grads}"
        )

    def on_step_begin(self, args, state, control, model=None, **kwargs) -> None:  # noqa: ANN001
        self._say("step_begin", model)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs) -> None:  # noqa: ANN001
        self._say("pre_optimizer", model)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs) -> None:  # noqa: ANN001
        self._say("optimizer_step", model)


def main(stage: int) -> None:
    zero = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    args = GRPOConfig(
        output_dir="/tmp/zero_step_order", max_steps=1, per_device_train_batch_size=2,
        gradient_accumulation_steps=1, num_generations=2, max_completion_length=3,
        learning_rate=1e-2, use_cpu=True, bf16=False, gradient_checkpointing=False,
        report_to="none", optim="sgd", deepspeed=zero, logging_steps=1, save_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=tiny_model("llama", "eager"),
        reward_funcs=[
            lambda prompts, completions, **kw: [float(i % 2) for i in range(len(completions))]
        ],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": f"math task {i}: "} for i in range(8)]),
        processing_class=byte_tokenizer(),
        callbacks=[StepOrder()],
        rollout_func=seeded_rollout(3, 1.0, 0),
    )
    print(f"DeepSpeed enabled: {trainer.is_deepspeed_enabled}, ZeRO stage {stage}")
    trainer.train()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
