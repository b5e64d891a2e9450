"""``cdscope eval --endpoint`` against a real ``vllm serve`` (vLLM's CPU build from
``.venv-vllm``) started on a free port and stopped by the test.

It runs in both suites: in the main environment (``make test``: the client as users run
it, beside a server from another environment; skipped with the reason when
``.venv-vllm`` is absent) and in the vLLM one (``make test-vllm``), where the served
completions are also compared with in-process ``--backend vllm`` ones: the same engine,
checkpoint, seeds and dtype by two routes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.engines.vllm import CPU_DEFAULTS
from cdscope.io import read_parquet
from tests.helpers import write_eval_tasks

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / ".venv-vllm" / "bin" / "vllm"
START_S = 420  # a loaded 2-core machine took 60-150 s
SETTINGS = ["--n", 2, "--k", "1,2", "--max-new-tokens", 16, "--seed", 3, "--temperature", 0.6]

pytestmark = pytest.mark.skipif(
    not VLLM.exists(),
    reason=".venv-vllm is absent: `make setup-vllm` builds it, then this test runs vllm serve",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(directory: Path, port: int) -> list[str]:
    """``vllm serve`` with the in-process engine's CPU defaults (``CPU_DEFAULTS``)."""
    assert set(CPU_DEFAULTS) == {"enforce_eager", "kv_cache_memory_bytes", "enable_chunked_prefill"}
    return [str(VLLM), "serve", str(directory), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--seed", "0", "--enforce-eager", "--no-enable-chunked-prefill",
            "--kv-cache-memory-bytes", str(CPU_DEFAULTS["kv_cache_memory_bytes"])]  # fmt: skip


def wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vllm serve exited {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as answer:
                if json.loads(answer.read()).get("data"):
                    return
        except OSError:
            pass
        time.sleep(2)
    pytest.fail(f"vllm serve did not answer in {START_S} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """(API base URL, served directory) of a running ``vllm serve``; stopped afterwards."""
    from cdscope.core.models.loading import embedded_model_dir

    directory, _ = embedded_model_dir()
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "vllm.log"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log, "w") as out:
        process = subprocess.Popen(serve_command(directory, port), stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(url, process, log)
        yield url, directory
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_eval_against_vllm_serve(served, tmp_path: Path) -> None:
    url, directory = served
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    runner = CliRunner()
    out = tmp_path / "served"
    result = runner.invoke(app, [str(a) for a in ["eval", "--endpoint", url, "--tasks", tasks,
                                                  *SETTINGS, "--out", out]])  # fmt: skip
    assert result.exit_code == 0, result.output
    samples, meta = read_parquet(out / "samples.parquet")
    assert len(samples) == 5 * 2 and set(samples["model"]) == {str(directory)}
    assert samples["completion"].str.len().sum() > 0
    served_model = meta["models"][0]["engine"]["served_model"]
    assert served_model["root"] == str(directory) and served_model["max_model_len"] > 0
    assert set(pd.read_parquet(out / "passk.parquet")["k"]) == {1, 2}
    if importlib.util.find_spec("vllm") is None:
        return  # the main environment: the client against a real server is what it checks
    local = tmp_path / "in-process"
    result = runner.invoke(app, [str(a) for a in ["eval", "--backend", "vllm", "--tasks", tasks,
                                                  *SETTINGS, "--out", local]])  # fmt: skip
    assert result.exit_code == 0, result.output
    keys = ["problem_id", "sample"]
    a = samples.sort_values(keys)["completion"].tolist()
    b = pd.read_parquet(local / "samples.parquet").sort_values(keys)["completion"].tolist()
    same = sum(x == y for x, y in zip(a, b, strict=True))
    print(f"served == in-process: {same} of {len(a)} completions")
    assert same >= 9, list(zip(a, b, strict=True))  # measured 10 of 10; 1 may part on a tie
