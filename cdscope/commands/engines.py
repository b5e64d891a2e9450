"""The generation engine of one ``eval`` run (``cdscope.core.engines``): checked before
anything is locked or loaded, opened per model, and described in the run metadata.

- ``--backend hf`` (default): the model loaded with the model options, sampled by
  ``transformers.generate``.
- ``--backend vllm``: vLLM's ``LLM`` in this process on the model's source (a directory,
  a hub id, or the embedded model's standard checkpoint), in the dtype ``--dtype``
  resolves to; cdscope does not load the model itself. ``--vllm-arg KEY=VALUE`` reaches
  ``LLM(...)``.
- ``--endpoint URL``: a running OpenAI-compatible server; its model is the one it serves
  (``--served-model``), and the server decides device, dtype and kernels, so the model
  options are refused.

Every model record has the keys ``--resume`` compares (``output.resume``): revision,
dtype, device. For a served model they are its stated identity (``endpoint.identity``:
served name and reported origin), ``server`` and ``endpoint``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cdscope.commands.requests import EvalRequest
from cdscope.core.engines import Engine
from cdscope.core.models.opening import ModelOptions
from cdscope.errors import CdscopeError
from cdscope.settings import EvalSettings

#: rows (problems x n) per vLLM call when --batch-size is not given
VLLM_ROWS_PER_CALL = 256
#: the model options --endpoint refuses (the server decides them), as flags
MODEL_FLAGS = {"device": "--device", "dtype": "--dtype", "attn": "--attn",
               "placement": "--device-map/--max-memory/--offload-dir", "revision": "--revision",
               "trust_remote_code": "--trust-remote-code"}  # fmt: skip


def given_model_options(options: ModelOptions) -> list[str]:
    """The flags of the model options that differ from their defaults."""
    default = ModelOptions()
    return [
        flag
        for name, flag in MODEL_FLAGS.items()
        if getattr(options, name) != getattr(default, name)
    ]


def check_engine(settings: EvalSettings, options: ModelOptions, model_given: bool) -> None:
    """One line for a combination of engine options that cannot run, before any work."""
    from cdscope.settings.names import require_one_of

    require_one_of("--backend", settings.backend, ("hf", "vllm"))
    if settings.endpoint:
        from cdscope.core.engines.endpoint import check_url

        check_url(settings.endpoint)
        if settings.backend != "hf":
            raise CdscopeError("--endpoint: the server generates; drop --backend")
        if model_given:
            raise CdscopeError(
                "--endpoint evaluates the model the server serves: name it with --served-model, "
                "not --model"
            )
        given = given_model_options(options)
        if given:
            raise CdscopeError(f"--endpoint: the server decides {', '.join(given)}; drop it")
        if settings.vllm_args:
            raise CdscopeError("--vllm-arg applies to --backend vllm, not to --endpoint")
        return
    only = [f for f, v in (("--served-model", settings.served_model),
                           ("--n-per-request", settings.n_per_request)) if v is not None]  # fmt: skip
    if only:
        raise CdscopeError(f"{only[0]} applies to --endpoint URL only")
    if settings.backend == "vllm":
        from cdscope.core.engines.vllm import require_vllm

        require_vllm()
        if options.placement is not None or options.attn != "auto":
            raise CdscopeError(
                "--backend vllm places the model and picks its kernels itself: drop "
                "--device-map/--max-memory/--offload-dir/--attn (use --vllm-arg, e.g. "
                "tensor_parallel_size=2)"
            )
    elif settings.vllm_args:
        raise CdscopeError("--vllm-arg applies to --backend vllm only")


@dataclass
class Server:
    """A connected ``--endpoint``: the client and the ``/models`` entry of its model."""

    client: object
    entry: dict

    @property
    def name(self) -> str:
        return str(self.entry["id"])

    def identity(self) -> dict[str, str]:
        """What ``--resume`` compares for the served model (module doc)."""
        from cdscope.core.engines.endpoint import identity

        return {"revision": identity(self.entry), "dtype": "server", "device": "endpoint"}

    def record(self) -> dict:
        return {"name": self.name, "source": self.client.url, **self.identity(),  # type: ignore[attr-defined]
                "architecture": None, "attn": None, "experts": None}  # fmt: skip


def connect(settings: EvalSettings) -> Server:
    """The server of ``--endpoint`` and its model; one line when unreachable or unknown."""
    from cdscope.core.engines.endpoint import Client, served_model

    client = Client(
        settings.endpoint or "",
        api_key=os.environ.get(settings.api_key_env) or None,
        timeout=settings.request_timeout,
        retries=settings.retries,
    )
    return Server(client, served_model(client, settings.served_model))


def identity_for(server: Server | None) -> Callable[[str], dict] | None:
    """``--resume``'s model identity for this run's engine (None: a local model's)."""
    if server is None:
        return None
    return lambda _spec: server.identity()


def open_engine(
    spec: str, request: EvalRequest, server: Server | None, console: object
) -> tuple[Engine, dict]:
    """The engine that generates for ``spec`` and the model's record for the metadata."""
    settings = request.settings
    if server is not None:
        from cdscope.core.engines.endpoint import EndpointEngine

        engine: Engine = EndpointEngine(
            server.client, server.entry, settings.temperature, settings.top_p,  # type: ignore[arg-type]
            settings.concurrency, settings.n_per_request,
        )  # fmt: skip
        return engine, server.record() | {"engine": engine.describe()}
    if settings.backend == "vllm":
        return _vllm(spec, request, console)
    from cdscope.commands.workflow import model_record
    from cdscope.core.engines.hf import HFEngine

    loaded = request.options.load(spec, console)
    engine = HFEngine(
        loaded.model, loaded.tokenizer, settings.temperature, settings.top_p, settings.batch_size
    )
    return engine, model_record(loaded) | {"engine": engine.describe()}


def _vllm(spec: str, request: EvalRequest, console: object) -> tuple[Engine, dict]:
    """vLLM on ``spec``'s source, with the identity a loaded model's record would have."""
    from cdscope.core.engines.vllm import VLLMEngine
    from cdscope.output.resume import model_identity

    options, settings = request.options, request.settings
    from cdscope.core.models.loading import model_source

    source, _ = model_source(spec, console, options.revision, options.trust_remote_code)
    if Path(source).suffix == ".gguf":
        raise CdscopeError(
            f"--backend vllm loads model directories and hub ids, not {spec!r}; convert it "
            "or use --backend hf"
        )
    ident = model_identity(spec, options)
    args = dict(settings.vllm_args)
    if options.revision and "revision" not in args:
        args["revision"] = options.revision
    if options.trust_remote_code:
        args.setdefault("trust_remote_code", True)
    per_call = max(1, (settings.batch_size or VLLM_ROWS_PER_CALL) // settings.n)
    engine = VLLMEngine(
        source, ident["dtype"], settings.temperature, settings.top_p, settings.seed, per_call, args
    )
    record = {"name": spec, "source": source, **ident, "architecture": _model_type(source),
              "attn": None, "experts": None, "engine": engine.describe()}  # fmt: skip
    return engine, record


def _model_type(source: str) -> str | None:
    """``model_type`` from a local directory's config.json (None for a hub id)."""
    import json

    config = Path(source) / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None
