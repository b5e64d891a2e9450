"""Faults end in exit 2 and one line, never a traceback, a half-written file or a stale
temp folder (issue #13): writer errors, --resume identity, half outputs, bad values."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from safetensors import SafetensorError

from cdscope import io as cio
from cdscope.errors import CdscopeError
from cdscope.fileset import partial_path
from cdscope.output.frames import FRAME_COLUMNS
from cdscope.tools.tiny import save_checkpoint
from tests.helpers import (
    byte_tokenizer,
    invoke,
    refused,
    tiny_model,
    write_foreign_parquet,
    write_pool,
)

ENOSPC = OSError(errno.ENOSPC, "No space left on device")
SAFETENSORS_FULL = SafetensorError(
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
)


def no_leftovers(folder: Path) -> None:
    hidden = [p.name for p in folder.rglob(".*")]
    assert not hidden, f"temporary files left behind: {hidden}"


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory) -> Path:
    model = tiny_model("llama")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return save_checkpoint(model, tmp_path_factory.mktemp("nan-model"))


@pytest.fixture(scope="module")
def nan_head_model_dir(tmp_path_factory) -> Path:
    """Finite hidden states, NaN logits: only the LM head is NaN (caught by the load proof)."""
    model = tiny_model("llama")
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.full_like(model.lm_head.weight, float("nan")))
    return save_checkpoint(model, tmp_path_factory.mktemp("nan-head-model"))


@pytest.fixture(scope="module")
def nan_text_model_dir(tmp_path_factory) -> Path:
    """NaN embeddings for every token except the few the load-time proof feeds the model
    (its causality check's changed tail included): loading and the proof pass, and the
    first NaN appears in a measured quantity."""
    from cdscope.core.models.causal import changed_tail
    from cdscope.core.models.discovery import probe_ids

    model = tiny_model("llama")
    ids = probe_ids(model, torch.device("cpu"))
    keep = set(ids.flatten().tolist()) | set(
        changed_tail(ids, model.config.vocab_size)[0].flatten().tolist()
    )
    with torch.no_grad():
        for token in set(range(model.config.vocab_size)) - keep:
            model.get_input_embeddings().weight[token] = float("nan")
    return save_checkpoint(model, tmp_path_factory.mktemp("nan-text-model"))


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return save_checkpoint(
        tiny_model("gpt2"), tmp_path_factory.mktemp("gpt2")
    )  # 128 learned positions


def probe_file(path: Path, families=("code", "logic", "math"), seeds=(0, 1), **change) -> Path:
    """A synthetic probe Parquet as ``probe`` writes it (no model needed)."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in seeds:
        for family in families:
            for gate in range(4):
                C = float(rng.normal())  # noqa: N806
                rows.append(dict(model="m", seed=seed, family=family, gate=gate, layer=gate // 2,
                                 sublayer=("attn", "mlp")[gate % 2], C=C, F=abs(C) + 1,
                                 dl_dg=-2 * C, ell=-2.0, dropped=False))  # fmt: skip
    frame = pd.DataFrame(rows, columns=FRAME_COLUMNS)
    for column, value in change.items():
        frame[column] = value(frame) if callable(value) else value
    meta = {"settings": {"n": 3, "template": "plain", "estimator": "autograd"},
            "models": [{"name": "m", "K": 4}], "probe_hash": "sha256:x"}  # fmt: skip
    if not change:
        return cio.write_parquet(frame, path, meta)
    return write_foreign_parquet(frame, path, meta)  # as another writer would leave it


# -- 4 + 7: any writer error during an atomic write -> one line, temp removed ------------
@pytest.mark.parametrize(
    "error", [ENOSPC, SAFETENSORS_FULL, pa.ArrowIOError("disk quota exceeded"), RuntimeError("x")]
)
def test_atomic_writes_turn_any_writer_error_into_one_line(tmp_path, monkeypatch, error) -> None:
    target = tmp_path / "out.parquet"
    cio.write_parquet(pd.DataFrame({"a": [1]}), target, {"v": 1})

    def broken(table, where):
        Path(where).write_bytes(b"half")
        raise error

    monkeypatch.setattr(cio.pq, "write_table", broken)
    with pytest.raises(CdscopeError, match=f"could not write {target}"):
        cio.write_parquet(pd.DataFrame({"a": [2]}), target, {"v": 2})
    monkeypatch.undo()
    assert cio.read_parquet(target)[1] == {"v": 1}  # the old file is intact
    no_leftovers(tmp_path)
    with pytest.raises(CdscopeError), cio.atomic_dir(tmp_path / "folder") as tmp:
        (tmp / "part").write_text("x")
        raise error
    assert not (tmp_path / "folder").exists()
    no_leftovers(tmp_path)


def test_safetensors_disk_full_while_checkpointing_keeps_the_previous_one(tmp_path, monkeypatch):
    from cdscope.train import checkpoint as ckpt

    model = tiny_model("llama")
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ckpt.save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {}, [])

    def full(*args, **kwargs):
        raise SAFETENSORS_FULL

    monkeypatch.setattr(ckpt, "save_model", full)
    with pytest.raises(CdscopeError, match=r"disk full.*step-000001 is still the latest"):
        ckpt.save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {}, [])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-000001"]


