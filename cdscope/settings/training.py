"""Training configuration: the SPEC §5 reference recipe as defaults, plus named presets.

Reference hyperparameters (SPEC §5, 7B recipe): AdamW lr 2e-6 with a cosine schedule,
G = 4 samples per prompt, 8 prompts per step, 512 new tokens, temperature 0.6, seed 0,
KL coefficient beta = 0; CD-RFT lambda = 1, tau = 70 (%), K_max = 12,
eta_proj = 4e-3, n = 3 probe samples per family; the gradient estimator and its gate
step come from ``cdscope.settings.names`` (``DEFAULT_ESTIMATOR``, ``DEFAULT_EPS``), as
does what ``--dtype auto`` means for training (``TRAIN_AUTO_DTYPE``).

Choices the SPEC leaves open (documented in docs/train.md): 200 steps, no warmup, no
weight decay, the clipped-surrogate epsilon 0.2, gradient-norm clipping off, the probe
drawn from the training seed.

Presets replace the defaults of the fields they name; options the user sets explicitly
win over the preset (``TrainConfig.with_preset``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from cdscope.errors import CdscopeError
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings.names import (
    COUNT_MAX,
    DEFAULT_EPS,
    DEFAULT_ESTIMATOR,
    DTYPE_CHOICES_HELP,
    GATE_GRANULARITIES,
    GRADIENT_ESTIMATORS,
    PROBE_SPLITS,
    SEED_MAX,
    SUBLAYER,
    TEMPLATE_HELP,
    TRAIN_AUTO_DTYPE_HELP,
    option_fields,
    setting,
)

REGULARIZERS = ("none", "cdrft")
#: the GRPO loss's normaliser (train/grpo.py ``token_weights``; TRL's ``loss_type``)
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
#: what divides r_i - mean_group(r) (train/grpo.py ``advantages``; TRL's ``scale_rewards``)
SCALE_REWARDS = ("group", "batch", "none")
BACKENDS = ("hf", "trl")
REPORT_TO = ("none", "tensorboard", "trackio", "wandb")  # train/tracking.py
SHARDINGS = ("none", "fsdp")  # train/engine.py


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of one training run (both arms share all but ``regularizer``).

    Fields made with ``setting`` are the ``cdscope train`` options, in this order.
    """

    model: str = setting(EMBEDDED_NAME, ("--model", "-m"), "Model to train.")
    revision: str | None = setting(
        None, "--revision", "Hub branch, tag or commit of --model (recorded in the log)."
    )
    trust_remote_code: bool = setting(
        False, "--trust-remote-code", "Allow the model repository to run its own code."
    )
    out_dir: str = "runs/train"
    steps: int = setting(200, "--steps", "Optimizer steps (total, also for --resume).")
    prompts_per_step: int = setting(8, "--prompts-per-step", "Prompts per step.")
    group_size: int = setting(4, "--group-size", "Samples G per prompt.")
    max_new_tokens: int = setting(512, "--max-new-tokens", "Rollout length cap.")
    temperature: float = setting(0.6, "--temperature", "Rollout temperature.")
    top_p: float = 1.0
    lr: float = setting(2e-6, "--lr", "AdamW peak learning rate (cosine decay).")
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float | None = None
    clip_eps: float = setting(
        0.2,
        "--epsilon",
        "Clipped surrogate: the ratio is clipped to [1 - epsilon, 1 + epsilon-high].",
    )
    epsilon_high: float | None = setting(
        None, "--epsilon-high", "Upper clip bound (DAPO's clip-higher); default --epsilon."
    )
    beta: float = setting(0.0, "--beta", "k3 KL coefficient vs the initial model.")
    loss_type: str = setting(
        "dapo",
        "--loss-type",
        "GRPO loss normaliser: dapo (token mean over the step) | grpo (mean over completions "
        "of each one's token mean) | dr_grpo (token sum / (completions x --max-new-tokens)) | "
        "bnpo (token mean over the local batch: the step, in the hf loop).",
    )
    scale_rewards: str = setting(
        "group",
        "--scale-rewards",
        "Advantage scale: group (std within each group) | batch (std over the step) | none "
        "(Dr. GRPO: rewards minus the group mean only).",
    )
    num_iterations: int = setting(
        1,
        "--num-iterations",
        "Policy updates per generation batch (TRL's mu; above 1 only with --backend trl).",
    )
    mask_truncated_completions: bool = setting(
        False,
        "--mask-truncated-completions",
        "Leave completions cut at --max-new-tokens (no EOS) out of the loss and its normaliser.",
    )
    log_completions: bool = setting(
        False,
        "--log-completions",
        "Keep every rollout (task, completion, reward, advantage) in OUT/completions.parquet "
        "(with --backend trl, TRL's own completion log as well).",
    )
    regularizer: str = setting("cdrft", "--regularizer", "none (GRPO) | cdrft (GRPO + CD-RFT).")
    lam: float = setting(1.0, "--lambda", "Regulariser weight lambda.")
    tau: float = setting(  # percent, like every human-facing B_shared
        70.0, "--tau", "Projection threshold on B_shared, percent, between 100/M and 100."
    )
    k_max: int = setting(12, "--k-max", "Max projection iterations per step.")
    eta_proj: float = setting(4e-3, "--eta-proj", "Projection step size.")
    proj_max_norm: float | None = setting(
        None,
        "--proj-max-norm",
        "Cap on ||grad R|| in each projection step (theta moves at most eta_proj times it); "
        "off: SPEC's plain step, which a spike of grad R can turn into a policy-breaking "
        "jump (docs/train.md).",
    )
    eps: float = setting(DEFAULT_EPS, "--eps", "Gate step of the proxy gradient.")
    estimator: str = setting(
        DEFAULT_ESTIMATOR,
        "--estimator",
        f"Regulariser gradient: {' | '.join(GRADIENT_ESTIMATORS)}.",
    )
    granularity: str = setting(
        SUBLAYER,
        "--granularity",
        f"Gates whose C the regulariser shapes: {' | '.join(GATE_GRANULARITIES)}.",
    )
    probe_n: int = setting(3, "--probe-n", "Probe samples per family.")
    probe_files: tuple[str, ...] = ()
    probe_split: str = setting(
        "train",
        "--probe-split",
        "Half of the probe pool the training probe is drawn from: train | audit | all "
        "(a fixed split by item id; audits draw from the audit half; docs/probes.md).",
    )
    probe_max_tokens: int | None = setting(
        None,
        "--probe-max-tokens",
        "Cap on each probe item's prompt + target tokens: longer items are cut from the "
        "left of the prompt (C is then that of the shortened context; docs/train.md).",
    )
    template: str = setting("plain", "--template", TEMPLATE_HELP)
    seed: int = setting(0, "--seed", "Seed of data order, rollouts and probe.")
    save_every: int = setting(50, "--save-every", "Checkpoint every N steps.")
    tasks: tuple[str, ...] = ()
    micro_batch_size: int = setting(  # completions per backbone forward/backward
        8, "--micro-batch-size", "Completions per backbone forward (memory)."
    )
    rollout_batch_size: int | None = None  # rows per generate call (None: all)
    plain_step: bool = setting(
        False,
        "--plain-step",
        "The slow twin of the GRPO step: every row forwarded and backpropagated on its own, "
        "each prompt prefilled G times (same gradient; for tests and benchmarks).",
    )
    probe_batch_size: int | None = None  # probe rows per forward (None: 1 on CPU, all on GPU)
    verify_timeout: float = 5.0
    verify_workers: int = 2
    device: str = setting("auto", "--device", "auto | cpu | cuda[:N] | mps.")
    dtype: str = setting("auto", "--dtype", f"{TRAIN_AUTO_DTYPE_HELP} | {DTYPE_CHOICES_HELP}.")
    attn: str = "auto"
    backend: str = setting("hf", "--backend", "hf (built-in loop) | trl (GRPOTrainer).")
    sharding: str = setting(
        "none",
        "--sharding",
        "none | fsdp (hf loop under torchrun: FSDP2 per decoder block + root; the TRL route "
        "shards through accelerate's FSDP2 plugin instead; docs/distributed.md).",
    )
    activation_checkpointing: bool = setting(
        False,
        "--activation-checkpointing",
        "Recompute each decoder block's activations in the backward (non-reentrant; both "
        "backends): less memory, about one more forward per backward.",
    )
    report_to: str = setting(
        "none",
        "--report-to",
        f"Experiment tracker of the per-step log: {' | '.join(REPORT_TO)} (with --backend trl, "
        "TRL's own report_to; docs/train.md).",
    )
    eval_every: int | None = setting(
        None,
        "--eval-every",
        "pass@k on held-out tasks at step 0, every N steps and the last -> OUT/eval.parquet.",
    )
    eval_tasks: tuple[str, ...] = ()  # --eval-tasks (default: the held-out split, evidence.py)
    eval_n: int = setting(4, "--eval-n", "Samples per held-out problem (--eval-every).")
    eval_k: tuple[int, ...] = (1,)  # --eval-k 1,2,4
    eval_limit: int | None = setting(
        None, "--eval-limit", "First N problems of each held-out benchmark (--eval-every)."
    )
    eval_max_new_tokens: int | None = setting(
        None, "--eval-max-new-tokens", "Held-out generation cap (default: --max-new-tokens)."
    )
    audit_every: int | None = setting(
        None,
        "--audit-every",
        "B_shared, B_dir, B_norm on the audit probe (no item shared with the training probe) "
        "at step 0, every N steps and the last -> OUT/audit.parquet.",
    )
    audit_probe: tuple[str, ...] = ()  # --audit-probe (default: the audit half of the pool)
    audit_seeds: int = setting(3, "--audit-seeds", "Probe seeds of each audit (--audit-every).")
    audit_n: int = setting(3, "--audit-n", "Audit probe samples per family (--audit-every).")
    preset: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        clean = {k: v for k, v in values.items() if k in names}
        for key in ("tasks", "probe_files", "eval_tasks", "eval_k", "audit_probe"):
            if key in clean:
                clean[key] = tuple(clean[key])
        return cls(**clean)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def with_preset(self, name: str | None, explicit: dict[str, Any] | None = None) -> TrainConfig:
        """Apply preset ``name`` and then the ``explicit`` user settings on top."""
        changes: dict[str, Any] = {}
        if name is not None:
            if name not in PRESETS:
                raise CdscopeError(f"--preset must be one of {', '.join(PRESETS)}; got {name!r}")
            changes.update(PRESETS[name])
            changes["preset"] = name
        changes.update(explicit or {})
        return self.replace(**changes)

    @property
    def num_completions(self) -> int:
        return self.prompts_per_step * self.group_size

    def validate(self, num_probe_families: int | None = None) -> None:
        """One-line ``CdscopeError`` for any impossible setting (SPEC §5 ranges)."""
        for item in dataclasses.fields(self):  # NaN / inf slip through every comparison below
            value = getattr(self, item.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise CdscopeError(f"{flag_of(item)} must be a finite number; got {value}")
        if not 0 <= self.seed <= SEED_MAX:
            raise CdscopeError(f"--seed must lie in [0, {SEED_MAX}]; got {self.seed}")
        for name in (
            "steps", "prompts_per_step", "group_size", "max_new_tokens", "probe_n",
            "micro_batch_size", "eval_n", "audit_seeds", "audit_n",
        ):  # fmt: skip
            if getattr(self, name) > COUNT_MAX:
                raise CdscopeError(f"--{name.replace('_', '-')} must be at most {COUNT_MAX:,}")
        positive = {
            "--steps": self.steps,
            "--prompts-per-step": self.prompts_per_step,
            "--group-size": self.group_size,
            "--max-new-tokens": self.max_new_tokens,
            "--probe-n": self.probe_n,
            "--save-every": self.save_every,
            "--micro-batch-size": self.micro_batch_size,
            "--eval-n": self.eval_n,
            "--audit-seeds": self.audit_seeds,
            "--audit-n": self.audit_n,
        }
        for flag, value in positive.items():
            if value < 1:
                raise CdscopeError(f"{flag} must be a positive integer; got {value}")
        if self.group_size < 2:
            raise CdscopeError(
                f"--group-size must be at least 2 (group-normalised advantages need a group); "
                f"got {self.group_size}"
            )
        for flag, value in (("--lr", self.lr), ("--eta-proj", self.eta_proj), ("--eps", self.eps)):
            if not value > 0:
                raise CdscopeError(f"{flag} must be positive; got {value}")
        if self.proj_max_norm is not None and not 0 < self.proj_max_norm < math.inf:
            raise CdscopeError(
                f"--proj-max-norm must be a positive finite number; got {self.proj_max_norm}"
            )
        for flag, value in (("--beta", self.beta), ("--lambda", self.lam)):
            if not value >= 0:
                raise CdscopeError(f"{flag} must be non-negative; got {value}")
        if self.k_max < 0:
            raise CdscopeError(f"--k-max must be non-negative; got {self.k_max}")
        if not self.temperature >= 0:
            raise CdscopeError(f"--temperature must be >= 0; got {self.temperature}")
        if self.regularizer not in REGULARIZERS:
            raise CdscopeError(
                f"--regularizer must be one of {', '.join(REGULARIZERS)}; got {self.regularizer!r}"
            )
        if self.backend not in BACKENDS:
            raise CdscopeError(
                f"--backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}"
            )
        if self.sharding not in SHARDINGS:
            raise CdscopeError(
                f"--sharding must be one of {' | '.join(SHARDINGS)}; got {self.sharding!r}"
            )
        if self.sharding != "none" and self.backend == "trl":
            raise CdscopeError(
                "--sharding is the hf loop's; with --backend trl shard through accelerate's "
                "FSDP2 plugin: accelerate launch --config_file docs/accelerate/fsdp2.yaml"
            )
        if self.report_to not in REPORT_TO:
            raise CdscopeError(
                f"--report-to must be one of {' | '.join(REPORT_TO)}; got {self.report_to!r}"
            )
        if self.probe_split not in PROBE_SPLITS:
            raise CdscopeError(
                f"--probe-split must be one of {' | '.join(PROBE_SPLITS)}; got {self.probe_split!r}"
            )
        self._validate_evidence()
        self._validate_grpo()
        if self.estimator not in GRADIENT_ESTIMATORS:
            raise CdscopeError(
                f"--estimator must be one of {', '.join(GRADIENT_ESTIMATORS)}; got {self.estimator!r}"
            )
        if self.granularity not in GATE_GRANULARITIES:
            raise CdscopeError(
                f"--granularity must be one of {', '.join(GATE_GRANULARITIES)}; "
                f"got {self.granularity!r}"
            )
        if num_probe_families is not None:
            low = 100.0 / num_probe_families
            if not low <= self.tau <= 100.0:
                raise CdscopeError(
                    f"--tau is a B_shared threshold in percent and must lie in [100/M, 100] = "
                    f"[{low:.4g}, 100] for M = {num_probe_families} probe families; got {self.tau:g}"
                )

    def _validate_grpo(self) -> None:
        """The GRPO loss options (TRL's names): known choices, clip bounds that keep the
        clipped ratio positive, and what the hf loop does not implement refused by name."""
        if self.loss_type not in LOSS_TYPES:
            raise CdscopeError(
                f"--loss-type must be one of {' | '.join(LOSS_TYPES)}; got {self.loss_type!r}"
            )
        if self.scale_rewards not in SCALE_REWARDS:
            raise CdscopeError(
                f"--scale-rewards must be one of {' | '.join(SCALE_REWARDS)}; "
                f"got {self.scale_rewards!r}"
            )
        if not 0 < self.clip_eps < 1:
            raise CdscopeError(f"--epsilon must lie in (0, 1); got {self.clip_eps:g}")
        if self.epsilon_high is not None and not self.epsilon_high > 0:
            raise CdscopeError(f"--epsilon-high must be positive; got {self.epsilon_high:g}")
        if not 1 <= self.num_iterations <= COUNT_MAX:
            raise CdscopeError(
                f"--num-iterations must be a positive integer; got {self.num_iterations}"
            )
        if self.num_iterations > 1 and self.backend != "trl":
            raise CdscopeError(
                "--num-iterations above 1 reuses each generation batch for several updates, "
                "which the hf loop does not do; use --backend trl, or 1"
            )

    @property
    def clip_bounds(self) -> tuple[float, float]:
        """The clipped ratio's interval [1 - epsilon, 1 + epsilon_high]."""
        high = self.clip_eps if self.epsilon_high is None else self.epsilon_high
        return 1.0 - self.clip_eps, 1.0 + high

    def _validate_evidence(self) -> None:
        """--eval-every / --audit-every: a step count in [1, --steps]; the other evidence
        settings positive; --probe-max-tokens at least 2 (one prompt and one target token)."""
        for flag, every in (("--eval-every", self.eval_every), ("--audit-every", self.audit_every)):
            if every is not None and not 1 <= every <= self.steps:
                raise CdscopeError(
                    f"{flag} is a number of steps between 1 and --steps ({self.steps}); got {every}"
                )
        for flag, value in (
            ("--eval-limit", self.eval_limit),
            ("--eval-max-new-tokens", self.eval_max_new_tokens),
        ):
            if value is not None and not 1 <= value <= COUNT_MAX:
                raise CdscopeError(f"{flag} must be a positive integer; got {value}")
        if self.probe_max_tokens is not None and not 2 <= self.probe_max_tokens <= COUNT_MAX:
            raise CdscopeError(
                f"--probe-max-tokens must be at least 2 (a prompt and a target token); "
                f"got {self.probe_max_tokens}"
            )
        if not self.eval_k or min(self.eval_k) < 1:
            raise CdscopeError(f"--eval-k takes k values >= 1; got {list(self.eval_k)}")
        if max(self.eval_k) > self.eval_n:
            raise CdscopeError(
                f"pass@{max(self.eval_k)} needs at least {max(self.eval_k)} samples per problem "
                f"but --eval-n is {self.eval_n}: raise --eval-n or drop k={max(self.eval_k)}"
            )


def flag_of(item: dataclasses.Field) -> str:
    """How the user spells field ``item``: its (first) option, or ``--name-with-dashes``."""
    flag = item.metadata.get("flag")
    if flag is None:
        return "--" + item.name.replace("_", "-")
    return flag if isinstance(flag, str) else flag[0]


def cli_fields() -> list[dataclasses.Field]:
    """The fields that are ``cdscope train`` options (made with ``setting``), in order."""
    return option_fields(TrainConfig)


#: Named presets. ``cpu-smoke``: the embedded 135M model on a shared 2-core CPU
#: (measured: one 135M forward of 3 x 223 tokens takes ~5 s there) — 2 steps of 2 prompts
#: x 4 samples, 32 new tokens, a 1-per-family probe, the 2-point proxy (3 probe forwards
#: instead of Richardson's 5) and at most 1 projection iteration, a checkpoint every step,
#: lr 1e-5 so two steps visibly move the weights.
PRESETS: dict[str, dict[str, Any]] = {
    "reference": {},
    "cpu-smoke": {
        "model": EMBEDDED_NAME,
        "steps": 2,
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 32,
        "probe_n": 1,
        "estimator": "proxy",
        "k_max": 1,
        "save_every": 1,
        "lr": 1e-5,
        "micro_batch_size": 8,
    },
}
