"""Running under a torch.distributed launcher (torchrun, accelerate launch, srun + torchrun).

cdscope schedules nothing itself: the launcher starts one process per rank and sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. This module
reads that environment, joins the process group (gloo on CPU, nccl on CUDA; with a
timeout, ``$CDSCOPE_DIST_TIMEOUT_S``, default 3600 s, so a lost rank cannot hang the
others forever) and offers the three collectives the data-parallel audit needs:

- ``share(items)``: this rank's round-robin share ``items[rank::world_size]``;
- ``gather_status(status)``: every rank's status object, on every rank, so a failure on
  one rank is known to all after the same round and all exit with the same line;
- ``from_main(value)``: rank 0's value on every rank (rank 0 alone reads ``--resume``
  state, so the output folder need only exist where rank 0 runs).

The training step's rank decisions use the joined group directly (``joined_world_size``,
``int_from_rank_zero``, ``tensors_from_rank_zero``: tensor broadcasts, no pickling).

Only rank 0 writes files and talks; the other ranks end their command with
``WorkerDone`` once their share is gathered (the CLI turns it into a silent exit 0).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from cdscope.errors import CdscopeError

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 3600.0


class WorkerDone(Exception):  # noqa: N818 - a signal, not an error
    """Raised on ranks > 0 after their share of the work is gathered to rank 0."""


@dataclass(frozen=True)
class Launch:
    """Where this process stands in a launch: ``world_size`` 1 when not launched."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise CdscopeError(
            f"${name} must be an integer (set by the launcher); got {raw!r}"
        ) from None


def launch_env() -> Launch:
    """The launch this process belongs to, from the launcher's environment variables."""
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise CdscopeError(f"inconsistent launcher environment: RANK={rank}, WORLD_SIZE={world}")
    return Launch(rank, world, _env_int("LOCAL_RANK", rank))


def is_main_process() -> bool:
    """True on rank 0 and in any process not started by a launcher."""
    return os.environ.get("RANK", "0") in ("", "0")


