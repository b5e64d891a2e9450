"""benchmarks/gpu_check.py stays runnable between GPUs: its --dry-run (tiny configs, CPU)
writes every section, and its pieces (independent sections, the travel size) hold."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_PATH = ROOT / "benchmarks" / "gpu_check.py"


def _module():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("gpu_check", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(_PATH), "--dry-run", "--out", str(out), "--log", str(tmp_path / "log")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    sections = json.loads(out.read_text())["sections"]
    assert set(sections) == {"headline", "precision", "training", "generation"}
    for name, got in sections.items():
        assert "error" not in got and "skipped" not in got, (name, got)

    head = sections["headline"]
    assert head["K"] == 4  # 2 layers x (attn, mlp)
    assert head["proof"]["unit_gates_exact"] and head["proof"]["zero_gates_error"] == 0
    assert len(head["B_shared_pct"]) == 2
    assert all(100 / 3 - 1e-6 <= b <= 100 for b in head["B_shared_pct"])  # SPEC §3 bounds
    assert head["C_over_forward"] > 0

    fp32, bf16 = sections["precision"]["rows"]
    assert (fp32["kernel"], bf16["kernel"]) == ("float32:sdpa", "bfloat16:sdpa")
    # the dry run's two stand-ins are the same seeded tiny model: the API's bshared (headline)
    # and the direct control_autograd (precision) must give the same float32 B_shared
    assert [100 * b for b in fp32["B_shared"]] == pytest.approx(head["B_shared_pct"], abs=2e-3)
    # the same weights in bf16: B_shared within 2 points (0.03 measured), rows aligned
    assert max(abs(d) for d in bf16["B_shared_vs_fp32_points"]) < 2.0
    assert bf16["C_cosine_vs_fp32"] > 0.99

    train = sections["training"]
    assert train["grpo"]["regularizer_s"] == 0 and train["cdrft"]["regularizer_s"] > 0
    assert train["cdrft_checkpointing"]["regularizer_s"] > 0
    assert "bfloat16" in train["cdrft_bfloat16"]["error"]  # bf16 gate steps are refused
    assert "cdrft_overhead_pct" in train

    gen = sections["generation"]
    assert 0 < gen["tokens"] <= gen["problems"] * gen["n"] * gen["max_new_tokens"]
    table = out.with_suffix(".md").read_text()
    assert all(f"| {name} |" in table for name in sections)


def test_a_failing_section_is_recorded_and_the_next_runs(tmp_path: Path) -> None:
    gpu_check = _module()
    check = gpu_check.Check(gpu_check.parse_args(["--dry-run", "--out", str(tmp_path / "g.json")]))
    check.section("headline", lambda: {"x": 1 / 0}, needs_s=0)
    check.section("generation", lambda: {"tokens": 3, "tokens_per_s": 1.5, "n": 1}, needs_s=0)
    check.section("precision", lambda: {"never": True}, needs_s=10**6)  # past the budget
    written = json.loads((tmp_path / "g.json").read_text())["sections"]
    assert written["headline"]["error"] == "ZeroDivisionError: division by zero"
    assert written["generation"]["tokens"] == 3
    assert "skipped" in written["precision"]


def test_travel_size_counts_the_tree_and_the_carried_wheels(tmp_path: Path) -> None:
    gpu_check = _module()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored.bin\n.whl/\n")  # 18 bytes
    (tmp_path / "tracked.py").write_bytes(b"x" * 1000)
    (tmp_path / "ignored.bin").write_bytes(b"x" * 10**6)  # ignored: does not travel
    (tmp_path / ".whl" / "tokenizer").mkdir(parents=True)
    (tmp_path / ".whl" / "a.whl").write_bytes(b"x" * 300)
    (tmp_path / ".whl" / "tokenizer" / "t.json").write_bytes(b"x" * 50)
    assert gpu_check.travel_size(tmp_path) == 18 + 1000 + 300 + 50