def test_disk_full_while_writing_the_probe_parquet(
    tiny_model_dir, pool_file, tmp_path, monkeypatch
):
    def full(table, where, **kwargs):
        Path(where).write_bytes(b"half")
        raise ENOSPC

    monkeypatch.setattr(cio.pq, "write_table", full)
    out = tmp_path / "p.parquet"
    refused(
        invoke("probe", "-m", tiny_model_dir, "-p", pool_file, "--n", 1, "-o", out), "disk full"
    )
    assert not out.exists()
    no_leftovers(tmp_path)


# -- 5: --resume reuses a (model, seed) only when model content, dtype, settings match ----
def test_resume_refuses_changed_weights_dtype_and_recomputes_on_request(
    tiny_model_dir, pool_file, tmp_path
) -> None:
    model_dir = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, model_dir)
    out = tmp_path / "p.parquet"
    args = ("probe", "-m", model_dir, "-p", pool_file, "--n", 1, "-o", out)
    assert invoke(*args, "--seeds", 1).exit_code == 0
    before = out.read_bytes()
    meta = cio.read_parquet(out)[1]
    assert meta["models"][0]["revision"].startswith("sha256:")

    refused(invoke(*args, "--seeds", 2, "--resume", "--dtype", "float64"), "dtype changed")
    save_checkpoint(tiny_model("llama", attn="sdpa", seed=1), model_dir)  # other weights, same path
    refused(invoke(*args, "--seeds", 2, "--resume"), "revision changed", "--resume=recompute")
    assert out.read_bytes() == before  # nothing merged, nothing rewritten
    refused(invoke(*args, "--seeds", 2, "--recompute"), "only applies with --resume")

    redone = invoke(*args, "--seeds", 2, "--resume=recompute")
    assert redone.exit_code == 0, redone.output
    fresh = tmp_path / "fresh.parquet"
    assert (
        invoke(
            "probe", "-m", model_dir, "-p", pool_file, "--n", 1, "--seeds", 2, "-o", fresh
        ).exit_code
        == 0
    )
    got, want = pd.read_parquet(out), pd.read_parquet(fresh)
    np.testing.assert_allclose(got["C"].to_numpy(), want["C"].to_numpy(), rtol=1e-6)
    kept = invoke(*args, "--seeds", 2, "--resume")  # now everything matches: reused as is
    assert kept.exit_code == 0 and "keeping 2 finished" in kept.output


def test_resume_refuses_a_file_without_model_identity(tiny_model_dir, pool_file, tmp_path):
    out = tmp_path / "p.parquet"
    assert (
        invoke("probe", "-m", tiny_model_dir, "-p", pool_file, "--n", 1, "-o", out).exit_code == 0
    )
    frame, meta = cio.read_parquet(out)
    meta["models"][0].pop("revision")  # a file from before content hashes: identity unknown
    cio.write_parquet(frame, out, meta)
    refused(invoke("probe", "-m", tiny_model_dir, "-p", pool_file, "--n", 1, "-o", out, "--resume"),
            "revision None")  # fmt: skip


