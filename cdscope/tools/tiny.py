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
#: the sizes of a multimodal model's vision / audio encoder (built, never measured)
_ENCODER: dict = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4
)
_DOTS3: dict = dict(num_key_value_heads=4, n_shared_experts=1, index_n_heads=4, index_head_dim=16)
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
            "axk1",
            "axk2",
            "youtu",
        )
    },
    "codegen": dict(rotary_dim=8),
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    "gemma4": dict(head_dim=None),
    "gemma4_text": dict(head_dim=None),
    "gemma4_unified": dict(head_dim=None),
    "gemma4_unified_text": dict(head_dim=None),
    "falcon": dict(head_dim=None, new_decoder_architecture=True, num_kv_heads=2),
    # issue 31: the types whose config validators refuse the generic sizes
    **{  # Gemma-4's per-layer embeddings default to 262,144 x 256 per layer (134 M weights)
        t: dict(head_dim=None, vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16)
        for t in ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
    },
    **{  # a drafter: no per-layer embeddings, every layer reads a shared key/value cache
        t: dict(
            head_dim=None,
            vocab_size_per_layer_input=0,
            hidden_size_per_layer_input=0,
            backbone_hidden_size=64,
            num_kv_shared_layers=SMALL["num_hidden_layers"],
            text_config=dict(vocab_size_per_layer_input=0, hidden_size_per_layer_input=0),
        )
        for t in ("gemma4_assistant", "gemma4_unified_assistant")
    },
    "dbrx": dict(
        d_model=64,
        n_heads=4,
        n_layers=2,
        # the attention reads rope_theta and clamps q/k/v at clip_qkv (None fails)
        attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
        ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2),
    ),
    "dots1": dict(n_shared_experts=1),
    # multi-head latent attention with a shared expert, grouped routing and an indexer
    "dots3_note_text": _DOTS3,
    "dots3_note": dict(
        **_DOTS3,
        text_config=_DOTS3,  # the adapters' widths are checked against it at construction
        vision_config=dict(
            **_ENCODER, adapter_in_dim=64, adapter_out_dim=64, mlp_layer_types=["dense"]
        ),
        audio_config=dict(
            **_ENCODER, adapter_input_size=64, adapter_out_dim=64, downsample_hidden_size=32
        ),
    ),
    "cohere_compass_text": dict(  # rotary parameters per layer type (multimodal RoPE)
        rope_parameters={
            "full_attention": dict(rope_type="default", rope_theta=1e4, mrope_section=[4, 2, 2])
        }
    ),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "zamba": dict(num_hidden_layers=3, attn_layer_period=2, attn_layer_offset=1),
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"]),
    "zaya": dict(num_experts_per_tok=1),
    # Kimi Delta Attention heads default to 32 x 128 (2 M weights a layer)
    "kimi_linear": dict(num_key_value_heads=4, linear_attn_config=dict(num_heads=4, head_dim=16)),
    # the image and audio embedders default to 27 and 24 layers, 1024-1152 wide (870 M)
    "phi4_multimodal": dict(
        vision_config=dict(_ENCODER, image_size=28, crop_size=28),
        audio_config=dict(
            _ENCODER,
            num_blocks=1,
            ext_pw_out_channel=64,
            depthwise_separable_out_channel=64,
            nemo_conv_channels=64,
        ),
    ),
    # bytes -> local encoder -> patches -> global transformer -> local decoder; each part
    # defaults to 1024-2048 wide with 500,002-row hash embeddings (> 120 s at "tiny" size)
    "blt": dict(
        encoder_hash_byte_group_vocab=VOCAB,
        encoder_hash_byte_group_size=[3, 4],
        patcher_config=dict(_ENCODER, vocab_size=VOCAB, num_hidden_layers=2),
        encoder_config=dict(_ENCODER, vocab_size=VOCAB, hidden_size_global=64),
        decoder_config=dict(_ENCODER, vocab_size=VOCAB, num_hidden_layers=2, hidden_size_global=64),
        global_config=dict(_ENCODER, vocab_size=VOCAB, num_hidden_layers=2),
    ),
    # two attention sublayers per layer: num_hidden_layers is 2 x num_layers (2 layers here)
    "longcat_flash": dict(num_key_value_heads=4, num_hidden_layers=4),
    # the last layer reads the key/value cache of the first (15 shared layers by default)
    "gemma3n_text": dict(num_kv_shared_layers=1),
    "xlstm": dict(v_head_dim=None, num_blocks=2, embedding_dim=64),
    # the decoder of an encoder-decoder: ProphetNetForCausalLM drops the encoder itself
    # (is_decoder=True, is_encoder_decoder=False); num_hidden_layers is read-only
    "prophetnet": dict(
        num_hidden_layers=None,
        is_encoder_decoder=False,
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_encoder_attention_heads=4,
        num_decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
    ),
    # the LM head needs is_decoder (causal attention); one local and one LSH layer; the
    # axial position table's two factors multiply to max_position_embeddings (128) and
    # its widths sum to hidden_size; LSH hashes with a fixed seed (else every forward
    # draws new random rotations)
    "reformer": dict(
        is_decoder=True,
        attn_layers=["local", "lsh"],
        attention_head_size=16,
        feed_forward_size=96,
        axial_pos_shape=[8, 16],
        axial_pos_embds_dim=[16, 48],
        local_attn_chunk_length=8,
        lsh_attn_chunk_length=8,
        hash_seed=0,
    ),
    # max_position_embeddings is read-only (no length limit: relative positions)
    "xlnet": dict(
        max_position_embeddings=None, d_model=64, n_layer=2, n_head=4, d_head=16, d_inner=96
    ),
    # a cross-attention layer inside the two (real checkpoints have them every 5th layer
    # from 3): the row then measures the layout users load
    "mllama": dict(cross_attention_layers=[1]),
    # halve the stream after every block in eval mode (6 by default: never with 2 layers),
    # so that the run measures cdscope turning the rescaling off (core.models.rescaling)
    "rwkv": dict(rescale_every=1),
}


