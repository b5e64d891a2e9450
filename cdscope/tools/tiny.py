"""Tiny random models of any causal-LM type of transformers, saved like a user's checkpoint.

The coverage run (``cdscope.tools.coverage``), the tests and the benchmarks build their
models here: ``tiny_config`` (one generic set of small sizes ``SMALL`` plus the per-type
changes ``TWEAKS``, test scaffolding, not the architecture description: cdscope discovers
and proves a model's writes itself), ``tiny_model`` (float64, weights doubled so gates
matter), ``random_batch`` (two families of two rows), ``byte_tokenizer`` and
``save_checkpoint`` (``save_pretrained`` + the tokenizer: a directory ``--model`` loads).
A developer tool: nothing in the library imports ``cdscope.tools``.
"""

from __future__ import annotations

import contextlib

import torch

VOCAB = 512
#: generic tiny sizes, passed to every config (unknown keys are ignored by the models)
SMALL: dict = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    n_group=1,
    first_k_dense_replace=1,
    topk_group=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    state_size=8,
    ssm_state_size=8,
    mamba_d_state=8,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_d_ssm=128,
    mamba_chunk_size=16,
    chunk_size=16,
    num_heads=8,
    n_groups=1,
    time_step_rank=8,
    conv_kernel=4,
    expand=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    residual_in_fp32=False,
    tie_word_embeddings=False,
)
#: per-type changes to SMALL where the generic sizes do not instantiate or hide a feature
#: (a value of None removes the key: the config derives it and refuses it as an argument)
TWEAKS: dict[str, dict] = {
    "jamba": dict(
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1
    ),
    "gpt_neox": dict(use_parallel_residual=True),
    "gptj": dict(rotary_dim=8),
    **{  # multi-head latent attention: as many key/value heads as query heads
        t: dict(num_key_value_heads=4)
        for t in (
            "deepseek_v2",
            "deepseek_v3",
            "deepseek_v32",
            "glm4_moe_lite",
            "glm_moe_dsa",
            "minicpm3",
            "longcat_flash",
            "axk1",
            "axk2",
            "kimi_linear",
        )
    },
    "codegen": dict(rotary_dim=8),
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "gemma4": dict(head_dim=None),
    "gemma4_text": dict(head_dim=None),
    "gemma4_unified": dict(head_dim=None),
    "gemma4_unified_text": dict(head_dim=None),
    "falcon": dict(head_dim=None, new_decoder_architecture=True, num_kv_heads=2),
}


def tiny_config(model_type: str):  # noqa: ANN201
    """A small random config of ``model_type`` (text sub-config shrunk too)."""
    from transformers import AutoConfig

    kwargs = {k: v for k, v in {**SMALL, **TWEAKS.get(model_type, {})}.items() if v is not None}
    config = AutoConfig.for_model(model_type, **kwargs)
    text = config.get_text_config()
    if text is not config:
        sub_type = getattr(text, "model_type", None)
        fresh = AutoConfig.for_model(sub_type, **{**kwargs, **TWEAKS.get(sub_type, {})})
        for key, value in fresh.to_dict().items():
            if hasattr(text, key) and key not in ("model_type", "architectures"):
                with contextlib.suppress(AttributeError, TypeError, ValueError):
                    setattr(text, key, value)
    for key in ("use_cache",):
        setattr(config, key, False)
    return config


def tiny_model(model_type: str, seed: int = 0):  # noqa: ANN201
    """The float64 random model of ``tiny_config`` (weights scaled so gates matter)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(model_type)
    if getattr(config, "is_encoder_decoder", False):
        from cdscope.errors import CdscopeError

        raise CdscopeError(f"{model_type} is an encoder-decoder model: decoder-only only")
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager"
    )
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(2.0)
    return model


def random_batch(seed: int = 0):  # noqa: ANN201
    """Two families x two rows of random tokens, 7-10 tokens with 3-4 target tokens."""
    from cdscope.core.batch import ProbeBatch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([10, 8, 9, 7])
    ids = torch.randint(3, VOCAB, (4, 10), generator=gen)
    ids[torch.arange(10)[None, :] >= lengths[:, None]] = 0
    return ProbeBatch(
        input_ids=ids,
        lengths=lengths,
        target_start=lengths - torch.tensor([4, 3, 3, 4]),
        families=["a", "b"],
        row_family=torch.tensor([0, 0, 1, 1]),
        item_ids=["a/0", "a/1", "b/0", "b/1"],
    )


def byte_tokenizer():  # noqa: ANN201
    """A real fast tokenizer, one token per character (code points < 256) and three
    specials (ids 256-258), saved with every tiny checkpoint so it loads like a user's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(c): c for c in range(256)} | {"<s>": 256, "</s>": 257, "<pad>": 258}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def save_checkpoint(model, directory, dtype: torch.dtype = torch.float32):  # noqa: ANN001, ANN201
    """``model`` saved in ``dtype`` with ``save_pretrained`` and the byte tokenizer: a
    directory ``cdscope --model DIR`` loads like any user's checkpoint."""
    model.to(dtype).save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory
