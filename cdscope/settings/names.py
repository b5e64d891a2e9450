"""The names and bounds every command's settings share, and ``setting``: a dataclass field
that is also a command-line option (its default, flag, help and bounds stated here once;
``cdscope.cli.options`` builds the Typer option from them).

No torch, no numpy: the CLI declares its options from this module, so ``--help`` starts
light (tests/cli/test_startup.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from cdscope.errors import CdscopeError, option

#: RNG seeds fit the 32-bit words numpy's SeedSequence and torch.manual_seed take.
SEED_MAX = 2**32 - 1
#: counts (--seeds, --n, ...): far above any real run, far below overflow or allocation.
COUNT_MAX = 1_000_000

#: one residual write (a block's attention, MLP, MoE or mixer output): the name of the
#: coarsest gate set (one gate per write) and of the probe frame's column that holds each
#: gate's write role
SUBLAYER = "sublayer"
#: one edge of the EAP graph (SPEC §6): the finest --granularity of the probe commands
EDGE = "edge"
#: the gate sets ``GatedModel`` builds (docs/granularity.md): one gate per residual write,
#: per attention head, per routed / shared MoE expert, per MLP neuron
GATE_GRANULARITIES = (SUBLAYER, "head", "expert", "neuron")
#: every --granularity of the probe commands: the gate sets above, and one gate per edge of
#: the EAP graph (``cdscope.core.edge_control``, not a GatedModel gate set)
GRANULARITIES = (*GATE_GRANULARITIES, EDGE)
GRANULARITY_HELP = (
    f"Gates: {SUBLAYER} (one per write) | head (per attention head) | expert (per MoE "
    "expert) | neuron (per MLP neuron, heads for attention) | edge (per edge of the eap-info "
    "graph)."
)
#: estimators of C (SPEC §2): one backward, or 2K gated forwards (the slow check)
C_ESTIMATORS = ("autograd", "fd")
#: estimators of the regulariser gradient (``cdscope.core.regularizer.proxy_grad``; SPEC §5)
GRADIENT_ESTIMATORS = ("exact", "proxy", "richardson", "folded")
#: the default first-order estimator and its gate step, chosen from the measured fidelity
#: table (docs/gradcheck.md)
DEFAULT_ESTIMATOR = "folded"
DEFAULT_EPS = 0.01
#: the halves of a probe pool (``cdscope.core.probes.split_pool``, docs/probes.md): the
#: training probe is drawn from ``train``, in-training audits from ``audit``; ``all`` is the
#: whole pool (what every command drew from before the split existed)
PROBE_SPLITS = ("train", "audit", "all")
PROBE_SPLIT_HELP = (
    "Half of the probe pool to draw from: train | audit | all (a fixed split by item id, "
    "docs/probes.md)."
)
#: prompt templates of the probe and the tasks (``cdscope.core.batch.format_prompt``)
TEMPLATES = ("plain", "chat")
TEMPLATE_HELP = f"Prompt template: {' | '.join(TEMPLATES)}."

#: What ``--dtype auto`` means, stated once. Measuring (probe, the audits, eval,
#: eap-info, inspect, gradcheck) loads bf16 on CUDA and fp32 elsewhere
#: (``core.models.loading.resolve_dtype``; log-softmax always runs in fp32); training loads
#: ``TRAIN_AUTO_DTYPE`` on every device, because bf16 loses AdamW's small updates and the
#: regulariser's gate steps (docs/train.md).
MEASURE_AUTO_DTYPE_HELP = "auto (fp32 on CPU, bf16 on CUDA 8.0+; docs/precision.md)"
TRAIN_AUTO_DTYPE = "float32"
TRAIN_AUTO_DTYPE_HELP = (
    "auto (float32 on every device: bf16 loses AdamW updates and the regulariser's gate steps)"
)
DTYPE_CHOICES_HELP = "float32 | bfloat16 | float16 | float64"
SEEDS_HELP = "Number of probe seeds S (seeds 0..S-1)."
BATCH_HELP = (
    "Rows per forward (memory bound); default: 1 on CPU (no padding), the whole probe on GPU."
)


def setting(
    default: Any,
    flag: str | tuple[str, ...],
    help: str,  # noqa: A002 - the option's help, as Typer calls it
    **bounds: Any,
) -> Any:
    """A dataclass field that is also an option: ``flag`` (or flags, long first), ``help``
    and ``bounds`` (``min`` / ``max`` for integers; ``low`` / ``high`` / ``low_open`` for a
    finite float) are read by ``cdscope.cli.options`` from ``dataclasses.fields``."""
    return dataclasses.field(
        default=default, metadata={"flag": flag, "help": help, "bounds": bounds}
    )


def option_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of settings class ``cls`` that are options (made with ``setting``)."""
    return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]


def require_one_of(name: str, value: object, choices: Sequence[str], sep: str = ", ") -> None:
    """One-line error unless input ``name`` (a field name: ``errors.option`` spells it for
    the command line or Python) is one of ``choices``."""
    if value not in choices:
        raise CdscopeError(f"{option(name)} must be one of {sep.join(choices)}; got {value!r}")


def require_batch_size(batch_size: int | None) -> None:
    """``--batch-size``: unset (the device decides) or at least 1."""
    if batch_size is not None and batch_size < 1:
        raise CdscopeError(f"{option('batch_size')} must be at least 1, got {batch_size}")
