"""Shared fixtures (helpers that are not fixtures live in tests/helpers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings as hypothesis_settings
from transformers import PreTrainedTokenizerFast

from tests.helpers import byte_tokenizer, tiny_model, write_pool

# CI runs the property tests on a fixed example sequence (a red CI is then a reproducible
# regression, not a new random draw); local runs keep exploring new examples.
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _keep_thread_count():
    """A test that sets torch's thread count leaves it as it found it: fp32 results move
    with the thread count, so a leak made later tests depend on the order they ran in."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return byte_tokenizer()


@pytest.fixture
def pool_file(tmp_path: Path) -> Path:
    return write_pool(tmp_path / "pool.jsonl", {"math": 5, "code": 5, "logic": 5})


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved to disk with its tokenizer: loadable like any local model."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", attn="sdpa").save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M, loaded once per session (slow tests only)."""
    from cdscope.core.models import load_model

    load_model()  # builds the cache on a fresh machine
    return load_model()


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """The tiny Llama and a perturbed copy of it (same K), both saved to disk."""
    root = tmp_path_factory.mktemp("models")
    paths = []
    for name, scale in (("base", 0.0), ("perturbed", 0.2)):
        model = tiny_model("llama", "sdpa")
        with torch.no_grad():
            for p in model.parameters():
                p.add_(
                    scale
                    * torch.randn(p.shape, generator=torch.Generator().manual_seed(7))
                    * p.std()
                )
        model.save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
        paths.append(root / name)
    return paths
