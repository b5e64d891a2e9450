"""The settings dataclasses (cdscope.settings) are the single source of every command's
option defaults, help text and bounds (TrainConfig for train), and each validates itself
once, when made."""

from __future__ import annotations

import inspect
import typing

import pytest
import typer
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.cli import train as train_cli
from cdscope.commands import train as train_workflow
from cdscope.errors import CdscopeError
from cdscope.settings import (
    AuditSettings,
    EapSettings,
    EvalSettings,
    GradcheckSettings,
    ModelSettings,
    NsweepSettings,
    ProbeSettings,
    RandomRefSettings,
    option_fields,
)
from cdscope.settings.training import PRESETS, TrainConfig, cli_fields


def test_every_setting_is_an_option_with_the_dataclass_default_and_help() -> None:
    command = train_cli.train_command.__wrapped__
    parameters = inspect.signature(command).parameters
    hints = typing.get_type_hints(command, include_extras=True)
    for field in cli_fields():
        assert parameters[field.name].default is None  # unset: preset or dataclass decides
        (option,) = hints[field.name].__metadata__
        # typer reads a leading "--flag" given positionally as the declaration
        flag = field.metadata["flag"]
        flags = {flag} if isinstance(flag, str) else set(flag)
        assert flags <= {option.default, *option.param_decls}, flags
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


SETTINGS = (ProbeSettings, AuditSettings, NsweepSettings, GradcheckSettings, EapSettings,
            EvalSettings, RandomRefSettings, ModelSettings, TrainConfig)  # fmt: skip
#: commands whose options come from one settings class, with the defaults they override
FROM_SETTINGS = [
    ("probe", ProbeSettings, {}),
    ("gradcheck", GradcheckSettings, {}),
    ("eap-info", EapSettings, {}),
    ("eval", EvalSettings, {}),
    ("random-ref", RandomRefSettings, {}),
    ("nsweep", NsweepSettings, {}),
    ("bshared", AuditSettings, {"seeds": None}),  # unset: the --from file may decide
    ("inspect", ModelSettings, {"device": "cpu"}),
    ("gradcheck", ModelSettings, {"attn": "eager"}),
    ("eval", ModelSettings, {}),
]


def test_every_setting_field_is_a_well_formed_option() -> None:
    for cls in SETTINGS:
        fields = option_fields(cls)
        assert fields, cls.__name__
        for field in fields:
            flag = field.metadata["flag"]
            flags = (flag,) if isinstance(flag, str) else flag
            assert flags[0].startswith("--") and field.metadata["help"].strip(), field.name
            assert set(field.metadata["bounds"]) <= {"min", "max", "low", "high", "low_open"}


@pytest.mark.parametrize(("command", "cls", "overrides"), FROM_SETTINGS)
def test_command_options_show_their_settings_help_and_default(command, cls, overrides) -> None:
    """The option a command shows for a settings field has that field's help and default
    (the dataclass is the one place both are written)."""
    params = {p.name: p for p in typer.main.get_command(app).commands[command].params}
    for field in option_fields(cls):
        param = params[field.name]
        assert param.help.startswith(field.metadata["help"].rstrip(".")), (command, field.name)
        assert param.default == overrides.get(field.name, field.default), (command, field.name)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: AuditSettings(bootstrap=-1), "--bootstrap must be 0"),
        (lambda: AuditSettings(detect=0.0), "--detect is a positive"),
        (lambda: NsweepSettings(ns=(0, 2)), "--ns values must be at least 1; got '0,2'"),
        (lambda: NsweepSettings.parse(7, "1,x"), "--ns takes comma-separated integers"),
        (lambda: GradcheckSettings(eps=(float("nan"),)), "--eps values must be finite"),
        (lambda: GradcheckSettings(seeds=(2**32 - 1, 2**32)), "--first-seed \\+ --seeds"),
        (lambda: GradcheckSettings(granularity="edge"), "gradcheck --granularity must be one of"),
        (lambda: RandomRefSettings(gates=4, model="m"), "not both"),
        (lambda: RandomRefSettings(granularity="head"), "give --model too"),
        (lambda: ProbeSettings((0,), estimator="fd", granularity="edge"), "only the autograd"),
        (lambda: ProbeSettings((0,), granularity="layer"), "--granularity must be one of"),
        (lambda: EapSettings(batch_size=0), "--batch-size must be at least 1"),
    ],
)
def test_settings_refuse_bad_values_when_made(make, message: str) -> None:
    with pytest.raises(CdscopeError, match=message):
        make()


def test_nsweep_sizes_parse_sorted_and_distinct() -> None:
    assert NsweepSettings.parse(3, "6, 2,2,1").ns == (1, 2, 6)
    assert NsweepSettings().ns == (1, 2, 3, 6, 12, 24)
