"""The Python API refuses what it cannot mean (issue #40, item 1): every argument is
checked before any model loads, each refusal is one ``CdscopeError`` sentence in the
API's terms -- its argument names (never a command-line flag) and its unit (fractions) --
and the command line keeps its flags and percent for the same checks."""

from __future__ import annotations

import re

import numpy as np
import pytest

import cdscope
from cdscope import CdscopeError
from cdscope.errors import in_python, option, python_api
from tests.helpers import byte_tokenizer, invoke, refused, tiny_model

FLAG = re.compile(r"(?<![\w-])--?[a-zA-Z]")  # a command-line flag: --seeds, -K


@pytest.fixture(scope="module")
def model():
    return cdscope.load_model(tiny_model("llama", seed=1), byte_tokenizer(), name="tiny")


def refused_in_python(call, *fragments: str) -> str:  # noqa: ANN001
    """``call()`` raises one CdscopeError line holding every fragment and no flag."""
    with pytest.raises(CdscopeError) as raised:
        call()
    text = str(raised.value)
    assert "\n" not in text, text
    assert not FLAG.search(text), f"a command-line flag in an API error: {text}"
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return text


# -- seeds: a count or a list of seeds, never a string read character by character ----------
@pytest.mark.parametrize(
    ("seeds", "fragment"),
    [
        ("3", "not str '3'"),  # was: probe seed 3 alone
        ("12", "not str '12'"),  # was: seeds 1 and 2
        (b"3", "not bytes"),
        (2.5, "not float 2.5"),  # was: a raw TypeError
        (2.0, "not float 2.0"),  # a whole float is still not a count
        (True, "not bool True"),
        (0, "seeds must lie in [1, "),
        (-2, "seeds must lie in [1, "),
        ([], "empty list"),
        ([0, 1, 0], "seed 0 more than once"),
        ([0, "1"], "each seed must be a whole number, not str '1'"),
        ([0, -1], "each seed must lie in [0, "),
        ([2**32], "each seed must lie in [0, "),
        (None, "not NoneType None"),
    ],
)
def test_seeds_are_a_count_or_a_list_of_seeds(model, seeds, fragment) -> None:
    refused_in_python(lambda: cdscope.measure(model, seeds=seeds, progress=False), fragment)
    refused_in_python(lambda: cdscope.bshared(model, seeds=seeds, progress=False), fragment)


def test_seeds_in_every_accepted_spelling_measure_those_seeds(model, pool_file) -> None:
    for seeds, expected in [(2, [0, 1]), ([3, 1], [3, 1]), ((4,), [4]), (range(2), [0, 1]),
                            (np.array([5, 6]), [5, 6]), (np.int64(1), [0])]:  # fmt: skip
        frame = cdscope.measure(model, pool_file, seeds=seeds, n=2, progress=False)
        assert list(dict.fromkeys(frame["seed"])) == expected, seeds


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"n": 0}, ["n must lie in [1, "]),
        ({"n": "3"}, ["n must be a whole number, not str '3'"]),
        ({"batch_size": 0}, ["batch_size must lie in [1, "]),
        ({"batch_size": 1.5}, ["batch_size must be a whole number"]),
        ({"template": "chatml"}, ["template must be one of plain, chat; got 'chatml'"]),
        ({"estimator": "exact"}, ["estimator must be one of autograd, fd; got 'exact'"]),
        ({"granularity": "layer"}, ["granularity must be one of sublayer, "]),
        ({"granularity": "edge", "estimator": "fd"}, ["drop estimator='fd'"]),
        ({"progress": "no"}, ["progress must be True or False"]),
    ],
)
def test_measure_options_are_named_as_arguments(model, kwargs, fragments) -> None:
    refused_in_python(lambda: cdscope.measure(model, seeds=1, **kwargs), *fragments)


def test_an_unknown_audit_option_is_named(model) -> None:
    refused_in_python(
        lambda: cdscope.bshared(model, seed=3), "bshared has no argument 'seed'", "seeds"
    )