def test_seed_metadata_is_compact(tiny_model_dir, pool_file, tmp_path) -> None:
    from cdscope.commands.probe import collect_control
    from cdscope.commands.requests import ProbeRun
    from cdscope.core.probes import load_pool
    from cdscope.output.frames import ProbeSettings, describe_seeds

    assert describe_seeds(range(1_000_000)) == "0..999999"
    assert describe_seeds([3, 1]).startswith("2 seeds, sha256:")
    out = tmp_path / "p.parquet"

    def stop(*_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run = ProbeRun([str(tiny_model_dir)], load_pool([pool_file]),
                       ProbeSettings(tuple(range(100_000)), 1), out)  # fmt: skip
        collect_control(run, on_result=stop)
    assert not out.exists()  # an interrupted run leaves its progress beside OUT, not in it
    meta = cio.read_parquet(partial_path(out))[1]
    assert meta["seeds"] == "0..99999" and len(json.dumps(meta)) < 4000


# -- 6: nothing half-written --------------------------------------------------------------
@pytest.mark.parametrize("command", ["bshared", "acg", "decompose"])
def test_from_one_family_writes_nothing(command, tmp_path) -> None:
    source = probe_file(tmp_path / "one.probe.parquet", families=("math",))
    out = tmp_path / "a.parquet"
    refused(invoke(command, "--from", source, "-o", out), "at least 2 families")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.probe.parquet"]


# -- 7: tracebacks become one line -----------------------------------------------------------
def test_corrupt_safetensors_is_one_line(tiny_model_dir, pool_file, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    for cut in (1000, len(data) // 2):  # a bad header, a truncated body
        (broken / "model.safetensors").write_bytes(data[:cut])
        out = tmp_path / "p.parquet"
        refused(invoke("probe", "-m", broken, "-p", pool_file, "-o", out), "cannot load model")
        assert not out.exists()


def test_prompt_longer_than_learned_positions(gpt2_dir, tmp_path) -> None:
    pool = write_pool(tmp_path / "long.jsonl", {"math": 2, "code": 2}, prompt_len=900)
    out = tmp_path / "p.parquet"
    refused(invoke("probe", "-m", gpt2_dir, "-p", pool, "--n", 1, "-o", out), "only 128 positions")
    assert not out.exists()
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "math/a/0", "family": "math", "prompt": "1+1=",
                                 "verifier": "math", "answer": "2"}) + "\n")  # fmt: skip
    refused(invoke("eval", "-m", gpt2_dir, "--tasks", tasks, "--n", 1, "--max-new-tokens", 500,
                   "-o", tmp_path / "ev"), "only 128 positions")  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ("gradcheck", "--seeds", 1, "--n", 1, "--eps", "0.01"),
        ("eval", "--n", 2, "--temperature", 0.7),
        ("eval", "--n", 1, "--temperature", 0),
        ("eap-info", "--n", 2, "--use-targets"),
    ],
    ids=["gradcheck", "eval-sampling", "eval-greedy", "eap-info"],
)
def test_nan_weights_are_refused_naming_the_quantity(nan_model_dir, pool_file, tmp_path, args):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "math/a/0", "family": "math", "prompt": "1+1=",
                                 "verifier": "math", "answer": "2"}) + "\n")  # fmt: skip
    extra = ["--tasks", tasks, "--max-new-tokens", 3] if args[0] == "eval" else ["-p", pool_file]
    out = tmp_path / "out" / ("ev" if args[0] == "eval" else "o.parquet")
    line = refused(invoke(*args, "-m", nan_model_dir, *extra, "-o", out), "non-finite")
    assert "tr(C C^T)" not in line
    # named where it is first seen: a measured quantity, or the gates' proof at load
    assert ("is NaN" in line and "weights are non-finite" in line) or (
        "layer 0: non-finite hidden states" in line and "NaN/inf weights" in line
    ), line
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_nan_weights_in_training(tmp_path) -> None:
    from cdscope.commands.train import run_train
    from cdscope.settings.training import TrainConfig
    from tests.helpers import parity_reward, write_tasks_file

    model = tiny_model("llama")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    cfg = TrainConfig(model="nan", out_dir=str(tmp_path / "run"), steps=1, prompts_per_step=3,
                      group_size=2, max_new_tokens=3, tau=34.0, probe_n=1, estimator="proxy",
                      tasks=(str(write_tasks_file(tmp_path / "t.jsonl")),),
                      probe_files=(str(write_pool(tmp_path / "p.jsonl", {"math": 2, "code": 2, "logic": 2})),))  # fmt: skip
    with pytest.raises(CdscopeError, match="is NaN|non-finite hidden states"):
        run_train(cfg, model=model, tokenizer=byte_tokenizer(), reward_fn=parity_reward)


