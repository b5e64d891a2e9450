"""Property-based fuzzing of the CLI (hypothesis): random bad values for every numeric
option and random corruptions of probe, task and Parquet files.

Property: the exit code is 0, 1 or 2, there is no traceback, and no partial file (an
output of a refused run, or a hidden temporary file) is left. Runs that would start
real work point --model at a missing path, so every example ends within milliseconds
of option parsing and file validation; the whole module stays well under 60 s.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdscope import io as cio
from cdscope.cli import app
from cdscope.output.frames import FRAME_COLUMNS
from tests.helpers import write_foreign_parquet, write_pool

runner = CliRunner()
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: a model that passes the early checks (a folder with config.json: cli.common.check_inputs)
#: and fails only when loaded, so every option is validated before that one-line failure
UNLOADABLE = "unloadable-model"

#: numbers as a user might type them: huge, negative, fractional, NaN/inf, not numbers
NUMBER = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        [
            "nan",
            "-nan",
            "inf",
            "-inf",
            "1e23",
            "1e400",
            "-0",
            "",
            " ",
            "0x10",
            "1_000",
            "3.",
            ".5",
            "1e-400",
            "NaN",
            "infinity",
            "2**40",
            "١٢",
        ]
    ),  # fmt: skip
)


def fresh(root: Path) -> Path:
    """A new folder per example (hypothesis reuses the function's tmp_path)."""
    return Path(tempfile.mkdtemp(dir=root, prefix="ex-"))


def clean(result, outputs: list[Path], root: Path) -> None:
    """The fuzz property: a known exit code, no traceback, nothing half-written."""
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert not [p for p in outputs if p.exists()], result.output
    assert not [p.name for p in root.rglob(".*") if p.name.endswith(".tmp") or p.is_dir()]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-inputs")
    pool = write_pool(root / "pool.jsonl", {"math": 4, "code": 4, "logic": 4})
    tasks = root / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"math/t/{s}/{i}",
                    "family": "math",
                    "prompt": f"{i}+1=",
                    "verifier": "math",
                    "answer": str(i + 1),
                }
            )
            + "\n"
            for s in ("eval", "train")
            for i in range(3)
        )  # fmt: skip
    )
    rows = [
        dict(model="m", seed=s, family=f, gate=g, layer=g // 2, sublayer=("attn", "mlp")[g % 2],
             C=float(np.sin(7 * s + 3 * g + len(f))), F=1.0 + g, dl_dg=-1.0 - g, ell=-2.0,
             dropped=False)
        for s in range(2) for f in ("code", "logic", "math") for g in range(4)
    ]  # fmt: skip
    probe = cio.write_parquet(
        pd.DataFrame(rows, columns=FRAME_COLUMNS),
        root / "x.probe.parquet",
        {
            "settings": {"n": 3, "template": "plain", "estimator": "autograd"},
            "models": [{"name": "m", "K": 4}],
            "probe_hash": "sha256:x",
        },  # fmt: skip
    )
    model = root / UNLOADABLE
    model.mkdir()
    (model / "config.json").write_text("{}")  # no model_type: transformers refuses it at load
    return {"pool": pool, "tasks": tasks, "probe": probe, "model": model}


def _commands(files: dict[str, Path]) -> dict[str, tuple[list[str], list[str]]]:
    """command -> (base arguments that fail fast after validation, numeric options)."""
    pool, tasks, probe = (str(files[k]) for k in ("pool", "tasks", "probe"))
    model = ["-m", str(files["model"])]
    return {
        "probe": (["probe", *model, "-p", pool], ["--seeds", "--n", "--fd-step", "--fd-order",
                                                  "--batch-size"]),
        "bshared": (["bshared", "--from", probe], ["--fail-above", "--n"]),
        "bshared-measure": (["bshared", *model, "-p", pool], ["--seeds", "--n", "--batch-size"]),
        "acg": (["acg", *model, "-p", pool], ["--seeds", "--n", "--batch-size"]),
        "gradcheck": (["gradcheck", *model, "-p", pool], ["--seeds", "--n", "--first-seed",
                                                          "--eps", "--batch-size"]),
        "random-ref": (["random-ref", "-M", "3", "-K", "4", "-T", "2"],
                       ["-M", "-K", "--seed", "--value"]),
        "eap-info": (["eap-info", *model, "-p", pool], ["--n", "--seed", "--max-tokens",
                                                        "--max-new-tokens", "--batch-size"]),
        "eval": (["eval", *model, "--tasks", tasks], ["--n", "--temperature", "--top-p",
                                                      "--seed", "--limit", "--batch-size",
                                                      "--timeout", "--workers",
                                                      "--max-new-tokens", "--k"]),
        "train": (["train", "--model", str(files["model"]), "--tasks", tasks, "--probe", pool],
                  ["--steps", "--prompts-per-step", "--group-size", "--max-new-tokens",
                   "--temperature", "--lr", "--beta", "--lambda", "--tau", "--k-max",
                   "--eta-proj", "--eps", "--probe-n", "--seed", "--save-every",
                   "--micro-batch-size"]),
    }  # fmt: skip


