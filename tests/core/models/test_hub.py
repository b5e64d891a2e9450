"""Hub and ecosystem conventions: --revision / --trust-remote-code threading, the commit
hash in the metadata, offline mode, the device/dtype choice for MPS, --quiet/--verbose,
--json on the table-printing commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.models import loading
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
