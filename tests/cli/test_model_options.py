"""Every model-loading command takes every model option (``cdscope.settings.ModelSettings``,
added to each command by ``cdscope.cli.options.with_settings``), and each option reaches
the load: before issue #30 gradcheck lacked --revision / --trust-remote-code, nsweep
passed 3 of the 8 options and inspect lacked the placement options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.models.opening import ModelOptions
from cdscope.errors import CdscopeError
from cdscope.settings import ModelSettings, option_fields

runner = CliRunner()
LOADING = ("probe", "bshared", "acg", "decompose", "nsweep", "gradcheck", "eval", "eap-info",
           "inspect")  # fmt: skip
REQUIRED = ("--revision", "--trust-remote-code", "--device-map", "--max-memory", "--offload-dir",
            "--dtype", "--device")  # fmt: skip


def test_the_group_is_every_model_setting() -> None:
    flags = [f.metadata["flag"] for f in option_fields(ModelSettings)]
    assert set(REQUIRED) <= set(flags) and "--attn" in flags
    assert len(flags) == len(dataclasses.fields(ModelSettings))


@pytest.mark.parametrize("command", LOADING)
def test_help_lists_every_model_option(command: str) -> None:
    shown = runner.invoke(app, [command, "--help"])
    assert shown.exit_code == 0, shown.output
    flags = {word.rstrip(",") for line in shown.output.splitlines() for word in line.split()[:3]}
    missing = [flag for flag in (*REQUIRED, "--attn") if flag not in flags]
    assert not missing, f"cdscope {command} --help lacks {missing}"


@pytest.mark.parametrize("command", LOADING)
def test_every_model_option_reaches_the_load(command: str, tmp_path: Path, monkeypatch) -> None:
    """The load sees the values as typed: stopped there, the one error line shows them."""

    def stop(self: ModelOptions, spec: str, console: object = None) -> None:
        raise CdscopeError(f"LOAD {spec} {self!r}")

    monkeypatch.setattr(ModelOptions, "load", stop)
    offload = tmp_path / "offload"
    out = tmp_path / ("eval" if command == "eval" else "o.parquet")
    args = [command, "--revision", "v9", "--trust-remote-code", "--dtype", "float64",
            "--attn", "eager", "--max-memory", "cpu=2GiB", "--offload-dir", str(offload)]  # fmt: skip
    if command != "inspect":  # inspect prints, it writes nothing
        args += ["-o", str(out)]
    if command in ("nsweep", "gradcheck", "bshared", "acg", "decompose", "probe"):
        args += ["--seeds", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: LOAD "), line
    for shown in ("dtype='float64'", "attn='eager'", "revision='v9'", "trust_remote_code=True",
                  "device='auto'", f"offload_dir={offload!r}", "max_memory=(('cpu',"):  # fmt: skip
        assert shown in line, (shown, line)


def test_inspect_loads_on_the_cpu_unless_a_device_map_is_given(monkeypatch) -> None:
    seen: list[ModelOptions] = []

    def stop(self: ModelOptions, spec: str, console: object = None) -> None:
        seen.append(self)
        raise CdscopeError("stop")

    monkeypatch.setattr(ModelOptions, "load", stop)
    runner.invoke(app, ["inspect"])
    runner.invoke(app, ["inspect", "--device-map", "sequential"])
    assert [(o.device, o.placement is None) for o in seen] == [("cpu", True), ("auto", False)]
    assert seen[1].placement.device_map == "sequential"


def test_changed_names_what_differs_from_the_command_defaults() -> None:
    given = ModelSettings(device="cpu", dtype="float64", attn="eager")
    assert given.changed() == {"device": "cpu", "dtype": "float64", "attn": "eager"}
    assert given.changed(ModelSettings(device="cpu", attn="eager")) == {"dtype": "float64"}
    assert not ModelSettings().places and ModelSettings(offload_dir=Path("x")).places
