"""The Hugging Face hub as cdscope meets it: offline mode, reachability, the cache, and the
one-line errors of a model that cannot be found ("did you mean ...?").

A spec that is not the embedded name, a ``.gguf`` file or a local model directory is a hub
id. Before the hub libraries touch the network, :func:`hub_access` decides how they may:

- ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to 1/true/yes/on: cache only. The
  variable is read when the model is loaded, not when ``huggingface_hub`` was imported.
- otherwise one TCP connection to the endpoint (``HF_ENDPOINT``, or the ``HTTPS_PROXY``
  in front of it), bounded by ``PROBE_TIMEOUT_S`` (DNS included) and made once per
  process: when nothing answers, cache only. Without this, ``huggingface_hub`` retries a
  dead connection with back-off for about 25 s and logs a line per retry.

Cache only means ``local_files_only=True``: a cached model loads, anything else fails at
once and :func:`hub_failure` says why in one line -- the hub cache searched, offline mode
or the unreachable endpoint, and the nearest local model or the embedded name when the
spec is a near miss of one (``smollm2-135`` -> ``smollm2-135m``).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from cdscope.errors import CdscopeError
from cdscope.resources import EMBEDDED_NAME

#: seconds the reachability probe waits for DNS and a TCP connection to the endpoint
PROBE_TIMEOUT_S = 3.0
_TRUE = ("1", "true", "yes", "on")
#: local candidates read from one folder for "did you mean": enough for any real folder
_MAX_CANDIDATES = 2000


def offline_mode() -> bool:
    """``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` as set now."""
    return any(
        os.environ.get(var, "").strip().lower() in _TRUE
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_cache() -> str:
    """The hub cache the hub libraries search, as the environment names it."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache"))
    return str(Path(xdg) / "huggingface" / "hub")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


@functools.cache
def _reachable(host: str, port: int) -> bool:
    """Whether ``host:port`` accepts a TCP connection within ``PROBE_TIMEOUT_S`` (the DNS
    lookup, which has no timeout of its own, runs in a daemon thread)."""
    answered: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
            answered.append(True)
        except OSError:
            answered.append(False)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(PROBE_TIMEOUT_S)
    return bool(answered and answered[0])


def unreachable_reason() -> str | None:
    """Why the hub cannot be asked now (offline mode, or the endpoint or its proxy does not
    answer), or None when it can."""
    if offline_mode():
        return "offline mode is on (HF_HUB_OFFLINE)"
    target = urlsplit(endpoint())
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    via = urlsplit(proxy if "://" in (proxy or "") else f"http://{proxy}") if proxy else None
    host = (via or target).hostname or ""
    port = (via or target).port or (443 if (via or target).scheme == "https" else 80)
    if host and not _reachable(host, port):
        what = f"the proxy {host}:{port}" if via else target.netloc
        return f"{what} cannot be reached (no network?)"
    return None


def is_path_like(spec: str) -> bool:
    """A spec written as a path (``./x``, ``/x``, ``~/x``, ``a/b/c``), never a hub id."""
    return spec.startswith((".", "/", "~")) or (os.sep in spec and spec.count("/") != 1)


#: a hub id as the hub accepts one: ``name`` or ``org/name``, letters, digits, ``-_.``,
#: the name at most 96 characters, no ``--`` or ``..`` (huggingface_hub's validate_repo_id)
HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]{0,95}")


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` is spelled as a hub id could be (not whether the hub has it)."""
    return bool(HUB_ID.fullmatch(spec)) and "--" not in spec and ".." not in spec


def check_model_spec(spec: str) -> None:
    """Refuse, with the standard library alone (in well under a second, before torch or
    transformers load), a ``--model`` that cannot name a model: a path that does not exist
    (``./x``, ``a/b/c``, ``x.gguf``, or ``org/name`` whose ``org`` is a local folder holding
    a model of a near name), a directory without ``config.json``, a file that is not a
    ``.gguf``, a name no hub id can have, or a hub id the hub cache does not hold while
    the hub cannot be asked (offline mode, or the endpoint does not answer: the probe the
    load makes anyway, once per process). Each with the nearest local model ("did you
    mean"). A well-formed hub id on a reachable hub is left to the load: whether the hub
    has it costs a request to the hub."""
    if spec == EMBEDDED_NAME:
        from cdscope.embedded import check_available

        check_available()
        return
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CdscopeError(
                f"{path} is a directory but has no config.json: not a model directory"
                f"{models_inside(spec)}"
            )
        return
    if path.exists() and path.suffix != ".gguf":
        raise CdscopeError(
            f"{spec} is a file but not a .gguf file: pass a model directory (with config.json), "
            f"a .gguf file, a hub id or {EMBEDDED_NAME}"
        )
    if path.exists():
        return
    if path.suffix == ".gguf":
        raise CdscopeError(f"GGUF file not found: {path}{did_you_mean(spec)}")
    near = did_you_mean(spec)
    if is_path_like(spec) or (near and spec.count("/") == 1 and path.parent.is_dir()):
        raise CdscopeError(f"model path not found: {spec}{near}")
    if not is_hub_id(spec):
        raise CdscopeError(
            f"model {spec!r} is neither a local path nor a hub id (name or org/name of "
            f"letters, digits, '-', '_', '.'){near}"
        )
    if unreachable_reason() is not None and not _in_cache(spec):
        raise hub_failure(spec, FileNotFoundError(spec))


def hub_access(spec: str) -> dict:
    """Extra ``from_pretrained`` arguments for hub id ``spec`` (``check_model_spec`` has
    passed it): ``local_files_only`` when the hub cannot be asked."""
    return {"local_files_only": True} if unreachable_reason() else {}


def model_entries(folder: Path) -> list[str]:
    """Names of the local models in ``folder`` (directories with ``config.json``, ``.gguf``
    files), sorted; at most ``_MAX_CANDIDATES`` entries are looked at."""
    found = []
    try:
        for n, entry in enumerate(folder.iterdir()):
            if n >= _MAX_CANDIDATES:
                break
            if entry.suffix == ".gguf" or (entry / "config.json").is_file():
                found.append(entry.name)
    except OSError:
        pass
    return sorted(found)


def models_inside(spec: str) -> str:
    """``"; it holds the model(s) A, B"`` for a folder ``spec`` that is not itself a model
    but holds some (the first three), else ``""``."""
    names = model_entries(Path(spec).expanduser())
    if not names:
        return ""
    base = spec.rstrip("/") + "/"
    shown = ", ".join(repr(base + name) for name in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"; it holds {shown}{more}"


def did_you_mean(spec: str) -> str:
    """``"; did you mean 'X'?"`` for the local model (a directory with ``config.json`` or a
    ``.gguf`` file, in the folder ``spec`` names) or the embedded name nearest ``spec``;
    ``""`` when none is near."""
    path = Path(spec).expanduser()
    folder, name = path.parent, path.name
    written = spec.rstrip("/")
    prefix = written[: len(written) - len(name)] if written.endswith(name) else f"{folder}/"
    # comparable name -> what to write (the folder as the user wrote it)
    candidates = {entry.lower(): prefix + entry for entry in model_entries(folder)}
    if str(folder) == ".":
        candidates[EMBEDDED_NAME] = EMBEDDED_NAME
    close = difflib.get_close_matches(name.lower(), list(candidates), n=1, cutoff=0.7)
    if not close or candidates[close[0]] == spec:
        return ""
    embedded = " (the embedded default model)" if close[0] == EMBEDDED_NAME else ""
    return f"; did you mean {candidates[close[0]]!r}{embedded}?"


def local_folder(spec: str) -> str:
    """``"; runs/ is a local folder; it holds 'runs/base'"`` for an ``org/name`` spec whose
    ``org`` is a folder here (a path typed without ``./``), else ``""``."""
    parent = Path(spec).expanduser().parent
    if spec.count("/") != 1 or not parent.is_dir():
        return ""
    inside = models_inside(str(parent)) or "; it holds no model"
    return f"; {parent}/ is a local folder{inside}"


def hub_failure(spec: str, exc: BaseException) -> CdscopeError:
    """The one line for a hub id that did not load: why (cache only, offline or no
    network; or the hub's own first line), and the nearest name."""
    reason = unreachable_reason()
    hint = (
        did_you_mean(spec)
        or local_folder(spec)
        or (
            f" (pass a local directory, a .gguf file, a {'cached' if reason else 'reachable'} hub "
            f"id, or {EMBEDDED_NAME})"
        )
    )
    if reason is not None and not _in_cache(spec):
        return CdscopeError(
            f"cannot load model {spec!r}: no local directory or .gguf file of that name, and no "
            f"copy in the hub cache {hub_cache()}; {reason}{hint}"
        )
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    where = f"; {reason}, so only the hub cache {hub_cache()} was searched" if reason else ""
    return CdscopeError(f"cannot load model {spec!r}: {type(exc).__name__}: {first}{where}{hint}")


def cached_commit(spec: str, revision: str | None = None) -> str | None:
    """The commit hash of the hub-cache snapshot ``spec``'s ``config.json`` (at ``revision``,
    default ``main``) resolves to -- the files a load of hub id ``spec`` read, online or
    from the cache (transformers 5 no longer records ``config._commit_hash``); None when the
    cache has no such file."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cache = Path(hub_cache()).expanduser()
        found = try_to_load_from_cache(spec, "config.json", cache, revision or "main")
    except (ValueError, OSError):  # an id the hub would refuse, an unreadable cache
        return None
    if not isinstance(found, str):
        return None
    snapshot = Path(found).parent
    return snapshot.name if snapshot.parent.name == "snapshots" else None


def _in_cache(spec: str) -> bool:
    """Whether the hub cache holds a ``config.json`` of ``spec`` (any revision)."""
    folder = Path(hub_cache()).expanduser() / f"models--{spec.replace('/', '--')}" / "snapshots"
    try:
        return any((snapshot / "config.json").exists() for snapshot in folder.iterdir())
    except OSError:
        return False
