"""The settings of ``eval``, ``eap-info`` and ``gradcheck``: one dataclass each, whose
defaults are the commands' defaults (the CLI reads them from here, so this module stays
light: no torch, no numpy). ``ProbeSettings`` is what defines a probe measurement (probe and
the audits); ``train``'s settings are ``TrainConfig``. The names of the gate granularities
and of the estimators live here too, for the same reason: ``cdscope --help`` lists them
without importing torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from cdscope.errors import CdscopeError

#: RNG seeds fit the 32-bit words numpy's SeedSequence and torch.manual_seed take.
SEED_MAX = 2**32 - 1
#: counts (--seeds, --n, ...): far above any real run, far below overflow or allocation.
COUNT_MAX = 1_000_000
#: the gate sets ``GatedModel`` builds (docs/granularity.md): one gate per residual write,
#: per attention head, per routed / shared MoE expert, per MLP neuron
GATE_GRANULARITIES = ("sublayer", "head", "expert", "neuron")
#: every --granularity of the probe commands: the gate sets above, and one gate per edge of
#: the EAP graph (``cdscope.core.edge_control``, not a GatedModel gate set)
GRANULARITIES = (*GATE_GRANULARITIES, "edge")
#: estimators of C (SPEC §2): one backward, or 2K gated forwards (the slow check)
C_ESTIMATORS = ("autograd", "fd")
#: estimators of the regulariser gradient (``cdscope.core.regularizer.proxy_grad``; SPEC §5)
GRADIENT_ESTIMATORS = ("exact", "proxy", "richardson", "folded")
#: the default first-order estimator and its gate step, chosen from the measured fidelity
#: table (docs/gradcheck.md)
DEFAULT_ESTIMATOR = "folded"
DEFAULT_EPS = 0.01

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


@dataclass(frozen=True)
class ProbeSettings:
    """What defines a probe measurement; runs are comparable only when these agree."""

    seeds: tuple[int, ...]
    n: int = 3
    template: str = "plain"
    estimator: str = "autograd"
    batch_size: int | None = None
    fd_step: float = 1e-2
    fd_order: int = 2
    granularity: str = "sublayer"

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise CdscopeError(
                f"--granularity must be one of {', '.join(GRANULARITIES)}; got {self.granularity!r}"
            )
        if not self.seeds:
            raise CdscopeError("--seeds must be at least 1")
        if self.estimator not in C_ESTIMATORS:
            raise CdscopeError(
                f"--estimator must be one of {', '.join(C_ESTIMATORS)}; got {self.estimator!r}"
            )
        if self.granularity == "edge" and self.estimator != "autograd":
            raise CdscopeError(
                "edge granularity has only the autograd estimator: drop --estimator fd"
            )
        if self.fd_order not in (2, 4):
            raise CdscopeError(f"--fd-order must be 2 or 4; got {self.fd_order}")
        if self.batch_size is not None and self.batch_size < 1:
            raise CdscopeError(f"--batch-size must be at least 1, got {self.batch_size}")

    def comparable(self) -> dict:
        """The settings two runs must share for their numbers to be paired (and that
        ``--resume`` compares): n, template, estimator, the fd stencil when used, and the
        granularity when it is not ``sublayer`` (files from before it existed match)."""
        same = {"n": self.n, "template": self.template, "estimator": self.estimator}
        if self.estimator == "fd":
            same |= {"fd_step": self.fd_step, "fd_order": self.fd_order}
        if self.granularity != "sublayer":
            same["granularity"] = self.granularity
        return same
