"""TrainConfig is the single source of the train command's defaults and help text."""

from __future__ import annotations

import inspect
import typing

from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.cli import train as train_cli
from cdscope.commands import train as train_workflow
from cdscope.errors import CdscopeError
from cdscope.settings.training import PRESETS, TrainConfig, cli_fields


def test_every_setting_is_an_option_with_the_dataclass_default_and_help() -> None:
    command = train_cli.train_command.__wrapped__
    parameters = inspect.signature(command).parameters
    hints = typing.get_type_hints(command, include_extras=True)
    for field in cli_fields():
        assert parameters[field.name].default is None  # unset: preset or dataclass decides
        (option,) = hints[field.name].__metadata__
        # typer reads a leading "--flag" given positionally as the declaration
        assert field.metadata["flag"] in (option.default, *option.param_decls)
        shown = (
            ""
            if field.default is None or field.default is False
            else f" [default: {field.default}]"
        )
        assert option.help == field.metadata["help"] + shown
    help_text = " ".join(CliRunner().invoke(app, ["train", "--help"]).output.split())
    assert "--trust-remote-code" in help_text and "[default: 0.0]" in help_text  # --beta


def test_explicit_options_win_over_the_preset_which_wins_over_the_defaults(
    monkeypatch,
) -> None:
    seen: list[TrainConfig] = []

    def capture(cfg: TrainConfig, **kwargs):  # noqa: ANN003, ANN202
        seen.append(cfg)
        raise CdscopeError("captured")

    monkeypatch.setattr(train_workflow, "run_train", capture)
    result = CliRunner().invoke(
        app, ["train", "--preset", "cpu-smoke", "--steps", "3", "--revision", "v2"]
    )
    assert result.exit_code == 2 and "captured" in result.output
    (cfg,) = seen
    assert cfg.steps == 3 and cfg.revision == "v2"  # explicit
    assert cfg.lr == PRESETS["cpu-smoke"]["lr"] != TrainConfig().lr  # preset
    assert cfg.beta == TrainConfig().beta and cfg.template == "plain"  # dataclass defaults
    assert cfg.trust_remote_code is False and cfg.device == "auto"


def test_probe_options_default_to_probe_settings() -> None:
    from cdscope.cli import measure
    from cdscope.output.frames import ProbeSettings

    parameters = inspect.signature(measure.probe.__wrapped__).parameters
    for name in ("n", "template", "estimator", "fd_step", "fd_order"):
        assert parameters[name].default == getattr(ProbeSettings, name), name
