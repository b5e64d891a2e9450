"""--device-map / --max-memory / --offload-dir: accelerate's dispatch under the gates, on CPU.

The disk-offload runs cap CPU memory below the tiny model's size, so modules stream in
from the offload folder (their parameters sit on ``meta`` between forwards) — and C, F,
l_m, edge scores and pass@k samples equal those of the model held in memory. Tolerance:
rtol 1e-6 (fp32 round-off); in practice the values come out bit-identical, because the
offloaded weights are read back exactly and every kernel sees the same tensors.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.control import control_autograd
from cdscope.core.gating.model import GatedModel
from cdscope.core.models import load_model
from cdscope.core.models.placement import Placement, execution_device, parse_max_memory
from cdscope.errors import CdscopeError
from cdscope.io import read_parquet
from tests.helpers import tiny_model

CAP = "cpu=120000"  # bytes: the tiny Llama is 188 kB in fp32; about half of it goes to disk


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in result.output, result.output


def test_max_memory_parses_sizes_and_refuses_bad_text() -> None:
    assert parse_max_memory("cpu=200GiB") == {"cpu": 200 * 2**30}
    assert parse_max_memory(" cpu = 500MB ") == {"cpu": 500_000_000}
    assert parse_max_memory("cpu=4096") == {"cpu": 4096}
    for bad in ("cpu", "cpu=lots", "cpu=0", "disk=1GiB", "tpu=1GiB", ""):
        with pytest.raises(CdscopeError):
            parse_max_memory(bad)


def test_map_files_are_checked_before_loading(tmp_path) -> None:
    device_map = tmp_path / "map.json"
    device_map.write_text(json.dumps({"model": "cpu", "lm_head": "disk"}))
    with pytest.raises(CdscopeError, match="add --offload-dir"):
        Placement.from_options(str(device_map), None, None)
    with pytest.raises(CdscopeError, match="not to a map file"):
        Placement.from_options(str(device_map), "cpu=1GiB", tmp_path / "off")
    device_map.write_text("[1, 2]")
    with pytest.raises(CdscopeError, match="module name: device"):
        Placement.from_options(str(device_map), None, None)
    with pytest.raises(CdscopeError, match="not found"):
        Placement.from_options(str(tmp_path / "missing.json"), None, None)
    assert Placement.from_options(None, None, None) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without GPUs")
def test_devices_that_do_not_exist_are_refused(tiny_model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "p.parquet"
    base = ["probe", "-m", tiny_model_dir, "--probe", pool_file, "--out", out]
    one_line_error(invoke(*base, "--max-memory", "0=70GiB,cpu=1GiB"), "GPU 0", "0 CUDA device")
    device_map = tmp_path / "map.json"
    device_map.write_text(json.dumps({"model": "cuda:3", "lm_head": "cpu"}))
    one_line_error(invoke(*base, "--device-map", device_map), "GPU 3")
    one_line_error(invoke(*base, "--device-map", "everywhere"), "auto, balanced")
    one_line_error(invoke(*base, "--device", "cpu", "--device-map", "auto"), "--device")
    assert not out.exists()


def test_memory_that_holds_no_layer_without_offload_dir_is_refused(
    tiny_model_dir, pool_file, tmp_path
) -> None:
    out = tmp_path / "p.parquet"
    result = invoke(
        "probe", "-m", tiny_model_dir, "--probe", pool_file, "--max-memory", CAP, "--out", out
    )
    one_line_error(result, "--offload-dir", "cannot hold")
    assert not out.exists()


def test_disk_offload_gives_the_in_memory_control_matrix(
    tiny_model_dir, pool_file, tmp_path
) -> None:
    common = ["probe", "-m", tiny_model_dir, "--probe", pool_file, "--seeds", 2]
    assert invoke(*common, "--device", "cpu", "--out", tmp_path / "mem.parquet").exit_code == 0
    offload = tmp_path / "offload"
    result = invoke(
        *common, "--max-memory", CAP, "--offload-dir", offload, "--out", tmp_path / "disk.parquet"
    )
    assert result.exit_code == 0, result.output
    mem = pd.read_parquet(tmp_path / "mem.parquet")
    disk, meta = read_parquet(tmp_path / "disk.parquet")
    pd.testing.assert_frame_equal(disk, mem, check_exact=False, rtol=1e-6, atol=0)
    assert meta["placement"] == {
        "device_map": "auto",
        "max_memory": {"cpu": 120000},
        "offload_dir": str(offload),
    }
    # the same placement really streams weights from disk: parameters live on meta
    loaded = load_model(str(tiny_model_dir), placement=Placement.from_options(None, CAP, offload))
    device_map = loaded.model.hf_device_map
    assert "disk" in device_map.values() and "cpu" in device_map.values()
    assert any(p.is_meta for p in loaded.model.parameters())
    assert loaded.device == torch.device("cpu") == execution_device(loaded.model)


def test_whole_model_on_disk_and_a_map_file(tiny_model_dir, pool_file, tmp_path) -> None:
    """A cap below every module (one map entry for the whole model) and a hand-written map."""
    reference = load_model(str(tiny_model_dir), "cpu")
    placements = {
        "all on disk": Placement.from_options(None, "cpu=1000", tmp_path / "o1"),
        "sequential": Placement.from_options("sequential", "cpu=100000", tmp_path / "o2"),
    }
    device_map = tmp_path / "map.json"
    device_map.write_text(json.dumps({"model.embed_tokens": "cpu", "model.layers": "disk"} | {
        "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"
    }))  # fmt: skip
    placements["file"] = Placement.from_options(str(device_map), None, tmp_path / "o3")
    from cdscope.core.batch import encode_probe
    from cdscope.core.probes import draw_probe, load_pool

    pool = load_pool([pool_file])
    batch = encode_probe(draw_probe(pool, 0, 3), reference.tokenizer, "plain", pad_id=258)
    with GatedModel(reference.model) as gm:
        expected = control_autograd(gm, batch, 1)
    for name, placement in placements.items():
        loaded = load_model(str(tiny_model_dir), placement=placement)
        assert any(p.is_meta for p in loaded.model.parameters()), name
        with GatedModel(loaded.model) as gm:
            got = control_autograd(gm, batch, 1)
        np.testing.assert_allclose(got.C, expected.C, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(got.F, expected.F, rtol=1e-6, err_msg=name)


def test_in_memory_models_are_dispatched_the_same_way(pool_file, tmp_path) -> None:
    """The GGUF route places an already-loaded model with ``Placement.dispatch``."""
    from cdscope.core.batch import encode_probe
    from cdscope.core.probes import draw_probe, load_pool
    from tests.helpers import byte_tokenizer

    pool = load_pool([pool_file])
    batch = encode_probe(draw_probe(pool, 1, 3), byte_tokenizer(), "plain", pad_id=258)
    results = []
    for placement in (None, Placement.from_options(None, CAP, tmp_path / "off")):
        model = tiny_model("qwen2")
        if placement is not None:
            model = placement.dispatch(model, torch.float32)
            assert any(p.is_meta for p in model.parameters())
        with GatedModel(model) as gm:
            results.append(control_autograd(gm, batch, 2))
    np.testing.assert_allclose(results[1].C, results[0].C, rtol=1e-6)
    np.testing.assert_allclose(results[1].ell, results[0].ell, rtol=1e-6)


def test_eap_info_and_eval_under_disk_offload(tiny_model_dir, pool_file, tmp_path) -> None:
    from tests.helpers import write_eval_tasks

    placed = ["--max-memory", CAP, "--offload-dir", tmp_path / "off"]
    eap = ["eap-info", "-m", tiny_model_dir, "--probe", pool_file, "--n", 2, "--use-targets"]
    assert invoke(*eap, "--device", "cpu", "--out", tmp_path / "e1.parquet").exit_code == 0
    result = invoke(*eap, *placed, "--out", tmp_path / "e2.parquet")
    assert result.exit_code == 0, result.output
    for suffix in ("parquet", "edges.parquet"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / f"e2.{suffix}"),
            pd.read_parquet(tmp_path / f"e1.{suffix}"),
            check_exact=False,
            rtol=1e-6,
        )
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    ev = [
        "eval",
        "-m",
        tiny_model_dir,
        "--tasks",
        tasks,
        "--n",
        2,
        "--k",
        "1,2",
        "--max-new-tokens",
        8,
    ]
    assert invoke(*ev, "--device", "cpu", "--out", tmp_path / "ev1").exit_code == 0
    result = invoke(*ev, *placed, "--out", tmp_path / "ev2")
    assert result.exit_code == 0, result.output
    columns = ["problem_id", "sample", "completion", "passed"]
    first = pd.read_parquet(tmp_path / "ev1" / "samples.parquet")
    second = pd.read_parquet(tmp_path / "ev2" / "samples.parquet")
    pd.testing.assert_frame_equal(second[columns], first[columns])


def test_gradcheck_under_a_map_and_refused_with_offload(
    tiny_model_dir, pool_file, tmp_path
) -> None:
    gc = [
        "gradcheck",
        "-m",
        tiny_model_dir,
        "--probe",
        pool_file,
        "--seeds",
        1,
        "--n",
        2,
        "--eps",
        "0.01",
    ]
    assert invoke(*gc, "--device", "cpu", "--out", tmp_path / "g1.parquet").exit_code == 0
    device_map = tmp_path / "map.json"  # every module resident (on CPU): weights differentiable
    device_map.write_text(json.dumps({"model": "cpu", "lm_head": "cpu"}))
    result = invoke(*gc, "--device-map", device_map, "--out", tmp_path / "g2.parquet")
    assert result.exit_code == 0, result.output
    values = ["cosine", "rel_error", "R"]
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "g2.parquet")[values],
        pd.read_parquet(tmp_path / "g1.parquet")[values],
        check_exact=False,
        rtol=1e-6,
    )
    result = invoke(
        *gc,
        "--max-memory",
        CAP,
        "--offload-dir",
        tmp_path / "off",
        "--out",
        tmp_path / "g3.parquet",
    )
    one_line_error(result, "gradcheck differentiates the weights", "offloaded")
    assert not (tmp_path / "g3.parquet").exists()
