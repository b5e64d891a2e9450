"""The settings of the measuring commands: a probe measurement (probe and every audit),
the audits' statistics, nsweep, gradcheck and eap-info. Each dataclass validates itself
once (``__post_init__``); its ``setting`` fields are the commands' options
(``cdscope.cli.options``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cdscope.errors import CdscopeError, option
from cdscope.settings.names import (
    BATCH_HELP,
    C_ESTIMATORS,
    COUNT_MAX,
    EDGE,
    GATE_GRANULARITIES,
    GRANULARITIES,
    GRANULARITY_HELP,
    PROBE_SPLIT_HELP,
    PROBE_SPLITS,
    SEED_MAX,
    SEEDS_HELP,
    SUBLAYER,
    TEMPLATE_HELP,
    require_batch_size,
    require_one_of,
    setting,
)

#: the probe sizes nsweep sweeps unless --ns says otherwise (docs/nsweep.md)
NS_SWEPT = (1, 2, 3, 6, 12, 24)


@dataclass(frozen=True)
class ProbeSettings:
    """What defines a probe measurement; runs are comparable only when these agree."""

    seeds: tuple[int, ...]
    n: int = setting(3, "--n", "Probe samples per family per seed.", min=1, max=COUNT_MAX)
    template: str = setting("plain", ("--template", "-t"), TEMPLATE_HELP)
    estimator: str = setting(
        "autograd", "--estimator", "autograd (one backward) | fd (2K gated forwards, slow check)."
    )
    batch_size: int | None = setting(None, ("--batch-size", "-b"), BATCH_HELP, min=1)
    fd_step: float = setting(
        1e-2, "--fd-step", "Gate step h of the fd estimator.", low=0, high=1, low_open=True
    )
    fd_order: int = setting(
        2, "--fd-order", "fd stencil: 2 (2K passes, O(h^2)) or 4 (4K passes, O(h^4))."
    )
    granularity: str = setting(SUBLAYER, "--granularity", GRANULARITY_HELP)
    #: the half of the pool drawn from; ``all`` by default, so audits measure what they
    #: measured before the split existed (docs/decisions.md)
    probe_split: str = setting("all", "--probe-split", PROBE_SPLIT_HELP)

    def __post_init__(self) -> None:
        require_one_of("granularity", self.granularity, GRANULARITIES)
        require_one_of("probe_split", self.probe_split, PROBE_SPLITS, " | ")
        if not self.seeds:
            raise CdscopeError(f"{option('seeds')} must be at least 1")
        require_one_of("estimator", self.estimator, C_ESTIMATORS)
        if self.granularity == EDGE and self.estimator != "autograd":
            raise CdscopeError(
                f"edge granularity has only the autograd estimator: drop {option('estimator', 'fd')}"
            )
        if self.fd_order not in (2, 4):
            raise CdscopeError(f"{option('fd_order')} must be 2 or 4; got {self.fd_order}")
        require_batch_size(self.batch_size)

    def comparable(self) -> dict:
        """The settings two runs must share for their numbers to be paired (and that
        ``--resume`` compares): n, template, estimator, the fd stencil when used, and the
        granularity when it is not ``SUBLAYER`` and the pool's half when it is not ``all``
        (files from before either existed match)."""
        same = {"n": self.n, "template": self.template, "estimator": self.estimator}
        if self.estimator == "fd":
            same |= {"fd_step": self.fd_step, "fd_order": self.fd_order}
        if self.granularity != SUBLAYER:
            same["granularity"] = self.granularity
        if self.probe_split != "all":
            same["probe_split"] = self.probe_split
        return same


@dataclass(frozen=True)
class AuditSettings:
    """The statistics of bshared / acg / decompose around the probe measurement."""

    seeds: int = setting(3, ("--seeds", "-s"), SEEDS_HELP, min=1, max=COUNT_MAX)
    bootstrap: int = setting(
        1000,
        "--bootstrap",
        "Resamples of each family's probe samples for the per-seed intervals (0: none).",
        min=0,
        max=100_000,
    )
    detect: float = setting(  # percentage points, as typed; the engine takes a fraction
        5.5,  # the paper's paired Delta B_shared, -5.5 +- 1.9 points (magnitude)
        "--detect",
        "Target Δ in percentage points that the seeds-needed column is for (80% power, "
        "paired t-test; default: the paper's paired ΔB_shared; never the observed Δ).",
        low=0,
        high=100,
        low_open=True,
    )
    fail_above: float | None = setting(
        None,
        "--fail-above",
        "CI gate: exit 1 if a model's mean B_shared(C) exceeds PCT percent.",
        low=0,
        high=100,
    )

    def __post_init__(self) -> None:
        if self.bootstrap < 0:
            raise CdscopeError(
                f"--bootstrap must be 0 (off) or a number of resamples; got {self.bootstrap}"
            )
        if not self.detect > 0:
            raise CdscopeError(
                f"--detect is a positive difference in percentage points; got {self.detect}"
            )


@dataclass(frozen=True)
class NsweepSettings:
    """The seeds and probe sizes of an nsweep (SPEC §4, docs/nsweep.md)."""

    seeds: int = setting(7, ("--seeds", "-s"), SEEDS_HELP, min=1, max=COUNT_MAX)
    ns: tuple[int, ...] = NS_SWEPT

    def __post_init__(self) -> None:
        if not self.ns or min(self.ns) < 1:
            shown = ",".join(map(str, self.ns))
            raise CdscopeError(f"--ns values must be at least 1; got {shown!r}")

    @classmethod
    def parse(cls, seeds: int, text: str) -> NsweepSettings:
        """``--ns 1,2,3,6``: sorted and distinct (the nested subsets grow with n)."""
        try:
            ns = sorted({int(part) for part in text.split(",") if part.strip()})
        except ValueError:
            raise CdscopeError(
                f"--ns takes comma-separated integers like 1,2,3,6; got {text!r}"
            ) from None
        return cls(seeds, tuple(ns))


@dataclass(frozen=True)
class GradcheckSettings:
    """What a gradcheck sweep measures (SPEC §5): the probe draw per seed, the gate steps
    of the proxy sweep (and of the Richardson proxy with ``richardson_sweep``), and the
    rows per forward (``None``: one on CPU, the whole draw on GPU)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    n: int = setting(3, "--n", "Probe samples per family per seed.", min=1, max=COUNT_MAX)
    template: str = setting("plain", ("--template", "-t"), TEMPLATE_HELP)
    eps: tuple[float, ...] = (0.05, 0.02, 0.01, 0.005, 0.002, 0.001)
    richardson_sweep: bool = setting(
        False, "--richardson-sweep", "Also sweep the Richardson proxy over every --eps."
    )
    batch_size: int | None = setting(None, ("--batch-size", "-b"), BATCH_HELP, min=1)
    granularity: str = setting(  # the gate set whose C the regulariser shapes
        SUBLAYER, "--granularity", f"Gates: {' | '.join(GATE_GRANULARITIES)}."
    )

    def __post_init__(self) -> None:
        if not self.eps or not all(0 < e < 1 for e in self.eps):  # NaN fails every comparison
            raise CdscopeError(f"--eps values must be finite numbers in (0, 1); got {self.eps}")
        if not all(0 <= s <= SEED_MAX for s in self.seeds):
            raise CdscopeError(f"--first-seed + --seeds must stay within [0, {SEED_MAX}]")
        require_batch_size(self.batch_size)
        if self.granularity not in GATE_GRANULARITIES:
            raise CdscopeError(
                f"gradcheck --granularity must be one of {', '.join(GATE_GRANULARITIES)}; "
                f"got {self.granularity!r}"
            )