@FUZZ
@given(data=st.data())
def test_every_numeric_option_takes_any_value_without_a_traceback(files, tmp_path, data) -> None:
    commands = _commands(files)
    name = data.draw(st.sampled_from(sorted(commands)))
    base, options = commands[name]
    option = data.draw(st.sampled_from(options))
    value = data.draw(NUMBER)
    out = fresh(tmp_path)
    outputs = [out / "o.parquet", out / "o.summary.parquet", out / "o.probe.parquet"]
    target = ["--out-dir", str(out)] if name == "train" else ["-o", str(outputs[0])]
    if name == "eval":
        target = ["-o", str(out)]
        outputs = [out / "samples.parquet", out / "passk.parquet"]
    if name == "random-ref" and option in ("-M", "-K"):
        base = [a for a in base if a not in (option, {"-M": "3", "-K": "4"}[option])]
    result = runner.invoke(app, [*base, option, value, *target])
    clean(result, outputs, tmp_path)


@FUZZ
@given(
    value=st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str), NUMBER),
    option=st.sampled_from(["-T", "-M", "-K", "--seed"]),
)
def test_random_ref_bounds(tmp_path, value: str, option: str) -> None:
    """random-ref does real work on valid values: they are capped so it stays fast."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if math.isfinite(number) and 200 < number <= 10_000_000 and option == "-T":
        value = "201"  # valid but slow trial counts: the bound is what is under test
    args = {"-T": "2", "-M": "3", "-K": "4", "--seed": "0"} | {option: value}
    out = fresh(tmp_path) / "r.parquet"
    result = runner.invoke(
        app, ["random-ref", *[x for kv in args.items() for x in kv], "-o", str(out)]
    )
    clean(result, [out], tmp_path)


def _mutate_text(data: st.DataObject, text: str) -> str:
    kind = data.draw(st.sampled_from(["truncate", "bytes", "line", "field"]))
    if kind == "truncate":
        return text[: data.draw(st.integers(0, len(text)))]
    if kind == "bytes":
        noise = data.draw(st.text(min_size=1, max_size=20))
        at = data.draw(st.integers(0, len(text)))
        return text[:at] + noise + text[at:]
    lines = text.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    if kind == "line":
        lines[i] = data.draw(st.sampled_from(["", "{}", "[]", "null", "{", '"x"', "1"]))
        return "\n".join(lines) + "\n"
    record = json.loads(lines[i])
    key = data.draw(st.sampled_from(sorted(record)))
    record[key] = data.draw(st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=5),
                                      st.lists(st.integers(), max_size=2)))  # fmt: skip
    lines[i] = json.dumps(record)
    return "\n".join(lines) + "\n"


@FUZZ
@given(data=st.data())
def test_corrupted_probe_and_task_files(files, tmp_path, data) -> None:
    which = data.draw(st.sampled_from(["pool", "tasks"]))
    out = fresh(tmp_path)
    bad = out / "bad.jsonl"
    bad.write_text(_mutate_text(data, files[which].read_text()), encoding="utf-8")
    if which == "pool":
        args = ["bshared", "-m", str(files["model"]), "-p", str(bad), "-o", str(out / "b.parquet")]
        outputs = [out / "b.parquet", out / "b.summary.parquet", out / "b.probe.parquet"]
    else:
        args = ["eval", "--audit", "--tasks", str(bad), "--audit-train", str(files["tasks"]),
                "--audit-probe", str(files["pool"]), "-o", str(out)]  # fmt: skip
        outputs = [out / "contamination.parquet"]
    clean(runner.invoke(app, args), outputs, tmp_path)


@FUZZ
@given(data=st.data())
def test_corrupted_parquet_files(files, tmp_path, data) -> None:
    source = fresh(tmp_path) / "c.probe.parquet"
    kind = data.draw(st.sampled_from(["bytes", "truncate", "value", "metadata", "column"]))
    raw = files["probe"].read_bytes()
    if kind == "bytes":
        at = data.draw(st.integers(0, len(raw) - 1))
        source.write_bytes(raw[:at] + data.draw(st.binary(min_size=1, max_size=16)) + raw[at + 1 :])
    elif kind == "truncate":
        source.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
    else:
        frame, meta = cio.read_parquet(files["probe"])
        if kind == "value":
            column = data.draw(
                st.sampled_from(["C", "F", "ell", "dl_dg", "seed", "gate", "dropped"])
            )
            row = data.draw(st.integers(0, len(frame) - 1))
            value = data.draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                        st.text(max_size=4), st.none(), st.integers(-5, 5)))  # fmt: skip
            frame[column] = frame[column].astype(object)
            frame.at[row, column] = value
            try:
                cio.write_parquet(frame, source, meta)
            except Exception:  # noqa: BLE001 - pyarrow refuses this mix of types itself
                return
        elif kind == "column":
            frame = frame.drop(columns=[data.draw(st.sampled_from(FRAME_COLUMNS))])
            cio.write_parquet(frame, source, meta)
        else:
            table = pq.read_table(files["probe"])
            junk = data.draw(st.one_of(st.binary(max_size=30),
                                       st.sampled_from([b"[]", b"null", b'{"settings": []}',
                                                        b'{"models": 3, "settings": {}}'])))  # fmt: skip
            pq.write_table(table.replace_schema_metadata({b"cdscope": junk}), source)
    command = data.draw(st.sampled_from(["bshared", "acg", "decompose"]))
    out = source.parent / "out.parquet"
    result = runner.invoke(app, [command, "--from", str(source), "-o", str(out)])
    clean(result, [out, out.with_name(out.stem + ".summary.parquet")], tmp_path)


# -- usage errors: one line with the value as typed (issue #26) ------------------------------
USAGE_CASES = [
    (["probe", "--seeds", "0"], "--seeds '0'"),
    (["probe", "--seeds", "abc"], "--seeds 'abc'"),
    (["probe", "--seeds=abc"], "--seeds 'abc'"),
    (["probe", "-s0"], "--seeds '0'"),
    (["probe", "--seeds", "99999999999999999999"], "--seeds '99999999999999999999'"),
    (["probe", "--n", "-1"], "--n '-1'"),
    (["probe", "--n", "1.5"], "--n '1.5'"),
    (["probe", "--fd-step", "nan"], "--fd-step 'nan'"),
    (["probe", "--batch-size", "0"], "--batch-size '0'"),
    (["probe", "--bogus"], "--bogus"),
    (["probe", "-m"], "-m"),
    (["probe", "stray"], "stray"),
    (["bogus"], "'bogus'"),
    (["--bogus"], "--bogus"),
    (["bshared", "-s", "x"], "--seeds 'x'"),
    (["bshared", "--fail-above", "101"], "--fail-above '101'"),
    (["bshared", "--detect", "0"], "--detect '0'"),
    (["bshared", "--bootstrap", "-1"], "--bootstrap '-1'"),
    (["random-ref", "-M", "abc"], "--families 'abc'"),
    (["random-ref", "--value", "ten"], "--value 'ten'"),
    (["eval", "--top-p", "2"], "--top-p '2'"),
    (["eval", "--workers", "0"], "--workers '0'"),
    (["eap-info", "--n", "0"], "--n '0'"),
    (["gradcheck", "--first-seed", "-1"], "--first-seed '-1'"),
    (["nsweep", "--seeds", "0"], "--seeds '0'"),
    (["eap-info", "--max-new-tokens", "99999999999999999999"], "--max-new-tokens"),
]


@pytest.mark.parametrize(("args", "shown"), USAGE_CASES, ids=[" ".join(a) for a, _ in USAGE_CASES])
def test_click_rejections_are_one_error_line_with_the_value(tmp_path, args, shown) -> None:
    """Every value Click/Typer rejects: exit 2 and one ``error:`` line that shows the value
    as typed and where help is (today: a four-line usage block without the value)."""
    out = ["-o", str(tmp_path / "o.parquet")]
    result = runner.invoke(app, args if args[0].startswith("-") else [args[0], *out, *args[1:]])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert shown in lines[0] and "--help" in lines[0], lines[0]
    assert not list(tmp_path.iterdir())


MODEL_OPTIONS = {
    "--device": ["quantum", "cpu", "cuda:7"], "--dtype": ["float64", "bogus"],
    "--attn": ["eager"], "--device-map": ["auto"], "--max-memory": ["0=1GiB"],
    "--offload-dir": ["off"], "--revision": ["main"], "--trust-remote-code": [None],
}  # fmt: skip


@FUZZ
@given(data=st.data())
def test_from_refuses_every_model_option(files, tmp_path, data) -> None:
    """--from reads earlier measurements: any model option beside it is refused by name
    with its value (today --dtype and even --device quantum are silently ignored)."""
    chosen = data.draw(st.lists(st.sampled_from(sorted(MODEL_OPTIONS)), min_size=1, max_size=3,
                                unique=True))  # fmt: skip
    extra = []
    for option in chosen:
        value = data.draw(st.sampled_from(MODEL_OPTIONS[option]))
        extra += [option] if value is None else [option, value]
    command = data.draw(st.sampled_from(["bshared", "acg", "decompose"]))
    out = fresh(tmp_path) / "o.parquet"
    result = runner.invoke(app, [command, "--from", str(files["probe"]), *extra, "-o", str(out)])
    clean(result, [out], tmp_path)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert "does not apply to --from" in line and chosen[0] in line, line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["random-ref", "-M", "3", "-K", "4", "--value", "10"], "between 1/M = 33.33"),
        (["random-ref", "-M", "4", "-K", "4", "--value", "20"], "between 1/M = 25"),
        (["eval", "--max-new-tokens", "99999999999999999999"], "--max-new-tokens values"),
        (["eval", "--max-new-tokens", "math=10000000"], "--max-new-tokens values"),
        (["nsweep", "--from", "PROBE", "--dtype", "float64"], "--dtype float64 does not apply"),
    ],
)
def test_absurd_option_values_are_refused(files, tmp_path, args, message) -> None:
    args = [str(files["probe"]) if a == "PROBE" else a for a in args]
    if args[0] == "eval":
        args += ["--tasks", str(files["tasks"]), "-m", str(files["model"])]
    result = runner.invoke(app, [*args, "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert result.output.strip().count("\n") == 0


def test_random_ref_value_at_the_bound_as_printed_is_accepted(tmp_path) -> None:
    """33.3 (1/3 as the tables print it) is a real measurement, not below 1/M."""
    out = tmp_path / "r.parquet"
    result = runner.invoke(app, ["random-ref", "-M", "3", "-K", "4", "-T", "5", "--value", "33.3",
                                 "-o", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output


# -- crafted probe files: one line each (issue #26) ------------------------------------------
def _with_samples(files: dict[str, Path], root: Path) -> tuple[pd.DataFrame, dict]:
    """The fuzz probe file with per-sample columns (n = 2 per family), consistent with C."""
    frame, meta = cio.read_parquet(files["probe"])
    frame["logp_samples"] = [[-2.0, -2.0]] * len(frame)
    frame["dlogp_samples"] = [[2 * c, 2 * c] for c in frame["C"]]
    frame["F_samples"] = [[f, f] for f in frame["F"]]
    return frame, meta


CRAFTED = {
    "NaN in dlogp_samples": (lambda f: f.assign(dlogp_samples=[[np.nan, 1.0]] + list(f["dlogp_samples"][1:])),
                             "dlogp_samples of family"),
    "wrong per-sample length": (lambda f: f.assign(F_samples=[[1.0, 2.0, 3.0]] + list(f["F_samples"][1:])),
                                "differ in length"),
    "C stored as strings": (lambda f: f.assign(C=f["C"].astype(str)), "column 'C' holds"),
    "finite C = 1e200": (lambda f: f.assign(C=1e200), "absurdly large"),
    "per-sample strings": (lambda f: f.assign(logp_samples=[["a", "b"]] * len(f)), "not a list of numbers"),
    "F = -inf": (lambda f: f.assign(F=f["F"].where(f.index != 3, -np.inf)), "F of family"),
    # found by the fuzz below on a fresh machine: l_m = 0 reached eigh as NaN (LinAlgError)
    "logp samples averaging to 0": (lambda f: f.assign(logp_samples=[[0.0, 0.0]] * len(f)),
                                    "cannot normalise C"),
    # found by the fuzz below (one flipped bit of 'dropped'): the kept rows' C matrix had a
    # NaN hole where the dropped gate was, and the spectral measure raised ValueError
    "a positive log-probability": (lambda f: f.assign(logp_samples=[[0.0, 1.0]] + list(f["logp_samples"][1:])),
                                   "positive entry"),
    "one gate's own logp samples": (lambda f: f.assign(logp_samples=[[-3.0, -1.0]] + list(f["logp_samples"][1:])),
                                    "differ between its gates"),
    "one gate of a family dropped": (lambda f: f.assign(dropped=[True] + [False] * (len(f) - 1)),
                                     "dropped on some gates and kept on others"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CRAFTED))
@pytest.mark.parametrize("command", ["bshared", "nsweep"])
def test_crafted_from_files_are_one_line(files, tmp_path, case, command) -> None:
    """Files cdscope could not have written end in one line naming the value (today:
    LinAlgError, ValueError and TypeError tracebacks)."""
    change, message = CRAFTED[case]
    frame, meta = _with_samples(files, tmp_path)
    source = write_foreign_parquet(change(frame), tmp_path / "c.probe.parquet", meta)
    out = tmp_path / "o.parquet"
    extra = ["--ns", "1,2"] if command == "nsweep" else []
    result = runner.invoke(app, [command, "--from", str(source), *extra, "-o", str(out)])
    clean(result, [out, out.with_name("o.summary.parquet")], tmp_path)
    assert result.exit_code == 2 and message in result.output, result.output
    assert result.output.strip().count("\n") == 0


def test_the_sound_crafted_baseline_is_accepted(files, tmp_path) -> None:
    """The unmodified per-sample file of the crafted cases is read (the cases above fail for
    their one change, not for the fixture)."""
    frame, meta = _with_samples(files, tmp_path)
    source = cio.write_parquet(frame, tmp_path / "c.probe.parquet", meta)
    out = tmp_path / "o.parquet"
    result = runner.invoke(app, ["bshared", "--from", str(source), "--bootstrap", "0",
                                 "-o", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output


@FUZZ
@given(data=st.data())
def test_corrupted_per_sample_columns(files, tmp_path, data) -> None:
    """Random values in random per-sample cells: exit 0 or one line, never a traceback."""
    frame, meta = _with_samples(files, tmp_path)
    column = data.draw(st.sampled_from(["logp_samples", "dlogp_samples", "F_samples"]))
    row = data.draw(st.integers(0, len(frame) - 1))
    cell = data.draw(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                        st.integers(-(2**40), 2**40)), min_size=0, max_size=4))  # fmt: skip
    frame[column] = frame[column].astype(object)
    frame.at[row, column] = [float(x) for x in cell]
    source = cio.write_parquet(frame, fresh(tmp_path) / "c.probe.parquet", meta)
    out = source.parent / "o.parquet"
    result = runner.invoke(app, ["bshared", "--from", str(source), "--bootstrap", "5",
                                 "-o", str(out)])  # fmt: skip
    clean(result, [out, out.with_name("o.summary.parquet")], tmp_path)
    if result.exit_code == 2:
        assert result.output.strip().count("\n") == 0, result.output
