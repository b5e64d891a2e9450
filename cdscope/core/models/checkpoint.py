"""The embedded model's cache as a standard Hugging Face checkpoint (any engine loads it).

The embedded SmolLM2-135M ships as a GGUF file (``cdscope.embedded``); its first load
dequantises it to float32 and caches it under ``$CDSCOPE_CACHE/models/smollm2-135m``.
That directory is what ``cdscope models path smollm2-135m`` prints and what users hand
to vLLM (``vllm serve DIR``, ``LLM(model=DIR)``) or any HF tool, so it is written the
way ``save_pretrained`` writes a tied-embedding Llama:

- ``config.json`` names the class (``"architectures": ["LlamaForCausalLM"]``): an engine
  that picks its model implementation from this field needs it;
- ``model.safetensors`` holds every tensor once under the name the model's *input* side
  owns: of the state-dict keys that share one storage (tied embeddings:
  ``model.embed_tokens.weight`` and ``lm_head.weight``) the first in state-dict order is
  kept, the others dropped, and ``tie_word_embeddings`` in the config ties them again at
  load. (Format 1, cdscope before issue 37, kept ``lm_head.weight`` only and recorded the
  alias in the safetensors metadata, which transformers resolves but vLLM does not: vLLM
  left the embedding random and wrote gibberish.)

A format-1 cache is upgraded in place on its next use (loaded, written again in this
form, no GGUF needed); the marker ``cdscope-source.json`` records the GGUF's SHA-256 and
the format. The embedded model's identity for ``--resume`` is that GGUF hash, not the
cache's bytes, so the upgrade keeps earlier results resumable (docs/resume.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from cdscope.embedded import embedded_cache_dir
from cdscope.io import atomic_dir
from cdscope.lock import OutputLock

MARKER = "cdscope-source.json"
#: 1: lm_head.weight + alias metadata, no architectures (before issue 37); 2: standard
FORMAT = 2


def standard_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with each storage once: of the keys that share one tensor
    (tied weights) the first in state-dict order is kept (the input embedding of a tied
    decoder: ``model.embed_tokens.weight`` comes before ``lm_head.weight``)."""
    state: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        state[name] = tensor.detach().contiguous()
    return state


def save_standard(model: nn.Module, tokenizer: object, target: Path, gguf_sha256: str) -> None:
    """Write ``model`` (float32), its config and ``tokenizer`` to ``target`` atomically as a
    standard checkpoint (module doc), with the marker naming the GGUF it came from."""
    from safetensors.torch import save_file

    config = model.config.to_dict()  # type: ignore[attr-defined]
    for key in ("quantization_config", "_name_or_path"):
        config.pop(key, None)  # a GGUF load's; the venv path is no property of the model
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    state = {k: v.to(torch.float32) for k, v in standard_state_dict(model).items()}
    with atomic_dir(target) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        tokenizer.save_pretrained(tmp)  # type: ignore[attr-defined]
        marker = {"gguf_sha256": gguf_sha256, "format": FORMAT}
        (tmp / MARKER).write_text(json.dumps(marker))


def cache_format(target: Path) -> int | None:
    """The format of the cache at ``target`` (1 for a marker without one); None when
    there is no complete cache."""
    marker = target / MARKER
    if not marker.is_file():
        return None
    try:
        return int(json.loads(marker.read_text()).get("format", 1))
    except (ValueError, TypeError, AttributeError):
        return None  # unreadable: built again


def gguf_hash(target: Path) -> str:
    """The full SHA-256 of the GGUF the cache at ``target`` was made from."""
    return str(json.loads((target / MARKER).read_text())["gguf_sha256"])


def upgrade(target: Path) -> None:
    """Rewrite an older-format cache in the standard form: loaded by transformers (which
    resolves format 1's alias), written again with the same GGUF hash."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(target)
    save_standard(model, tokenizer, target, gguf_hash(target))


def build_embedded(console: object | None, dequantise: object) -> Path:
    """The embedded cache directory in the current format: built from the GGUF by
    ``dequantise() -> (model, tokenizer, gguf_sha256)`` when absent or unreadable, upgraded
    when older; one writer at a time (``OutputLock``), which re-checks after locking."""
    target = embedded_cache_dir()
    if cache_format(target) == FORMAT:
        return target
    from cdscope.messages import dim

    with OutputLock(target):
        found = cache_format(target)
        if found == FORMAT:  # another process finished while this one waited to lock
            return target
        if found is not None:
            if console is not None:
                dim(console, f"upgrading {target} to a standard checkpoint (format {FORMAT})...")
            try:
                upgrade(target)
                return target
            except Exception as exc:  # noqa: BLE001 - a damaged old cache is built again
                if console is not None:
                    dim(console, f"cannot upgrade ({type(exc).__name__}); building it again")
        model, tokenizer, digest = dequantise()  # type: ignore[operator]
        save_standard(model, tokenizer, target, digest)
    return target
