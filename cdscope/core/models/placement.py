"""Placing a model larger than one device: accelerate's big-model dispatch, validated up front.

One settings object, ``Placement``, carries ``--device-map``, ``--max-memory`` and
``--offload-dir`` for every command that loads a model. ``load_model`` turns it into an
explicit module -> device map before any weight is read:

- ``auto`` / ``balanced`` / ``balanced_low_0``: accelerate's balanced split of the
  modules over the GPUs (what transformers does for the same strings), then CPU, then disk;
- ``sequential``: fill GPU 0, then GPU 1, ..., then CPU, then disk;
- ``FILE.json``: a map written by the user, ``{"model.layers.0": 0, "lm_head": "cpu", ...}``.

``--max-memory 0=70GiB,1=70GiB,cpu=200GiB`` caps each device (keys: GPU index,
``cuda:N``, ``cpu``, ``mps``). Modules that fit nowhere go to ``disk`` and need
``--offload-dir``; without it the run stops before loading, with one line. Devices a map
names must exist on this machine.

Nothing in cdscope's math changes under a map: the gate hooks move each row's gates to
the device of the write they multiply, batch inputs go to the execution device (the
first GPU of the map, else CPU), and accelerate's hooks move activations between
devices and stream offloaded weights in for each forward. Offloaded weights are read
back exactly, so C is that of one device (tested: disk offload on CPU, ``tests/core/models/test_placement.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cdscope.errors import CdscopeError

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _device_key(raw: str | int, where: str) -> int | str:
    """A device name as accelerate wants it (GPU index, ``cpu``, ``mps``, ``disk``), checked."""
    text = str(raw).strip().lower()
    if text.startswith("cuda:"):
        text = text[5:]
    if text.isdigit():
        index = int(text)
        if index >= _cuda_count():
            raise CdscopeError(
                f"{where} names GPU {index} but this machine has {_cuda_count()} CUDA device(s); "
                "use existing GPU indices, cpu or disk"
            )
        return index
    if text == "mps" and not torch.backends.mps.is_available():
        raise CdscopeError(f"{where} names mps but MPS is not available on this machine")
    if text in ("cpu", "disk", "mps"):
        return text
    raise CdscopeError(
        f"{where}: unknown device {raw!r}; use a GPU index, cuda:N, cpu, mps or disk"
    )


def parse_max_memory(text: str) -> dict[int | str, int]:
    """``"0=70GiB,cpu=200GiB"`` -> ``{0: 75161927680, "cpu": 214748364800}`` (bytes)."""
    from accelerate.utils import convert_file_size_to_int

    limits: dict[int | str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, size = part.partition("=")
        if not sep or not size.strip():
            raise CdscopeError(
                f"--max-memory takes DEVICE=SIZE pairs like 0=70GiB,cpu=200GiB; got {part!r}"
            )
        device = _device_key(key, "--max-memory")
        if device == "disk":
            raise CdscopeError(
                "--max-memory caps memory devices; disk is unbounded (--offload-dir)"
            )
        try:
            amount = size.strip().replace(" ", "")
            limits[device] = int(amount) if amount.isdigit() else convert_file_size_to_int(amount)
        except ValueError:
            raise CdscopeError(
                f"--max-memory: {size.strip()!r} is not a size; write e.g. 70GiB, 500MB or bytes"
            ) from None
        if limits[device] <= 0:
            raise CdscopeError(f"--max-memory: {part!r} must be positive")
    if not limits:
        raise CdscopeError("--max-memory is empty; give DEVICE=SIZE pairs like 0=70GiB,cpu=200GiB")
    return limits


@dataclass(frozen=True)
class Placement:
    """``--device-map`` / ``--max-memory`` / ``--offload-dir``, parsed and checked."""

    device_map: str = "auto"  # a strategy from STRATEGIES, or a JSON file path
    max_memory: tuple[tuple[int | str, int], ...] = ()
    offload_dir: Path | None = None
    explicit_map: tuple[tuple[str, int | str], ...] = ()  # the JSON file's map, checked

    @classmethod
    def from_options(
        cls, device_map: str | None, max_memory: str | None, offload_dir: Path | str | None
    ) -> Placement | None:
        """None when no option is given (one device, as before); else a checked Placement.

        ``--max-memory`` or ``--offload-dir`` alone imply ``--device-map auto``.
        """
        if device_map is None and max_memory is None and offload_dir is None:
            return None
        strategy = device_map or "auto"
        explicit: tuple[tuple[str, int | str], ...] = ()
        if strategy not in STRATEGIES:
            explicit = _read_map_file(Path(strategy).expanduser())
            if max_memory is not None:
                raise CdscopeError(
                    "--max-memory applies to auto/balanced/sequential maps, not to a map file"
                )
        limits = tuple(parse_max_memory(max_memory).items()) if max_memory is not None else ()
        folder = Path(offload_dir).expanduser() if offload_dir is not None else None
        if folder is not None and folder.exists() and not folder.is_dir():
            raise CdscopeError(f"--offload-dir {folder} exists and is not a directory")
        placement = cls(strategy, limits, folder, explicit)
        if explicit and folder is None and "disk" in dict(explicit).values():
            raise CdscopeError(
                f"--device-map {strategy} puts modules on disk; add --offload-dir DIR"
            )
        return placement

    def describe(self) -> dict:
        """What the run metadata records of the placement."""
        return {
            "device_map": self.device_map,
            "max_memory": {str(d): b for d, b in self.max_memory} or None,
            "offload_dir": str(self.offload_dir) if self.offload_dir is not None else None,
        }

    @property
    def may_use_cuda(self) -> bool:
        """Whether the map can place anything on a GPU (decides ``--dtype auto``)."""
        if self.explicit_map:
            return any(isinstance(d, int) for _, d in self.explicit_map)
        if self.max_memory:
            return any(isinstance(d, int) for d, _ in self.max_memory)
        return _cuda_count() > 0

    def device_map_for(self, model: nn.Module, dtype: torch.dtype) -> dict[str, int | str]:
        """The module -> device map for ``model`` (real or empty weights), checked for disk use."""
        from accelerate import infer_auto_device_map
        from accelerate.utils import get_balanced_memory, get_max_memory

        if self.explicit_map:
            return dict(self.explicit_map)
        no_split = list(getattr(model, "_no_split_modules", None) or [])
        limits = dict(self.max_memory) or None
        if self.device_map == "sequential":
            limits = get_max_memory(limits)
        else:
            limits = get_balanced_memory(
                model,
                max_memory=limits,
                no_split_module_classes=no_split,
                dtype=dtype,
                low_zero=self.device_map == "balanced_low_0",
            )
        found = dict(
            infer_auto_device_map(
                model, max_memory=limits, no_split_module_classes=no_split, dtype=dtype
            )
        )
        if "" in found:  # one entry for the whole model: hook its children instead, because
            # cdscope calls the backbone and the output head separately (likelihood.py)
            found = {name: found[""] for name, _ in model.named_children()}
        on_disk = [name for name, device in found.items() if device == "disk"]
        if on_disk and self.offload_dir is None:
            caps = ",".join(f"{d}={b}" for d, b in self.max_memory) or "the free memory"
            raise CdscopeError(
                f"--max-memory {caps} cannot hold {len(on_disk)} of the model's modules "
                f"({', '.join(on_disk[:3])}{', ...' if len(on_disk) > 3 else ''}); "
                "add --offload-dir DIR to offload them to disk, or raise --max-memory"
            )
        return found

    def from_pretrained_kwargs(
        self, config_source: str | Path, dtype: torch.dtype, **config_kwargs: object
    ) -> dict:
        """``device_map`` (explicit), ``offload_folder`` for ``from_pretrained`` of a saved model."""
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(config_source, **config_kwargs)
        with init_empty_weights():
            skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype)
        skeleton.tie_weights()
        kwargs: dict = {"device_map": self.device_map_for(skeleton, dtype)}
        if self.offload_dir is not None:
            kwargs["offload_folder"] = str(self.offload_dir)
        return kwargs

    def dispatch(self, model: nn.Module, dtype: torch.dtype) -> nn.Module:
        """Place an in-memory model (e.g. dequantised from GGUF) with accelerate's dispatch."""
        from accelerate import dispatch_model

        device_map = self.device_map_for(model, dtype)
        model = dispatch_model(
            model,
            device_map,
            offload_dir=str(self.offload_dir) if self.offload_dir is not None else None,
            force_hooks=True,
        )
        model.hf_device_map = device_map
        return model


