"""The settings of ``eval`` (SPEC §7): what decides the samples (compared on --resume)
plus how the run is executed. Its ``setting`` fields are the command's options
(``cdscope.cli.options``); ``--k`` and ``--max-new-tokens`` are typed as text and parsed
by ``parse_ks`` / ``parse_max_new_tokens`` here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from cdscope.errors import CdscopeError
from cdscope.settings.names import COUNT_MAX, SEED_MAX, setting

DEFAULT_MAX_NEW_TOKENS = {"code": 256, "math": 256, "logic": 192}
FALLBACK_MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class EvalSettings:
    """What decides the samples (compared on --resume) plus how the run is executed."""

    n: int = setting(4, "--n", "Samples per problem.", min=1, max=COUNT_MAX)
    ks: tuple[int, ...] = (1,)
    temperature: float = setting(
        0.6, "--temperature", "Sampling temperature (0 = greedy).", low=0, high=100
    )
    top_p: float = setting(1.0, "--top-p", "Nucleus sampling mass.", low=0, high=1, low_open=True)
    seed: int = setting(0, "--seed", "Run seed (per problem: seed x id).", min=0, max=SEED_MAX)
    max_new_tokens: dict[str, int] = field(default_factory=dict)  # per-domain overrides
    limit: int | None = setting(None, "--limit", "First N problems of each benchmark.", min=1)
    batch_size: int | None = setting(
        None, ("--batch-size", "-b"), "Rows per generate call [default: n].", min=1
    )
    backend: str = setting(
        "hf", "--backend", "hf (transformers) | vllm (in-process; make setup-vllm)."
    )
    timeout: float = setting(5.0, "--timeout", "Seconds per code test.", low=0.1, high=3600)
    workers: int = setting(2, "--workers", "Parallel code sandboxes.", min=1, max=256)
    vllm_args: dict[str, object] = field(default_factory=dict)  # --vllm-arg KEY=VALUE
    endpoint: str | None = setting(
        None,
        "--endpoint",
        "OpenAI-compatible API base URL (e.g. http://127.0.0.1:8000/v1): the server "
        "generates, no model is loaded here.",
    )
    served_model: str | None = setting(
        None, "--served-model", "The server's model name [default: its only model]."
    )
    api_key_env: str = setting(
        "OPENAI_API_KEY",
        "--api-key-env",
        "Environment variable holding the server's API key (sent when set).",
    )
    request_timeout: float = setting(
        600.0, "--request-timeout", "Seconds per server request.", low=0.1, high=86400
    )
    retries: int = setting(
        5, "--retries", "Retries of a server request on 429/5xx/lost connection.", min=0, max=100
    )
    concurrency: int = setting(4, "--concurrency", "Server requests in flight.", min=1, max=1024)
    n_per_request: int | None = setting(
        None, "--n-per-request", "Samples per server request [default: n].", min=1
    )

    def tokens_for(self, domain: str) -> int:
        """Explicit DOMAIN=N, else '*' (one N for all), else the per-domain default."""
        default = DEFAULT_MAX_NEW_TOKENS.get(domain, FALLBACK_MAX_NEW_TOKENS)
        return self.max_new_tokens.get(domain, self.max_new_tokens.get("*", default))

    @property
    def engine(self) -> str:
        """What generates: ``hf``, ``vllm`` or ``endpoint`` (``--endpoint`` given)."""
        return "endpoint" if self.endpoint else self.backend

    def comparable(self) -> dict:
        """The settings a resumed run must share with the file it extends (an endpoint
        run's also the split of n over requests: it decides the further requests' seeds)."""
        keep = ("n", "temperature", "top_p", "seed", "batch_size")
        split = {"n_per_request": self.n_per_request} if self.endpoint else {}
        return (
            {k: v for k, v in asdict(self).items() if k in keep}
            | {
                "backend": self.engine,
                "max_new_tokens": dict(sorted(self.max_new_tokens.items())),
            }
            | split
        )


def parse_ks(text: str) -> list[int]:
    """'1,5,10' -> [1, 5, 10] (``--k``; ``analysis.passk.check_ks`` checks them against n)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CdscopeError(
            f"--k takes comma-separated integers like 1,5,10; got {text!r}"
        ) from None
    if not values:
        raise CdscopeError(f"--k takes comma-separated integers like 1,5,10; got {text!r}")
    return values


def parse_max_new_tokens(text: str | None) -> dict[str, int]:
    """'' -> {} (per-domain defaults); '128' -> every domain; 'code=256,math=128' -> those."""
    if not text:
        return {}
    out: dict[str, int] = {}
    try:
        if "=" not in text:
            out = {"*": int(text)}
        else:
            for part in filter(None, (p.strip() for p in text.split(","))):
                domain, value = part.split("=", 1)
                out[domain.strip()] = int(value)
    except ValueError:
        raise CdscopeError(
            f"--max-new-tokens takes N or DOMAIN=N,... (e.g. 128 or code=256,logic=192); got {text!r}"
        ) from None
    if any(not 1 <= v <= COUNT_MAX for v in out.values()):
        raise CdscopeError(
            f"--max-new-tokens values must lie in [1, {COUNT_MAX:,}] (tokens per completion); "
            f"got {text!r}"
        )
    return out