@dataclass(frozen=True)
class EapSettings:
    """What defines an eap-info run."""

    family: str = setting(
        "math", ("--family", "-f"), "Probe family whose prompts are answered and scored."
    )
    n: int = setting(
        5, "--n", "Samples drawn from the family (seeded, SPEC §4).", min=1, max=COUNT_MAX
    )
    seed: int = setting(
        0, "--seed", "Probe draw seed; also seeds the bootstrap.", min=0, max=SEED_MAX
    )
    use_targets: bool = setting(
        False,
        "--use-targets",
        "Score the probe targets instead of the model's verified answers "
        "(answer_source = probe_target).",
    )
    max_tokens: int = setting(
        512,
        "--max-tokens",
        "Skip (and count) samples whose prompt + answer is longer.",
        min=1,
        max=COUNT_MAX,
    )
    max_new_tokens: int = setting(
        256, "--max-new-tokens", "Greedy generation bound per answer.", min=1, max=COUNT_MAX
    )
    batch_size: int | None = setting(None, ("--batch-size", "-b"), BATCH_HELP, min=1)
    bootstrap: int = 2000

    def __post_init__(self) -> None:
        for name in ("n", "max_tokens", "max_new_tokens", "bootstrap"):
            if getattr(self, name) < 1:
                raise CdscopeError(f"--{name.replace('_', '-')} must be at least 1")
        require_batch_size(self.batch_size)


#: random-ref's bounds: far above any probe (M families, K gates) and any useful trial count
MAX_FAMILIES, MAX_GATES, MAX_TRIALS = 1_000, 100_000, 10_000_000


@dataclass(frozen=True)
class RandomRefSettings:
    """A random reference (SPEC §4): T i.i.d. Gaussian M x K matrices, K given or taken
    from a model's gates; ``value``: a measured B_shared in percent, as typed."""

    families: int = setting(
        3, ("--families", "-M"), "Number of families M (rows).", max=MAX_FAMILIES
    )
    gates: int | None = setting(
        None,
        ("--gates", "-K"),
        "Number of gates K (columns); default: K of --model.",
        max=MAX_GATES,
    )
    trials: int = setting(
        50_000, ("--trials", "-T"), "Number of random matrices T.", max=MAX_TRIALS
    )
    seed: int = setting(0, "--seed", "RNG seed.", min=0, max=SEED_MAX)
    value: float | None = setting(
        None, "--value", "A measured B_shared in percent: report its percentile."
    )
    model: str | None = setting(
        None, ("--model", "-m"), "Take K from this model (its gates at --granularity)."
    )
    granularity: str | None = setting(
        None, "--granularity", GRANULARITY_HELP[:-1] + f" [default: {SUBLAYER}]."
    )

    def __post_init__(self) -> None:
        if self.gates is not None and self.model is not None:  # -K would be silently ignored
            raise CdscopeError("give --gates K or --model (K = its gates), not both")
        if self.granularity is not None and self.model is None:
            raise CdscopeError("--granularity takes K from --model: give --model too")
