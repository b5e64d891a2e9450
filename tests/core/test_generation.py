"""Batched sampling (cdscope.core.generation) against plain ``model.generate`` and one-prompt runs."""

from __future__ import annotations

import pytest
import torch

from cdscope.core.generation import completion_mask, eos_token_ids, sample
from cdscope.errors import CdscopeError
from tests.helpers import byte_tokenizer, tiny_model

PROMPTS = ["Q: 2+3=?\nSolution:\n", "hi", "def f(x):\n    return", "a longer prompt, padded less"]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", attn="sdpa", dtype=torch.float32)


def _plain_generate(model, tokenizer, prompts, max_new_tokens):
    """The reference: one direct ``model.generate`` call on the left-padded batch."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(
        **enc,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_token_ids(model, tokenizer),
    )
    return out[:, enc["input_ids"].shape[1] :]


def _masked(rollouts):
    return [
        row[m].tolist()
        for row, m in zip(rollouts.completion_ids, rollouts.completion_mask, strict=True)
    ]


def test_greedy_equals_plain_generate(model, tokenizer) -> None:
    got = sample(model, tokenizer, PROMPTS, num_samples=1, max_new_tokens=12, temperature=0, seed=0)
    ref = _plain_generate(model, tokenizer, PROMPTS, 12)
    mask = completion_mask(ref, eos_token_ids(model, tokenizer))
    assert _masked(got) == [row[m].tolist() for row, m in zip(ref, mask, strict=True)]
    assert got.generated_tokens == int(mask.sum()) == int(got.completion_mask.sum())


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_left_padding_matches_each_prompt_alone(attn: str, tokenizer) -> None:
    m = tiny_model("llama", attn=attn, dtype=torch.float32, seed=1)
    batched = sample(m, tokenizer, PROMPTS, num_samples=2, max_new_tokens=10, temperature=0, seed=0)
    for i, prompt in enumerate(PROMPTS):
        alone = sample(
            m, tokenizer, [prompt], num_samples=1, max_new_tokens=10, temperature=0, seed=0
        )
        assert alone.prompt_mask.all()
        for row in (2 * i, 2 * i + 1):
            assert _masked(batched)[row] == _masked(alone)[0]
            assert batched.texts[row] == alone.texts[0]
            ids = batched.prompt_ids[row][batched.prompt_mask[row]]
            assert ids.tolist() == alone.prompt_ids[0].tolist()
            # left padding: real tokens are a suffix of the row
            first = int(batched.prompt_mask[row].long().argmax())
            assert batched.prompt_mask[row, first:].all()


def test_layout_is_sample_major_within_a_prompt(model, tokenizer) -> None:
    r = sample(model, tokenizer, PROMPTS, num_samples=3, max_new_tokens=4, temperature=1.0, seed=3)
    assert r.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert r.prompt_ids.shape[0] == r.completion_ids.shape[0] == len(r.texts) == 12
    assert r.prompt_ids.dtype == r.completion_ids.dtype == torch.long
    assert r.prompt_mask.dtype == r.completion_mask.dtype == torch.bool
    assert r.seconds > 0


def test_masks_stop_at_the_first_eos(model) -> None:
    tokenizer = byte_tokenizer()
    free = sample(
        model, tokenizer, PROMPTS, num_samples=1, max_new_tokens=12, temperature=0, seed=0
    )
    assert free.completion_mask.all()  # the random model never emits </s> here
    # declare a token that row 0 emits at step 3 an end-of-sequence token of the model
    stop = int(free.completion_ids[0, 3])
    model.generation_config.eos_token_id = stop
    try:
        cut = sample(
            model, tokenizer, PROMPTS, num_samples=1, max_new_tokens=12, temperature=0, seed=0
        )
    finally:
        model.generation_config.eos_token_id = None
    stopped = 0
    for row in range(len(PROMPTS)):
        full = free.completion_ids[row].tolist()
        end = full.index(stop) + 1 if stop in full else len(full)
        stopped += end < len(full)
        assert cut.completion_mask[row].tolist() == [t < end for t in range(len(full))]
        assert cut.completion_ids[row, :end].tolist() == full[:end]  # EOS kept
        assert (cut.completion_ids[row, end:] == tokenizer.pad_token_id).all()
        assert cut.texts[row] == tokenizer.decode(full[:end], skip_special_tokens=True)
    assert stopped >= 1 and cut.completion_mask[0].sum() == 4
    assert cut.generated_tokens == int(cut.completion_mask.sum())


def test_completion_mask_against_a_loop() -> None:
    ids = torch.randint(0, 6, (40, 9), generator=torch.Generator().manual_seed(0))
    eos = [1, 4]
    mask = completion_mask(ids, eos)
    for row in range(ids.shape[0]):
        seen = False
        for t in range(ids.shape[1]):
            assert bool(mask[row, t]) == (not seen)
            seen = seen or int(ids[row, t]) in eos


def test_same_seed_same_samples_and_global_rng_untouched(model, tokenizer) -> None:
    kwargs = dict(num_samples=4, max_new_tokens=8, temperature=1.0, batch_size=5)
    state = torch.get_rng_state()
    a = sample(model, tokenizer, PROMPTS, seed=7, **kwargs)
    assert torch.equal(torch.get_rng_state(), state)
    b = sample(model, tokenizer, PROMPTS, seed=7, **kwargs)
    c = sample(model, tokenizer, PROMPTS, seed=8, **kwargs)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # the samples of one prompt differ from each other at temperature 1
    assert len({tuple(x) for x in _masked(a)[:4]}) > 1


def test_batch_size_chunks_agree_with_one_batch_when_greedy(model, tokenizer) -> None:
    one = sample(model, tokenizer, PROMPTS, num_samples=2, max_new_tokens=6, temperature=0, seed=0)
    seen: list[int] = []
    chunked = sample(
        model,
        tokenizer,
        PROMPTS,
        num_samples=2,
        max_new_tokens=6,
        temperature=0,
        seed=0,
        batch_size=3,
        on_batch=seen.append,
        share_prefill=False,
    )
    assert seen == [3, 6, 8]
    shared: list[int] = []  # a shared prefill keeps a prompt's rows in one call: 2 rows each
    grouped = sample(
        model, tokenizer, PROMPTS, num_samples=2, max_new_tokens=6, temperature=0, seed=0,
        batch_size=3, on_batch=shared.append,
    )  # fmt: skip
    assert shared == [2, 4, 6, 8]
    assert _masked(grouped) == _masked(one)
    assert _masked(one) == _masked(chunked) and one.texts == chunked.texts


def test_pad_token_is_set_when_missing(model) -> None:
    tokenizer = byte_tokenizer()
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    r = sample(
        model, tokenizer, PROMPTS[:2], num_samples=1, max_new_tokens=3, temperature=0, seed=0
    )
    assert tokenizer.pad_token == tokenizer.eos_token and len(r.texts) == 2


def test_model_mode_is_restored(model, tokenizer) -> None:
    model.train()
    try:
        sample(
            model, tokenizer, PROMPTS[:1], num_samples=1, max_new_tokens=2, temperature=0, seed=0
        )
        assert model.training
    finally:
        model.eval()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_samples=0), "num_samples"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(seed=-1), "seed"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_bad_arguments_are_refused(model, tokenizer, kwargs: dict, message: str) -> None:
    base = dict(num_samples=1, max_new_tokens=2, temperature=0.0, seed=0)
    with pytest.raises(CdscopeError, match=message):
        sample(model, tokenizer, PROMPTS, **(base | kwargs))
    with pytest.raises(CdscopeError, match="no prompts"):
        sample(model, tokenizer, [], **base)


@pytest.mark.slow
def test_embedded_model_greedy_matches_generate_and_single_prompts() -> None:
    from cdscope.core.models import load_model

    loaded = load_model()
    model, tok = loaded.model, loaded.tokenizer
    prompts = ["Question: What is 7 + 5?\nSolution:\n", "Write a haiku about rain.\nSolution:\n"]
    got = sample(model, tok, prompts, num_samples=1, max_new_tokens=24, temperature=0, seed=0)
    ref = _plain_generate(model, tok, prompts, 24)
    mask = completion_mask(ref, eos_token_ids(model, tok))
    assert _masked(got) == [row[m].tolist() for row, m in zip(ref, mask, strict=True)]
    for i, prompt in enumerate(prompts):
        alone = sample(
            model, tok, [prompt], num_samples=1, max_new_tokens=24, temperature=0, seed=0
        )
        assert alone.texts[0] == got.texts[i]
    a = sample(model, tok, prompts, num_samples=2, max_new_tokens=16, temperature=0.8, seed=1)
    b = sample(model, tok, prompts, num_samples=2, max_new_tokens=16, temperature=0.8, seed=1)
    assert a.texts == b.texts and all(isinstance(t, str) for t in a.texts)
