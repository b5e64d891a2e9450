"""The settings of ``eval``, ``eap-info`` and ``gradcheck``: one dataclass each, whose
defaults are the commands' defaults (the CLI reads them from here, so this module stays
light: no torch). ``probe``'s are ``frames.ProbeSettings``, ``train``'s ``TrainConfig``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from cdscope.errors import CdscopeError

DEFAULT_MAX_NEW_TOKENS = {"code": 256, "math": 256, "logic": 192}
FALLBACK_MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class EvalSettings:
    """What decides the samples (compared on --resume) plus how the run is executed."""

    n: int = 4
    ks: tuple[int, ...] = (1,)
    temperature: float = 0.6
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: dict[str, int] = field(default_factory=dict)  # per-domain overrides
    limit: int | None = None
    batch_size: int | None = None
    backend: str = "hf"
    timeout: float = 5.0
    workers: int = 2

    def tokens_for(self, domain: str) -> int:
        """Explicit DOMAIN=N, else '*' (one N for all), else the per-domain default."""
        default = DEFAULT_MAX_NEW_TOKENS.get(domain, FALLBACK_MAX_NEW_TOKENS)
        return self.max_new_tokens.get(domain, self.max_new_tokens.get("*", default))

    def comparable(self) -> dict:
        """The settings a resumed run must share with the file it extends."""
        keep = ("n", "temperature", "top_p", "seed", "batch_size", "backend")
        return {k: v for k, v in asdict(self).items() if k in keep} | {
            "max_new_tokens": dict(sorted(self.max_new_tokens.items()))
        }


@dataclass(frozen=True)
class EapSettings:
    """What defines an eap-info run."""

    family: str = "math"
    n: int = 5
    seed: int = 0
    use_targets: bool = False
    max_tokens: int = 512
    max_new_tokens: int = 256
    batch_size: int | None = None
    bootstrap: int = 2000

    def __post_init__(self) -> None:
        for name in ("n", "max_tokens", "max_new_tokens", "bootstrap"):
            if getattr(self, name) < 1:
                raise CdscopeError(f"--{name.replace('_', '-')} must be at least 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise CdscopeError(f"--batch-size must be at least 1, got {self.batch_size}")


@dataclass(frozen=True)
class GradcheckSettings:
    """What a gradcheck sweep measures (SPEC §5): the probe draw per seed, the gate steps
    of the proxy sweep (and of the Richardson proxy with ``richardson_sweep``), and the
    rows per forward (``None``: one on CPU, the whole draw on GPU)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    n: int = 3
    template: str = "plain"
    eps: tuple[float, ...] = (0.05, 0.02, 0.01, 0.005, 0.002, 0.001)
    richardson_sweep: bool = False
    batch_size: int | None = None
    granularity: str = "sublayer"  # the gate set whose C the regulariser shapes