def test_a_probe_too_small_for_n_names_the_argument(model, pool_file) -> None:
    refused_in_python(
        lambda: cdscope.measure(model, pool_file, n=9, progress=False),
        "fewer than n=9; lower n or add items",
    )
    refused_in_python(lambda: cdscope.draw_probe(pool_file, seed=-1), "seed must lie in [0, ")
    refused_in_python(lambda: cdscope.draw_probe(pool_file, n=2.5), "n must be a whole number")


def test_load_model_options_are_named_as_arguments(tmp_path) -> None:
    hf = tiny_model("llama")
    refused_in_python(lambda: cdscope.load_model(hf, byte_tokenizer(), device="gpu"),
                      "device must be auto, cpu, cuda[:N] or mps, got 'gpu'")  # fmt: skip
    refused_in_python(lambda: cdscope.load_model(hf, byte_tokenizer(), dtype="fp32"),
                      "dtype must be one of auto, ")  # fmt: skip
    if not __import__("torch").cuda.is_available():
        refused_in_python(lambda: cdscope.load_model(hf, byte_tokenizer(), device="cuda"),
                          "device='cuda': CUDA is not available", "use device='cpu'")  # fmt: skip


# -- random_reference speaks fractions ---------------------------------------------------------
def test_random_reference_value_is_a_fraction_and_says_so() -> None:
    text = refused_in_python(
        lambda: cdscope.random_reference(families=3, gates=8, trials=10, value=150),
        "value is a B_shared fraction between 1/M = 0.3333",
        "and 1, not a percentage; got 150",
    )
    assert "15000" not in text  # the old message multiplied the fraction by 100
    refused_in_python(  # the likely slip: percent typed into a fraction
        lambda: cdscope.random_reference(families=3, gates=8, trials=10, value=69.2),
        "got 69.2 (69.2% is 0.692)",
    )
    ok = cdscope.random_reference(families=3, gates=8, trials=10, value=0.692)
    assert ok.stats["value"] == 0.692


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"families": 1, "gates": 4}, "families must lie in [2, "),
        ({"families": "3", "gates": 4}, "families must be a whole number, not str '3'"),
        ({"gates": 0}, "gates must lie in [1, "),
        ({"gates": 4, "trials": 2.5}, "trials must be a whole number"),
        ({"gates": 4, "seed": -1}, "seed must lie in [0, "),
        ({"gates": 4, "value": "0.5"}, "value is a B_shared fraction, not str '0.5'"),
        ({}, "give gates=K, or model= to take K from a model"),
        ({"gates": 4, "trials": 0}, "trials must lie in [1, "),
    ],
)
def test_random_reference_arguments_are_named_as_arguments(kwargs, fragment) -> None:
    refused_in_python(lambda: cdscope.random_reference(**kwargs), fragment)


def test_plot_names_its_path_argument(tmp_path) -> None:
    reference = cdscope.random_reference(families=3, gates=4, trials=10)
    refused_in_python(
        lambda: cdscope.plot(reference, tmp_path / "fig.jpg"), "path must end in .png"
    )


# -- one place decides the spelling: the same checks keep their flags on the command line ------
def test_the_command_line_keeps_flags_and_percent(tmp_path) -> None:
    out = tmp_path / "r.parquet"
    refused(invoke("random-ref", "-M", 3, "-K", 8, "--value", 150, "--out", out),
            "--value is a percentage between 1/M = 33.33", "got 150")  # fmt: skip
    refused(invoke("random-ref", "-M", 3, "--out", out), "give --gates K, or --model")
    refused(invoke("probe", "--template", "chatml", "--out", out), "--template must be one of")


def test_option_spells_an_input_for_the_surface_in_use() -> None:
    assert not in_python()
    assert option("batch_size") == "--batch-size"
    assert option("n", 3) == "--n 3"
    assert option("lam", flag="--lambda") == "--lambda"
    with python_api():
        assert in_python()
        assert option("batch_size") == "batch_size"
        assert option("template", "chat") == "template='chat'"
        assert option("lam", flag="--lambda") == "lam"
    assert not in_python()  # reset on leaving, also after an error:
    with pytest.raises(CdscopeError), python_api():
        raise CdscopeError("x")
    assert not in_python()
