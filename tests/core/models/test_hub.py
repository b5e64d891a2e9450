"""Hub and ecosystem conventions: --revision / --trust-remote-code threading, the commit
hash in the metadata, offline mode, the device/dtype choice for MPS, --quiet/--verbose,
--json on the table-printing commands."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.models import hub, loading
from cdscope.core.models.loading import load_model, resolve_device, resolve_dtype
from cdscope.errors import CdscopeError
from tests.helpers import byte_tokenizer, tiny_model

ROOT = Path(__file__).resolve().parents[3]


def _mps(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)


def test_mps_is_chosen_only_when_asked_and_available(monkeypatch) -> None:
    _mps(monkeypatch, True)
    assert resolve_device("mps") == torch.device("mps")
    assert resolve_device("auto").type in ("cpu", "cuda")  # never picked silently
    assert resolve_dtype("auto", torch.device("mps")) == torch.float32
    assert resolve_dtype("float16", torch.device("mps")) == torch.float16
    with pytest.raises(CdscopeError, match="float64 is not supported on MPS"):
        resolve_dtype("float64", torch.device("mps"))
    _mps(monkeypatch, False)
    with pytest.raises(CdscopeError, match="no usable MPS backend"):
        resolve_device("mps")
    with pytest.raises(CdscopeError, match="auto, cpu, cuda\\[:N\\] or mps"):
        resolve_device("tpu")


def test_revision_and_remote_code_reach_from_pretrained(monkeypatch) -> None:
    """A hub id: both from_pretrained calls get revision and trust_remote_code; the
    commit hash the hub resolved is what LoadedModel (and every output) records."""
    import transformers

    calls: list[tuple[str, dict]] = []
    model = tiny_model("llama")
    model.config._commit_hash = "0123abcd" * 5
    monkeypatch.setattr(hub, "unreachable_reason", lambda: None)  # a hub that answers

    def fake_model(spec, **kwargs):  # noqa: ANN001, ANN202
        calls.append(("model", kwargs))
        return model

    def fake_tokenizer(spec, **kwargs):  # noqa: ANN001, ANN202
        calls.append(("tokenizer", kwargs))
        return byte_tokenizer()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)
    loaded = load_model("org/model", "cpu", revision="v1.0", trust_remote_code=True)
    assert loaded.revision == "0123abcd" * 5
    for _, kwargs in calls:
        assert kwargs["revision"] == "v1.0" and kwargs["trust_remote_code"] is True
    calls.clear()
    load_model("org/model", "cpu")
    assert all("revision" not in kw and "trust_remote_code" not in kw for _, kw in calls)


def test_revision_is_refused_for_local_models(tiny_model_dir) -> None:
    with pytest.raises(CdscopeError, match="--revision applies to hub ids"):
        load_model(str(tiny_model_dir), "cpu", revision="main")
    result = CliRunner().invoke(
        app, ["probe", "-m", str(tiny_model_dir), "--revision", "main", "-o", "x.parquet"]
    )
    assert result.exit_code == 2 and "--revision applies to hub ids" in result.output


def test_offline_mode_and_cache_are_honoured(tmp_path) -> None:
    """HF_HUB_OFFLINE with an empty HF_HOME: no network attempt, one line naming both."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}
    code = (
        "from cdscope.core.models.loading import load_model\n"
        "try:\n    load_model('nobody-xyz/no-model', 'cpu')\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    ).stdout
    assert out.startswith("CdscopeError cannot load model 'nobody-xyz/no-model'"), out
    assert "offline mode is on (HF_HUB_OFFLINE)" in out and str(tmp_path / "hf") in out
    assert "\n" not in out.strip()


def test_quiet_verbose_and_json(tiny_model_dir, pool_file, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(loading, "_mps_available", lambda: False)
    out = tmp_path / "p.parquet"
    args = ["probe", "-m", str(tiny_model_dir), "-p", str(pool_file), "--n", "2", "-o", str(out)]
    quiet = CliRunner().invoke(app, ["--quiet", *args, "--json"])
    assert quiet.exit_code == 0, quiet.output
    assert "wrote" not in quiet.stderr and "probing" not in quiet.stderr
    payload = json.loads(quiet.stdout)
    (row,) = payload["per_seed"]
    assert payload["command"] == "probe" and row["model"] == str(tiny_model_dir)
    assert 1 / 3 <= row["B_shared_C"] <= 1 and set(row["ell"]) == {"code", "logic", "math"}
    failed = CliRunner().invoke(app, ["--quiet", "probe", "-m", str(tiny_model_dir),
                                      "--device", "mps", "-o", str(out)])  # fmt: skip
    assert failed.exit_code == 2 and "no usable MPS backend" in failed.stderr
    both = CliRunner().invoke(app, ["--quiet", "--verbose", *args])
    assert both.exit_code == 2 and "exclude each other" in both.stderr
    audit = CliRunner().invoke(app, ["eval", "--audit", "--json", "-o", str(tmp_path / "e")])
    assert audit.exit_code == 0, audit.output
    rows = json.loads(audit.stdout)["contamination"]
    assert {r["against"] for r in rows} == {"train", "probes"} and all(
        r["exact"] == 0 for r in rows
    )


# -- offline-aware loading (cdscope.core.models.hub) --------------------------------------


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The hub endpoint does not answer; the probes made are recorded."""
    asked: list[tuple[str, int]] = []

    def unreachable(host: str, port: int) -> bool:
        asked.append((host, port))
        return False

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    monkeypatch.setattr(hub, "_reachable", unreachable)
    return asked


def test_a_typo_of_the_embedded_name_fails_at_once_with_did_you_mean(
    no_network, monkeypatch, tmp_path
) -> None:
    """No network: the hub libraries read the cache only (no retries) and the one line
    names the reason and the embedded name the user meant."""
    import transformers

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    seen: list[dict] = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(spec, **kwargs):  # noqa: ANN001, ANN202
        seen.append(kwargs)
        return real(spec, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    with pytest.raises(CdscopeError) as caught:
        load_model("smollm2-135", "cpu")
    message = str(caught.value)
    assert seen == []  # refused before transformers is asked (hub.check_model_spec)
    assert set(no_network) == {("huggingface.co", 443)}
    assert message == (
        "cannot load model 'smollm2-135': no local directory or .gguf file of that name, and "
        f"no copy in the hub cache {tmp_path / 'hub'}; huggingface.co cannot be reached (no "
        "network?); did you mean 'smollm2-135m' (the embedded default model)?"
    )


def test_near_misses_of_local_models_are_suggested_as_written(tiny_model_dir, tmp_path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("cdrft-final", "grpo-final"):
        shutil.copytree(tiny_model_dir, runs / name)
    (runs / "notes").mkdir()  # no config.json: never suggested
    (runs / "base.gguf").write_bytes(b"GGUF")
    assert hub.did_you_mean(f"{runs}/cdrft-fianl") == f"; did you mean '{runs}/cdrft-final'?"
    assert hub.did_you_mean(f"{runs}/bse.gguf") == f"; did you mean '{runs}/base.gguf'?"
    assert hub.did_you_mean(f"{runs}/note") == ""
    assert hub.did_you_mean(f"{runs}/something-else") == ""
    with pytest.raises(CdscopeError, match="model path not found: .*; did you mean .*grpo-final"):
        load_model(f"{runs}/grpo-fnal/", "cpu")
    with pytest.raises(CdscopeError, match=r"no config.json: .*; it holds '.*/runs/cdrft-final'"):
        load_model(str(runs), "cpu")


def test_relative_specs_keep_their_spelling(tiny_model_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "runs" / "ckpt-100")
    assert hub.did_you_mean("./runs/ckpt-10") == "; did you mean './runs/ckpt-100'?"
    assert hub.did_you_mean("runs/ckpt-1000") == "; did you mean 'runs/ckpt-100'?"
    assert hub.did_you_mean("SmolLM2-135M").startswith("; did you mean 'smollm2-135m'")
    assert hub.did_you_mean("smollm2-135m") == ""  # the name itself is no near miss


def test_a_cached_hub_model_loads_without_network(tiny_model_dir, tmp_path) -> None:
    """The user path offline: a model in the hub cache (as huggingface_hub lays it out)
    loads by its id with HF_HUB_OFFLINE set, and with no network at all (an endpoint
    that refuses connections), in a fresh process that reads the variables at import."""
    cache = tmp_path / "hub"
    commit = "0" * 40
    snapshot = cache / "models--org--tiny" / "snapshots" / commit
    shutil.copytree(tiny_model_dir, snapshot)
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text(commit)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    code = (
        "import time\nfrom cdscope.core.models.loading import load_model\n"
        "t = time.perf_counter()\nm = load_model('org/tiny', 'cpu')\n"
        "print(m.revision, m.model.config.model_type, round(time.perf_counter() - t, 1))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    base |= {"HF_HUB_CACHE": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for extra in ({"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": f"http://127.0.0.1:{port}"}):
        run = subprocess.run(
            [sys.executable, "-c", code], env=base | extra, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        revision, model_type, seconds = run.stdout.split()
        assert (revision, model_type) == (commit, "llama")
        assert "Retrying" not in run.stderr


def test_the_reachability_probe_answers_both_ways() -> None:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    port = listening.getsockname()[1]
    try:
        assert hub._reachable("127.0.0.1", port) is True
    finally:
        listening.close()
    hub._reachable.cache_clear()
    assert hub._reachable("127.0.0.1", port) is False  # closed now: refused at once
    hub._reachable.cache_clear()


def test_offline_variables_are_read_when_loading(monkeypatch) -> None:
    for value, expected in (("1", True), ("TRUE", True), ("on", True), ("0", False), ("", False)):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert hub.offline_mode() is expected
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.unreachable_reason() == "offline mode is on (HF_HUB_OFFLINE)"
    assert hub.hub_access("org/model") == {"local_files_only": True}
    with pytest.raises(CdscopeError, match="model path not found: ./missing"):
        hub.check_model_spec("./missing")


def test_the_cli_says_one_line_and_no_hub_noise_for_a_typo(no_network, pool_file, tmp_path) -> None:
    out = tmp_path / "results" / "p.parquet"
    result = CliRunner().invoke(app, ["probe", "-m", "smollm2-135", "-p", str(pool_file),
                                      "-o", str(out)])  # fmt: skip
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot load model 'smollm2-135'")
    assert lines[0].endswith("did you mean 'smollm2-135m' (the embedded default model)?")