@pytest.mark.parametrize(
    "args",
    [
        ("random-ref", "--seed", -1, "-K", 4, "-T", 10),
        ("random-ref", "-M", 100_000, "-K", 4, "-T", 10),
        ("random-ref", "-M", 900, "-K", 200_000, "-T", 10),
        ("random-ref", "-K", 4, "-T", "1e23"),
        ("random-ref", "-K", 4, "-T", 10**23),
        ("eap-info", "--seed", -1),
        ("probe", "--seeds", "99999999999999999999"),
        ("bshared", "--seeds", "99999999999999999999"),
        ("gradcheck", "--first-seed", 2**40, "--seeds", 1, "--n", 1, "--eps", 0.1, "-m", "TINY"),
        ("eval", "--seed", 2**70, "--limit", 1, "--n", 1, "--max-new-tokens", 2, "-m", "TINY"),
    ],
)
def test_out_of_range_numbers_are_refused_before_any_work(
    args, tiny_model_dir, pool_file, tmp_path
) -> None:
    out = tmp_path / "o.parquet"
    args = [tiny_model_dir if a == "TINY" else a for a in args]
    if args[0] == "gradcheck":
        args += ["-p", pool_file]
    if args[0] == "eval":
        tasks = tmp_path / "t.jsonl"
        tasks.write_text(json.dumps({"id": "math/a/0", "family": "math", "prompt": "1+1=",
                                     "verifier": "math", "answer": "2"}) + "\n")  # fmt: skip
        args += ["--tasks", tasks]
    result = invoke(*args, "-o", out)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not out.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"C": lambda f: f["C"].where(f.index != 5, np.nan)}, "C of family"),
        ({"ell": lambda f: f["ell"].where(f.index != 0, np.inf)}, "ell of family"),
        ({"seed": lambda f: f["seed"].astype(str)}, "column 'seed'"),
        ({"dropped": "no"}, "column 'dropped'"),
    ],
)
def test_from_files_with_bad_values_are_refused(tmp_path, change, message) -> None:
    source = probe_file(tmp_path / "x.probe.parquet", **change)
    refused(invoke("bshared", "--from", source, "-o", tmp_path / "b.parquet"), message)
    assert not (tmp_path / "b.parquet").exists()


def test_from_file_with_corrupt_metadata(tmp_path) -> None:
    import pyarrow.parquet as pq

    source = probe_file(tmp_path / "x.probe.parquet")
    table = pq.read_table(source)
    for raw in (b"{not json", b"\xff\xfe", b"[1, 2]", b'{"settings": 3}'):
        pq.write_table(table.replace_schema_metadata({b"cdscope": raw}), source)
        refused(invoke("acg", "--from", source, "-o", tmp_path / "a.parquet"), str(source))
    source.write_bytes(source.read_bytes()[:200])  # truncated Parquet
    refused(invoke("acg", "--from", source, "-o", tmp_path / "a.parquet"), "not a readable Parquet")


# -- 8: silent nonsense ----------------------------------------------------------------------
def test_non_finite_and_ignored_options_are_refused(tiny_model_dir, tmp_path) -> None:
    source = probe_file(tmp_path / "x.probe.parquet")
    for value in ("nan", "inf", "-1"):
        result = invoke(
            "bshared", "--from", source, "--fail-above", value, "-o", tmp_path / "b.parquet"
        )
        assert result.exit_code == 2 and "--fail-above" in result.output
    refused(invoke("bshared", "--from", source, "--seeds", 5, "-o", tmp_path / "b.parquet"),
            "--seeds does not apply to --from")  # fmt: skip
    assert not (tmp_path / "b.parquet").exists()
    refused(invoke("random-ref", "-M", 3, "-K", 4, "-m", tiny_model_dir, "-o", tmp_path / "r.parquet"),
            "not both")  # fmt: skip
    refused(invoke("gradcheck", "--eps", "nan", "-o", tmp_path / "g.parquet"), "--eps")
    refused(invoke("gradcheck", "--eps", "0.01,inf", "-o", tmp_path / "g.parquet"), "--eps")
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "math/a/0", "family": "math", "prompt": "1+1=",
                                 "verifier": "math", "answer": "2"}) + "\n")  # fmt: skip
    refused(invoke("eval", "-m", tiny_model_dir, "--tasks", tasks, "--max-new-tokens", "chem=5",
                   "-o", tmp_path / "ev"), "chem")  # fmt: skip
    assert not list(tmp_path.rglob("*.parquet"))[1:]  # only the --from source exists


