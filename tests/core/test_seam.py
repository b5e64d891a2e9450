"""The prompt/target seam (SPEC §2): a sample is tokenised as one text, and the scored
tokens are exactly the tokens of that single tokenisation which cover target characters.

The twin used here is independent of the offsets ``encode_scored`` reads: it decodes
growing prefixes of the single tokenisation and finds the first token whose text
reaches past the prompt.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from cdscope.core.batch import encode_probe, encode_scored, prompt_text
from cdscope.core.probes import ProbeItem, default_pool_paths, load_pool
from cdscope.errors import CdscopeError

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CODE_PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
CODE_TARGET = "    return a + b\n"


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE (GPT-2 style pre-tokenisation) trained on indented code, so
    that "\\n" + indentation merges into one token as in real code tokenizers."""
    corpus = [CODE_PROMPT + CODE_TARGET, "if x:\n    y = 1\n    return y\n", "Solution:\n42\n"] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def decoded_start(tokenizer: object, ids: list[int], prefix: str) -> int:
    """Slow twin: the first index whose decoded prefix is no longer a prefix of ``prefix``.

    A byte-level token may end inside a multi-byte character (decoded as U+FFFD); such a
    partial character counts as undecided here (no shipped seam falls inside one).
    """
    for i in range(len(ids) + 1):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=False)  # type: ignore[attr-defined]
        if not prefix.startswith(text.rstrip("\ufffd")):
            return i
    raise AssertionError("the target never starts")


def assert_seam_exact(tokenizer: object, item: ProbeItem, template: str) -> tuple[list[int], int]:
    """Scored tokens == the single tokenisation's tokens from the first target-covering one."""
    ids, start = encode_scored(tokenizer, item.prompt, item.target, template, item.id)
    prefix, special = prompt_text(tokenizer, item.prompt, template)
    single = tokenizer(prefix + item.target, add_special_tokens=special)["input_ids"]  # type: ignore[operator]
    assert ids == single[: len(ids)], item.id
    assert all(t in tokenizer.all_special_ids for t in single[len(ids) :])  # type: ignore[attr-defined]
    assert start == decoded_start(tokenizer, ids, prefix), item.id
    decoded = tokenizer.decode(ids[start:], skip_special_tokens=False)  # type: ignore[attr-defined]
    assert decoded.endswith(item.target), item.id  # every target character is covered
    return ids, start


def test_indented_code_target_scores_the_merged_seam_token() -> None:
    tok = bpe_tokenizer()
    item = ProbeItem("c0", "code", CODE_PROMPT, CODE_TARGET)
    ids, start = assert_seam_exact(tok, item, "plain")
    seam_token = tok.decode([ids[start]])
    assert seam_token.startswith("\n") and seam_token.strip(" ") == "\n", repr(seam_token)
    # separate tokenisation would have produced a split the model never sees
    separate = (
        tok(CODE_PROMPT)["input_ids"] + tok(CODE_TARGET, add_special_tokens=False)["input_ids"]
    )
    assert separate != ids


@pytest.mark.parametrize("template", ["plain", "chat"])
def test_batch_rows_equal_one_tokenisation_per_sample(template: str) -> None:
    tok = bpe_tokenizer()
    items = [
        ProbeItem("c0", "code", CODE_PROMPT, CODE_TARGET),
        ProbeItem("m0", "math", "12 + 30 =\nSolution:\n", "42"),
        ProbeItem("l0", "logic", "Is it true?", " yes"),
    ]
    batch = encode_probe(items, tok, template, pad_id=0)
    local, pos, labels = batch.predicting_positions(torch.arange(batch.B))
    for b, item in enumerate(items):
        ids, start = assert_seam_exact(tok, item, template)
        assert batch.input_ids[b, : len(ids)].tolist() == ids
        assert int(batch.target_start[b]) == start and int(batch.lengths[b]) == len(ids)
        assert labels[local == b].tolist() == ids[start:]
        assert pos[local == b].tolist() == list(range(start - 1, len(ids) - 1))


def test_eos_appended_by_the_tokenizer_is_not_scored() -> None:
    tok = bpe_tokenizer()
    from tokenizers import processors

    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)]
    )
    ids, start = encode_scored(tok, "12 + 30 =\n", "42")
    assert ids[0] == 0 and ids[-1] != 1 and tok.decode(ids[start:]) == "42"


def test_empty_target_and_promptless_items_are_refused() -> None:
    tok = bpe_tokenizer()
    with pytest.raises(CdscopeError, match="'x': the target is empty"):
        encode_scored(tok, "a", "", item_id="x")
    # no BOS and an empty prompt: nothing predicts the first target token
    tok.backend_tokenizer.post_processor = None
    with pytest.raises(CdscopeError, match="no prompt token precedes the target"):
        encode_scored(tok, "", "42", item_id="y")


@pytest.mark.slow
@pytest.mark.parametrize("template", ["plain", "chat"])
def test_every_shipped_item_is_scored_as_one_text(embedded, template: str) -> None:
    """All shipped families, both templates, on the embedded model's own tokenizer."""
    pool = load_pool(default_pool_paths())
    straddling = 0
    for family, items in pool.by_family.items():
        for item in items:
            ids, start = assert_seam_exact(embedded.tokenizer, item, template)
            prefix, _ = prompt_text(embedded.tokenizer, item.prompt, template)
            head = embedded.tokenizer.decode(ids[:start], skip_special_tokens=False)
            straddling += len(head) < len(prefix)
        assert items, family
    assert straddling >= 64  # every shipped code item starts at an indented line
