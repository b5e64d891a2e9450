"""How a measuring command loads each model: the one model-options group that every
model-loading command (probe, bshared, acg, decompose, nsweep, gradcheck, eval, eap-info,
inspect) takes, as typed. ``cdscope.core.models.opening.ModelOptions.from_settings`` parses the
placement (``--device-map`` / ``--max-memory`` / ``--offload-dir``) before any load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from cdscope.settings.names import DTYPE_CHOICES_HELP, MEASURE_AUTO_DTYPE_HELP, setting


@dataclass(frozen=True)
class ModelSettings:
    """The model options of a measuring command (defaults: the commands' defaults;
    ``inspect`` loads on the CPU and ``gradcheck`` with eager attention unless told)."""

    device: str = setting(
        "auto", "--device", "auto (CUDA if available, else CPU) | cpu | cuda[:N] | mps."
    )
    dtype: str = setting("auto", "--dtype", f"{MEASURE_AUTO_DTYPE_HELP} | {DTYPE_CHOICES_HELP}.")
    attn: str = setting(
        "auto", "--attn", "Attention kernel: auto | eager | sdpa | flash_attention_2."
    )
    device_map: str | None = setting(
        None,
        "--device-map",
        "Spread each model over GPUs/CPU/disk with accelerate: auto | balanced | "
        "balanced_low_0 | sequential | FILE.json (module -> device).",
    )
    max_memory: str | None = setting(
        None,
        "--max-memory",
        "Per-device caps for the device map, e.g. 0=70GiB,1=70GiB,cpu=200GiB (implies "
        "--device-map auto).",
    )
    offload_dir: Path | None = setting(
        None, "--offload-dir", "Folder for the weights that fit on no device (disk offload)."
    )
    revision: str | None = setting(
        None,
        "--revision",
        "Hub branch, tag or commit of every --model that is a hub id (the commit hash "
        "loaded is recorded in the output metadata).",
    )
    trust_remote_code: bool = setting(
        False,
        "--trust-remote-code",
        "Allow a hub repository or model directory to run its own modelling code.",
    )

    @property
    def places(self) -> bool:
        """Whether a device map was asked for (any of the three placement options)."""
        return any(v is not None for v in (self.device_map, self.max_memory, self.offload_dir))

    def changed(self, defaults: ModelSettings | None = None) -> dict[str, object]:
        """The options given with another value than ``defaults`` (the command's own):
        what ``--from`` refuses, since it loads no model."""
        base = defaults or ModelSettings()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        }
