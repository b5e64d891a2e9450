"""Helpers the tests share (not fixtures: those live in conftest.py): tiny random models
of every supported architecture built in memory, a byte-level tokenizer, probe pool and
task files, the CLI runner, a tiny training configuration and the gate-gradient twin."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.settings.training import TrainConfig
from cdscope.tools.tiny import byte_tokenizer  # noqa: F401 - the one definition

VOCAB = 300  # 256 byte tokens + specials, see byte_tokenizer()


COMMON_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _gpt2(attn: str):
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=128,
            bos_token_id=256,
            eos_token_id=257,
            attn_implementation=attn,
        )
    )


def _neox(attn: str):
    return GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=128,
            use_parallel_residual=True,
            attn_implementation=attn,
        )
    )


def _gemma2(attn: str):
    attn = "eager"  # Gemma-2 supports no sdpa path in transformers (soft-capped attention)
    return Gemma2ForCausalLM(
        Gemma2Config(
            **COMMON_CONFIG,
            head_dim=8,
            attn_implementation=attn,
            final_logit_softcapping=5.0,
            sliding_window=8,
        )
    )


BUILDERS = {
    "llama": lambda attn: LlamaForCausalLM(LlamaConfig(**COMMON_CONFIG, attn_implementation=attn)),
    "mistral": lambda attn: MistralForCausalLM(
        MistralConfig(**COMMON_CONFIG, attn_implementation=attn)
    ),
    "qwen2": lambda attn: Qwen2ForCausalLM(Qwen2Config(**COMMON_CONFIG, attn_implementation=attn)),
    "qwen3": lambda attn: Qwen3ForCausalLM(
        Qwen3Config(**COMMON_CONFIG, head_dim=8, attn_implementation=attn)
    ),
    "gpt2": _gpt2,
    "gpt_neox": _neox,
    "gemma2": _gemma2,
}


ARCHS = sorted(BUILDERS)


def tiny_model(arch: str, attn: str = "eager", dtype: torch.dtype = torch.float32, seed: int = 0):
    """A random tiny model of ``arch``; weights scaled up a little so gates matter."""
    torch.manual_seed(seed)
    model = BUILDERS[arch](attn).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model


def write_pool(
    path: Path, families: dict[str, int], prompt_len: int = 12, target_len: int = 6
) -> Path:
    """A small probe pool file: ``families`` maps family -> item count."""
    lines = []
    for family, count in families.items():
        for i in range(count):
            prompt = f"{family} question {i}: " + "abcdefghij"[: (i % 5) + 3] * (prompt_len // 6)
            target = f" answer {i * 7 % 13}" + "." * (i % 3)
            lines.append(
                json.dumps(
                    {
                        "id": f"{family}/{i:02d}",
                        "family": family,
                        "prompt": prompt,
                        "target": target[: target_len + i % 4],
                        "source": "tests",
                    }
                )
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def gate_gradient(model: torch.nn.Module, batch, embedding: torch.nn.Module):  # noqa: ANN001, ANN201
    """-dLoss_b/dg for [emb, gate 0, ..., gate K-1] per row: GatedModel plus a scalar on the
    output of ``embedding`` (h_0), Loss = mean NLL of the answer tokens (EAP's twin (a))."""
    from cdscope.core.control import frozen_parameters
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.likelihood import row_target_logprobs
    from cdscope.core.models.architecture import architecture_of

    architecture_of(model)  # discovered and proven before the h_0 scalar is hooked in
    g_emb = torch.ones(batch.B, dtype=torch.float64, requires_grad=True)
    handle = embedding.register_forward_hook(
        lambda m, a, out: out * g_emb.view(-1, 1, 1).to(out.dtype)
    )
    try:
        with GatedModel(model) as gm, frozen_parameters(model):
            gates = torch.ones(batch.B, gm.gate_set.K, dtype=torch.float64, requires_grad=True)
            with gm.gating(gates):
                logp = row_target_logprobs(model, batch, torch.arange(batch.B))
            loss = (-logp / (batch.lengths - batch.target_start).double()).sum()
            d_emb, d_gates = torch.autograd.grad(loss, [g_emb, gates])
    finally:
        handle.remove()
    return -torch.cat([d_emb[:, None], d_gates], dim=1).numpy()


runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def refused(result, *fragments: str) -> str:
    """Exit 2, no traceback, and the one ``error:`` line holding every fragment."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert errors, result.output
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)
    return errors[-1]


def parity_reward(tasks, completions) -> list[float]:
    """A deterministic stand-in reward with variance inside groups (tests the loop, not verifiers)."""
    return [float(sum(map(ord, text)) % 2) for text in completions]


def write_tasks_file(path: Path, families=("code", "logic", "math"), per_family: int = 4) -> Path:
    lines = []
    for family in families:
        for i in range(per_family):
            record = {
                "id": f"{family}/{i}",
                "family": family,
                "prompt": f"{family} task {i}: what is {i} + 1?\nSolution:\n",
                "verifier": "math",
                "answer": str(i + 1),
            }
            lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def train_files(directory: Path, pool_per_family: int = 4) -> dict[str, Path]:
    """A training run's task file and probe pool (math, code, logic) in ``directory``."""
    return {
        "tasks": write_tasks_file(directory / "tasks.jsonl"),
        "pool": write_pool(
            directory / "pool.jsonl", dict.fromkeys(("math", "code", "logic"), pool_per_family)
        ),
    }


#: the per-step log's wall-time columns: the only ones two runs of one step may differ in
TIMING_COLUMNS = ["rollout_s", "backbone_s", "measure_s", "regularizer_s", "projection_s", "step_s"]


def config(files: dict[str, Path], out: Path, **changes) -> TrainConfig:
    base = TrainConfig(
        model="tiny-llama", out_dir=str(out), steps=4, prompts_per_step=3, group_size=2,
        max_new_tokens=5, temperature=1.0, lr=1e-3, regularizer="cdrft", tau=34.0, k_max=2,
        eta_proj=1e-3, estimator="proxy", eps=0.01, probe_n=2, save_every=2,
        micro_batch_size=4, tasks=(str(files["tasks"]),), probe_files=(str(files["pool"]),),
    )  # fmt: skip
    return base.replace(**changes)


def embedding_module(model: torch.nn.Module) -> torch.nn.Module:
    """h_0: token embeddings (Llama family) / token + position embeddings (GPT-2)."""
    return model.transformer.drop if model.config.model_type == "gpt2" else model.model.embed_tokens


def write_eval_tasks(path: Path, code: bool = False) -> Path:
    rows = []
    for gen, count in (("add", 3), ("mul", 2)):
        for i in range(count):
            a, b = i + 2, i + 5
            value = a + b if gen == "add" else a * b
            rows.append(
                dict(
                    id=f"math/{gen}/eval/{i}",
                    family="math",
                    prompt=f"What is {a} {'+' if gen == 'add' else '*'} {b}?\nSolution:\n",
                    verifier="math",
                    answer=str(value),
                    meta={"generator": gen},
                )
            )
    if code:
        rows.append(
            dict(
                id="code/toy/0",
                family="code",
                prompt="def double(x):\n",
                verifier="code",
                tests="def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n",
                entry_point="double",
            )
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: the architectures the issue names, with (roles of layer 0, roles of layer 1, parallel
#: residual, post-sublayer norms): tiny configs of each run through every command
NAMED = {
    "mixtral": (("attn", "moe"), ("attn", "moe"), False, False),
    "qwen2_moe": (("attn", "moe"), ("attn", "moe"), False, False),
    "qwen3_moe": (("attn", "moe"), ("attn", "moe"), False, False),
    "deepseek_v3": (("attn", "mlp"), ("attn", "moe"), False, False),
    "olmo2": (("attn", "mlp"), ("attn", "mlp"), False, True),
    "phi3": (("attn", "mlp"), ("attn", "mlp"), False, False),
    "falcon": (("attn", "mlp"), ("attn", "mlp"), True, False),
    "gptj": (("attn", "mlp"), ("attn", "mlp"), True, False),
    "jamba": (("mixer", "mlp"), ("attn", "moe"), False, False),
}


def write_foreign_parquet(frame, path: Path, meta: dict) -> Path:  # noqa: ANN001
    """``frame`` with cdscope metadata as another writer would leave it: plain pyarrow,
    column types as Arrow infers them (cdscope's own writer refuses a column of the wrong
    type, cdscope.schemas), for crafted and corrupted input files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdscope.io import METADATA_KEY

    table = pa.Table.from_pandas(frame, preserve_index=False)
    extra = {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(extra), path)
    return Path(path)


def run_launcher(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` of a launcher (torchrun) in its own process group: on a timeout the
    whole group is killed -- a hung rank is torchrun's child and would outlive it otherwise."""
    with subprocess.Popen(cmd, start_new_session=True, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, **kwargs) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def per_sample_grpo_grads(model, r, adv, beta, ref):  # noqa: ANN001, ANN201
    """The GRPO gradient's slow twin: a per-sample loop on unpadded sequences,
    sum_i sum_t (-A_i logp_it + beta k3) / tokens (one policy update: rho = 1 in value).
    Returns each parameter's gradient (None where none reached it)."""
    model.zero_grad(set_to_none=True)
    total = int(r.completion_mask.sum())
    for i in range(r.completion_ids.shape[0]):
        prompt = r.prompt_ids[i][r.prompt_mask[i]]
        completion = r.completion_ids[i][r.completion_mask[i]]
        ids = torch.cat([prompt, completion])[None]

        def logp_of(m, ids=ids, prompt=prompt, completion=completion):  # noqa: ANN001, ANN202
            logits = m(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            return torch.log_softmax(logits, -1).gather(-1, completion[:, None]).squeeze(-1)

        logp = logp_of(model)
        loss = -adv[i] * logp.sum()
        if beta:
            delta = logp_of(ref).detach() - logp
            loss = loss + beta * (torch.exp(delta) - delta - 1).sum()
        (loss / total).backward()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]