#: types whose causal-LM class takes another config than the type's own (MusicGen's
#: causal LM is its decoder over audio codebooks, without the text encoder)
CONFIG_TYPE = {"musicgen": "musicgen_decoder", "musicgen_melody": "musicgen_melody_decoder"}


def config_kwargs(*model_types: str) -> dict:
    """``SMALL`` with the ``TWEAKS`` of ``model_types`` applied in order (None: key removed)."""
    merged = dict(SMALL)
    for model_type in model_types:
        merged.update(TWEAKS.get(model_type, {}))
    return {k: v for k, v in merged.items() if v is not None}


def tiny_config(model_type: str):  # noqa: ANN201
    """A small random config of ``model_type`` (text sub-config shrunk too)."""
    from transformers import AutoConfig

    kwargs = config_kwargs(model_type)
    if isinstance(kwargs.get("text_config"), dict):  # a text config checked at construction
        kwargs["text_config"] = {**SMALL, **kwargs["text_config"]}
    config = AutoConfig.for_model(CONFIG_TYPE.get(model_type, model_type), **kwargs)
    text = config.get_text_config()
    if text is not config:
        sub_type = getattr(text, "model_type", None)
        # the outer type's tweaks win over its text type's (a drafter's zero sizes)
        sub_kwargs = config_kwargs(sub_type, model_type)
        sub_kwargs.pop("text_config", None)
        fresh = AutoConfig.for_model(sub_type, **sub_kwargs)
        for key, value in fresh.to_dict().items():
            if key in ("model_type", "architectures"):
                continue
            # a derived or per-layer attribute (Gemma-4's head_dim) keeps the config's own
            with contextlib.suppress(AttributeError, TypeError, ValueError, RuntimeError):
                if hasattr(text, key):
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