def timeout_s() -> float:
    raw = os.environ.get("CDSCOPE_DIST_TIMEOUT_S", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise CdscopeError(f"$CDSCOPE_DIST_TIMEOUT_S must be seconds; got {raw!r}") from None
    if value <= 0:
        raise CdscopeError(f"$CDSCOPE_DIST_TIMEOUT_S must be positive; got {raw!r}")
    return value


@contextmanager
def process_group(launch: Launch, device_type: str) -> Iterator[None]:
    """Inside: the launcher's process group, joined (and destroyed on exit if made here).

    Backend: nccl when the rank computes on CUDA (its device is ``cuda:LOCAL_RANK``), else
    gloo. A group that already exists (e.g. made by accelerate) is used as it is.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise CdscopeError(
            f"WORLD_SIZE={launch.world_size} but ${', $'.join(missing)} is unset: "
            "start the run with torchrun or accelerate launch"
        )
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(launch.local_rank)
    dist.init_process_group(
        backend,
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=timedelta(seconds=timeout_s()),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def quiesce_group() -> None:
    """Call on every rank at the same point, right before leaving ``process_group``, when
    the run held objects that keep the group alive (DDP's reducer): the barrier lets every
    collective finish, then the garbage goes while the group still lives.

    The last reference to a gloo group must not go while one of its worker threads still
    finishes a collective: the destructor joins the workers holding the GIL, a worker
    freeing the collective's Python tensors waits for the GIL, and the rank hangs for good
    (2 runs in 18 of a 2-rank TRL step, when DDP's reducer was freed after the group was
    destroyed; 0 in 24 with this). Not in ``process_group`` itself: there a rank that
    leaves early (an error, or a command whose other ranks stop first) would leave the
    others waiting in the barrier.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    release_garbage()


def release_garbage() -> None:
    """Free unreachable objects now (a DDP reducer, a finished collective's buffers) with
    the GIL released for a moment first, so a collective worker thread can drop the Python
    tensors it holds before their owners go."""
    import gc

    time.sleep(0.05)
    gc.collect()


def share(items: Sequence[T], launch: Launch) -> list[T]:
    """This rank's round-robin share: items ``rank, rank + W, rank + 2W, ...``."""
    return list(items[launch.rank :: launch.world_size])


def gather_status(status: object, launch: Launch) -> list[object]:
    """Every rank's ``status`` (picklable), in rank order, on every rank."""
    import torch.distributed as dist

    statuses: list[object] = [None] * launch.world_size
    dist.all_gather_object(statuses, status)
    return statuses


def from_main(value: T, launch: Launch) -> T:
    """Rank 0's ``value`` (picklable) on every rank."""
    import torch.distributed as dist

    box = [value if launch.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def joined_world_size() -> int:
    """The world size of the process group this process has joined (1 when none: a
    launcher's env alone is not a group; ``launch_env`` reads the env)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def int_from_rank_zero(value: int) -> int:
    """Rank 0's ``value`` on every rank of the joined group (one tensor broadcast, on the
    GPU under nccl; called by every rank), without pickling: the training step's way."""
    import torch
    import torch.distributed as dist

    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    )
    box = torch.tensor([value], dtype=torch.long, device=device)
    dist.broadcast(box, src=0)
    return int(box.item())


def tensors_from_rank_zero(tensors: list) -> None:
    """Overwrite ``tensors`` (same shapes on every rank) with rank 0's values, in place;
    nothing outside a group of more than one process."""
    import torch.distributed as dist

    if joined_world_size() > 1:
        for tensor in tensors:
            dist.broadcast(tensor, src=0)


def exit_on_own_terms() -> None:
    """On rank 0, once a failure shared by every rank is known: ignore the launcher's
    SIGTERM from here on. torchrun stops all workers as soon as one exits; the other ranks
    exit right after the shared failure, and rank 0 would be cut off before it has written
    the finished work and printed its one line. It exits by itself within moments (the
    launcher sends SIGKILL after its grace period anyway). A no-op off the main thread."""
    import signal

    with contextlib.suppress(ValueError):  # signal handlers belong to the main thread
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def rank_device(device: str) -> str:
    """``--device`` for this rank: under a launcher, ``auto`` / ``cuda`` on a CUDA machine
    mean the rank's own GPU, ``cuda:LOCAL_RANK`` (one process per GPU, as torchrun starts them)."""
    import torch

    launch = launch_env()
    if launch.active and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{launch.local_rank % torch.cuda.device_count()}"
    return device


def single_process_only(command: str) -> None:
    """Refuse to run ``command`` under a launcher: it does not split its work across ranks,
    so every rank would repeat all of it and race to write the same files."""
    launch = launch_env()
    if launch.active:
        raise CdscopeError(
            f"{command} runs in one process but was launched with WORLD_SIZE={launch.world_size}; "
            "run it without torchrun/accelerate launch (data-parallel: probe, bshared, acg, "
            "decompose; distributed training: train --backend trl)"
        )


def is_sharded(module: object) -> bool:
    """True when ``module`` is managed by torch's FSDP2 (``fully_shard``, also what
    accelerate's FSDP2 plugin applies): its parameters are DTensor shards, all-gathered only
    inside its own forward, and gradients reach them only through ``backward`` (FSDP's
    reduce-scatter), never through ``torch.autograd.grad``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(module, FSDPModule)


def fsdp_modules(module: object) -> list:
    """Every FSDP2-managed module under ``module`` (itself included), outermost first."""
    from torch import nn

    return [m for m in module.modules() if is_sharded(m)] if isinstance(module, nn.Module) else []


@contextmanager
def held_unsharded(module: object, after: str = "backward") -> Iterator[None]:
    """Inside: FSDP2 keeps the parameters all-gathered ``after`` a ``"backward"`` (a double
    backward runs through the first backward's graph, which holds the unsharded parameters:
    resharding in between frees them under it) or a ``"forward"`` (generation: one
    all-gather for all its forwards, at the unsharded model's memory); on exit every group
    is resharded. No-op unsharded."""
    groups = fsdp_modules(module)
    for m in groups:
        getattr(m, f"set_reshard_after_{after}")(False, recurse=False)
    try:
        yield
    finally:
        for m in groups:
            getattr(m, f"set_reshard_after_{after}")(True, recurse=False)
            m.reshard()