def test_interrupt_message_promises_resume_only_where_it_exists(monkeypatch, tmp_path) -> None:
    from cdscope.commands import random_ref

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(random_ref, "random_reference", interrupted)
    result = invoke("random-ref", "-M", 3, "-K", 4, "-o", tmp_path / "r.parquet")
    assert result.exit_code == 130 and "interrupted" in result.output
    assert "rerun with --resume" not in result.output and "no --resume" in result.output
    monkeypatch.setattr(
        cio, "check_writable", lambda path: (_ for _ in ()).throw(KeyboardInterrupt())
    )
    result = invoke("probe", "-o", tmp_path / "p.parquet")
    assert result.exit_code == 130 and "rerun with --resume" in result.output


def test_eval_resume_refuses_changed_weights(tiny_model_dir, tmp_path) -> None:
    model_dir = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, model_dir)
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"math/a/{i}",
                    "family": "math",
                    "prompt": f"{i}+1=",
                    "verifier": "math",
                    "answer": str(i + 1),
                }
            )
            + "\n"
            for i in range(2)
        )  # fmt: skip
    )
    args = ("eval", "-m", model_dir, "--tasks", tasks, "--n", 1, "--max-new-tokens", 2)
    assert invoke(*args, "--limit", 1, "-o", tmp_path / "ev").exit_code == 0
    save_checkpoint(tiny_model("llama", attn="sdpa", seed=2), model_dir)
    refused(invoke(*args, "--resume", "-o", tmp_path / "ev"), "revision changed")
    redone = invoke(*args, "--resume=recompute", "-o", tmp_path / "ev")
    assert redone.exit_code == 0, redone.output
    assert len(pd.read_parquet(tmp_path / "ev" / "samples.parquet")) == 2


def test_corrupt_pandas_metadata_is_one_line(tmp_path) -> None:
    """A corrupted byte in the Parquet's pandas schema metadata (found by the fuzzer):
    pyarrow's to_pandas raises a JSONDecodeError, which must become one line."""
    import pyarrow.parquet as pq

    from cdscope.io import read_parquet, write_parquet

    path = tmp_path / "x.parquet"
    write_parquet(pd.DataFrame({"a": [1, 2]}), path, {"k": "v"})
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    meta[b"pandas"] = meta[b"pandas"][:20] + b"\x01" + meta[b"pandas"][21:]
    pq.write_table(table.replace_schema_metadata(meta), path)
    with pytest.raises(CdscopeError, match="is not a readable Parquet file"):
        read_parquet(path)


def test_nan_logits_are_refused_at_load_not_misreported(nan_head_model_dir, pool_file, tmp_path):
    """NaN != NaN: the unit-gate identity check must not call NaN logits a broken hook."""
    line = refused(invoke("probe", "-m", nan_head_model_dir, "-p", pool_file, "--seeds", 1,
                          "--n", 1, "-o", tmp_path / "p.parquet"), "non-finite logits")  # fmt: skip
    assert "not an identity" not in line and "LM head" in line


@pytest.mark.parametrize("granularity", ["sublayer", "head", "neuron", "edge"])
def test_nan_control_is_refused_at_every_granularity(
    nan_text_model_dir, pool_file, tmp_path, granularity
) -> None:
    """The finite check on a measured C is shared by every gate set: a NaN l_m stops the
    probe with one line naming the quantity, and no output file is left."""
    out = tmp_path / "out" / "p.parquet"
    args = ["-p", pool_file, "--seeds", 1, "--n", 1, "--granularity", granularity, "-o", out]
    line = refused(invoke("probe", "-m", nan_text_model_dir, *args), "non-finite")
    assert "is NaN" in line, line
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
