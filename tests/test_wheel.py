"""The wheel is complete: it carries the shipped pools and task sets, and an installed
wheel finds them from a directory outside the repository.

The wheel is built from a copy of the sources (the checkout stays untouched) and
installed with ``--no-deps`` into a fresh venv without system site-packages; a ``.pth``
file written *after* the install lends it this environment's third-party packages
(torch, transformers, ...) but not this checkout, so ``import cdscope`` can only
resolve to the installed wheel. Bounded: every subprocess has a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "cdscope" / "data"


def _run(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env = {k: v for k, v in env.items() if not k.startswith("CDSCOPE_") or k == "CDSCOPE_CACHE"}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{' '.join(args)}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel . --no-deps`` of a copy of the sources (no network, no build isolation)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "cdscope", src / "cdscope", ignore=shutil.ignore_patterns("__pycache__"))
    out = base / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out)],
        cwd=base,
    )  # fmt: skip
    (path,) = out.glob("cdscope-*.whl")
    return path


def test_wheel_contains_every_shipped_pool_and_task_file(wheel: Path) -> None:
    shipped = {
        "cdscope/" + p.relative_to(ROOT / "cdscope").as_posix()
        for p in DATA.rglob("*")
        if p.is_file() and p.suffix in (".jsonl", ".json")
    }
    # 3 pools + MANIFEST; 2 splits x 3 families + MANIFEST; the curriculum: 2 splits x 3 families
    assert len(shipped) == 4 + 7 + 6
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert shipped <= names, sorted(shipped - names)
        for name in shipped:  # byte-identical to the checkout
            assert archive.read(name) == (ROOT / name).read_bytes(), name
        assert "cdscope/__main__.py" in names and "cdscope/py.typed" in names
        assert not any(n.startswith(("probes/", "tasks/")) for n in names)  # builders stay out


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (no deps), then this env's deps via a .pth."""
    root = tmp_path_factory.mktemp("venv") / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
    python = root / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        cwd=root.parent,
    )  # fmt: skip
    site = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=root.parent,
    ).stdout.strip()
    # plain path lines: the directory joins sys.path after the venv's own site-packages,
    # and its .pth files (this checkout's editable-install hook) are not executed
    deps = sysconfig.get_paths()["purelib"]
    Path(site, "zz_cdscope_test_deps.pth").write_text(deps + "\n")
    return root


def test_installed_wheel_finds_its_data_outside_the_repository(venv: Path, tmp_path: Path) -> None:
    code = (
        "import json, cdscope, cdscope.core.probes as p, cdscope.tasks as t;"
        "pool = p.load_pool();"
        "print(json.dumps({'file': cdscope.__file__,"
        " 'items': {f: len(v) for f, v in pool.by_family.items()},"
        " 'eval': len(t.load_tasks(t.default_task_paths('eval'))),"
        " 'train': len(t.load_tasks(t.default_task_paths('train')))}))"
    )
    found = json.loads(_run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path).stdout)
    assert Path(found["file"]).is_relative_to(venv)  # the wheel, not this checkout
    assert found["items"] == {"code": 64, "logic": 64, "math": 64}
    assert (found["eval"], found["train"]) == (48 + 50 + 48, 128 + 50 + 128)
    version = _run([str(venv / "bin" / "python"), "-m", "cdscope", "--version"], cwd=tmp_path)
    assert version.stdout.strip().startswith("cdscope ")


def test_installed_cli_probes_a_local_model_with_the_shipped_pools(
    venv: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The console script, run from a directory outside the checkout, on a tiny model."""
    _run(
        [str(venv / "bin" / "cdscope"), "probe", "--model", str(tiny_model_dir), "--n", "1",
         "--out", "p.parquet"],
        cwd=tmp_path,
    )  # fmt: skip
    import pandas as pd

    frame = pd.read_parquet(tmp_path / "p.parquet")
    assert sorted(frame["family"].unique()) == ["code", "logic", "math"]
    assert len(frame) == 3 * 6  # 3 families x K = 2 x 3 layers