def _read_map_file(path: Path) -> tuple[tuple[str, int | str], ...]:
    if path.suffix != ".json":
        raise CdscopeError(
            f"--device-map must be one of {', '.join(STRATEGIES)} or a .json file; got {str(path)!r}"
        )
    if not path.is_file():
        raise CdscopeError(f"--device-map file not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CdscopeError(f"--device-map {path} is not readable JSON: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise CdscopeError(f"--device-map {path} must hold an object {{module name: device}}")
    where = f"--device-map {path}"
    return tuple((str(name), _device_key(device, where)) for name, device in raw.items())


def execution_device(model: nn.Module) -> torch.device:
    """Where a (possibly dispatched) model takes its inputs: its first GPU, else CPU.

    Without a device map: the device of its parameters. Under a map, offloaded
    parameters sit on ``meta`` between forwards, so parameters cannot be asked.
    """
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        gpus = [d for d in device_map.values() if d not in ("cpu", "disk")]
        if not gpus:
            return torch.device("cpu")
        first = gpus[0]
        return torch.device(f"cuda:{first}" if isinstance(first, int) else first)
    return next(model.parameters()).device


def require_resident_weights(model: nn.Module, command: str) -> None:
    """Refuse ``command`` (which differentiates the weights) when some weights are offloaded.

    Offloaded modules (CPU offload beside GPUs, or disk) hold their weights on ``meta``
    and receive copies for each forward, so a gradient with respect to them is lost.
    """
    offloaded = sorted({n.rsplit(".", 1)[0] for n, p in model.named_parameters() if p.is_meta})
    if offloaded:
        raise CdscopeError(
            f"{command} differentiates the weights, but {len(offloaded)} module(s) are offloaded "
            f"({', '.join(offloaded[:2])}{', ...' if len(offloaded) > 2 else ''}); keep every "
            "module on a compute device: raise --max-memory and drop --offload-dir"
        )
