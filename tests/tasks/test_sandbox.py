"""The code sandbox: containment (the host is unaffected) and basics; verdict attacks are in
tests/tasks/test_verifier_attacks.py.

Attacks run twice where it is safe: with every layer, and with the in-process audit hook
switched off, so the OS layers underneath (unprivileged user, network namespace,
rlimits) are shown to hold on their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cdscope.errors import CdscopeError
from cdscope.tasks import Task, verify
from cdscope.tasks.sandbox import layers as sb
from cdscope.tasks.sandbox import run_sandboxed, sandbox_available, sandbox_layers

pytestmark = pytest.mark.skipif(not sandbox_available()[0], reason="no sandbox on this machine")
LAYERS = sandbox_layers()
# Without the hook, only an unprivileged child cannot write our files or signal us.
HOOK_MODES = [True, False] if LAYERS is not None and LAYERS.drop_user else [True]
TIMEOUT = 2.0


def run(program: str, audit_hook: bool = True, timeout: float = TIMEOUT):
    return run_sandboxed(program, timeout=timeout, audit_hook=audit_hook)


def test_available_and_describes_its_layers() -> None:
    ok, description = sandbox_available()
    assert ok and "audit hook" in description and "rlimits" in description


def test_runs_a_program_in_a_fresh_scrubbed_directory(monkeypatch) -> None:
    monkeypatch.setenv("CDSCOPE_TEST_SECRET", "hunter2")
    program = (
        "import os, sys\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "print(os.getcwd()); print(sorted(os.environ)); print(sys.flags.isolated)\n"
    )
    result = run(program)
    assert result.completed and result.returncode == 0 and not result.timed_out
    cwd, env, isolated = result.stdout.split("\n")[:3]
    assert "hunter2" not in result.stdout and "CDSCOPE_TEST_SECRET" not in env
    assert set(eval(env)) <= {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}
    assert isolated == "1"
    assert not os.path.exists(cwd)  # the temporary directory is removed afterwards


@pytest.mark.parametrize("audit_hook", HOOK_MODES)
def test_infinite_loop_times_out(audit_hook: bool) -> None:
    start = time.perf_counter()
    result = run("while True:\n    pass\n", audit_hook)
    assert result.timed_out and not result.completed
    assert time.perf_counter() - start < TIMEOUT + 1.5


@pytest.mark.parametrize("audit_hook", HOOK_MODES)
def test_fork_bomb_is_contained(audit_hook: bool) -> None:
    result = run("import os\nwhile True:\n    os.fork()\n", audit_hook)
    assert not result.completed
    assert not result.timed_out  # refused at the first fork, not stopped by the clock


@pytest.mark.parametrize("audit_hook", HOOK_MODES)
@pytest.mark.parametrize(
    "program", ["x = bytearray(10**11)\n", "x = []\nwhile True:\n    x.append(bytearray(10**6))\n"]
)
def test_huge_allocations_fail(program: str, audit_hook: bool) -> None:
    result = run(program, audit_hook)
    assert not result.completed and "MemoryError" in result.error


@pytest.mark.parametrize("audit_hook", HOOK_MODES)
def test_writing_outside_the_work_dir_is_refused(tmp_path, audit_hook: bool) -> None:
    target = tmp_path / "pwned.txt"
    result = run(f"open({str(target)!r}, 'w').write('x')\n", audit_hook)
    # PermissionError (hook, or not our file), or FileNotFoundError (private /tmp)
    assert not result.completed and "Error" in result.error
    assert not target.exists()


@pytest.mark.skipif(not (LAYERS and LAYERS.mount), reason="no mount namespace here")
def test_minimal_root_hides_the_host_and_is_read_only() -> None:
    """Without the audit hook, the mount layer alone: only the interpreter's system dirs
    are there (no repository, task files, home, /proc, /etc), and nothing but the work
    dir can be written."""
    repo = str(Path(__file__).resolve().parents[2])
    program = (
        "import os\n"
        "print(sorted(os.listdir('/')))\n"
        f"print([os.path.exists(p) for p in ({repo!r}, {str(Path.home())!r}, '/proc/self', '/etc')])\n"
        f"open({sb.MOUNT_WORKDIR + '/ok'!r}, 'w').write('x')\n"
        "open('/cdscope-sandbox-test', 'w').write('x')\n"
    )
    result = run(program, audit_hook=False)
    assert not result.completed and "Read-only file system" in result.error
    listing, visible = result.stdout.splitlines()[:2]
    assert set(eval(listing)) <= {
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "dev",
        sb.MOUNT_WORKDIR[1:],
    }
    assert eval(visible) == [False, False, False, False]
    assert not Path("/cdscope-sandbox-test").exists()


@pytest.mark.skipif(not (LAYERS and LAYERS.mount), reason="no mount namespace here")
def test_task_data_inside_the_interpreter_prefix_is_masked(monkeypatch) -> None:
    """cdscope installed where the minimal root binds it (under /usr, or inside the
    interpreter's prefix as a wheel in a venv is): its task data is still unreadable."""
    prefix = Path(sb.sandbox_layers().interpreter).absolute().parents[1]
    if not os.access(prefix, os.W_OK):
        pytest.skip(f"cannot write into the interpreter's prefix {prefix}")
    data = Path(tempfile.mkdtemp(prefix="cdscope-test-tasks-", dir=prefix))
    try:
        (data / "code.jsonl").write_text('{"tests": "the secret answers"}\n')
        monkeypatch.setenv("CDSCOPE_TASKS", str(data))
        program = (
            "import os\n"
            f"print(os.path.isdir({str(data)!r}), os.listdir({str(data)!r}))\n"
            f"open({str(data / 'code.jsonl')!r}).read()\n"
        )
        result = run(program, audit_hook=False)
        assert not result.completed and "No such file" in result.error
        assert result.stdout.splitlines()[0] == "True []"  # an empty, read-only mask
    finally:
        shutil.rmtree(data)


def _world_writable_dir() -> Path:
    """A fresh 1777 directory in /tmp: writable by nobody, like /tmp itself."""
    target = Path(tempfile.mkdtemp(prefix="cdscope-attack-", dir="/tmp"))
    target.chmod(0o1777)
    return target


def _escapes(target: Path) -> dict[str, str]:
    """Writes into ``target`` that a lexical path check lets through (issue #13, finding 3)."""
    name = target.name
    return {
        "dir_fd open": (
            "import os\n"
            f"fd = os.open({str(target)!r}, os.O_RDONLY)\n"
            "os.close(os.open('pwned', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\n"
        ),
        "dir_fd mkdir": (
            f"import os\nfd = os.open({str(target)!r}, os.O_RDONLY)\nos.mkdir('pwned', dir_fd=fd)\n"
        ),
        "symlink then ..": (
            f"import os\nos.symlink('.', 'here')\nopen('here/../{name}/pwned', 'w').write('x')\n"
        ),
        "symlink chain": (
            "import os\n"
            "os.mkdir('d')\n"
            "os.symlink('d/..', 'up0')\n"
            "os.symlink('up0', 'up1')\n"
            f"open('up1/../{name}/pwned', 'w').write('x')\n"
        ),
        "rename through a symlink": (
            "import os\n"
            "open('f', 'w').write('x')\n"
            "os.symlink('.', 'here')\n"
            f"os.rename('f', 'here/../{name}/pwned')\n"
        ),
        "opener with dir_fd": (
            "import os\n"
            f"fd = os.open({str(target)!r}, os.O_RDONLY)\n"
            "open('pwned', 'w', opener=lambda p, f: os.open(p, f, dir_fd=fd)).write('x')\n"
        ),
    }


def test_fallback_write_check_holds_against_dir_fd_and_symlinks() -> None:
    """Where no mount layer isolates the work dir (the fallbacks), the audit hook resolves
    symlinks and refuses directory descriptors: every escape fails."""
    target = _world_writable_dir()
    try:
        tried = 0
        for drop_user, namespaces, mount in sb._candidates():
            if mount:
                continue
            layers = sb.Layers(sb.sandbox_layers().interpreter, drop_user, namespaces, mount)  # type: ignore[union-attr]
            if not sb._try_layers(layers):
                continue
            tried += 1
            for attack, program in _escapes(target).items():
                result = sb._run(program, layers, timeout=TIMEOUT, memory_mb=512, audit_hook=True)
                assert not result.completed and "sandbox:" in result.error, (attack, result.error)
                assert not (target / "pwned").exists(), (layers.describe(), attack)
        assert tried
    finally:
        shutil.rmtree(target, ignore_errors=True)


@pytest.mark.parametrize("audit_hook", HOOK_MODES)
def test_os_system_is_refused(tmp_path, audit_hook: bool) -> None:
    target = tmp_path / "touched"
    result = run(f"import os\nassert os.system('touch {target}') == 0\n", audit_hook)
    assert not result.completed
    assert not target.exists()


def test_subprocess_and_exec_are_refused(tmp_path) -> None:
    target = tmp_path / "touched"
    for program in (
        f"import subprocess\nsubprocess.run(['touch', '{target}'])\n",
        f"import os\nos.execv('/usr/bin/touch', ['touch', '{target}'])\n",
        f"import os\nos.posix_spawn('/usr/bin/touch', ['touch', '{target}'], {{}})\n",
    ):
        result = run(program)
        assert not result.completed and "sandbox:" in result.error
    assert not target.exists()


@pytest.mark.parametrize("audit_hook", HOOK_MODES if LAYERS and LAYERS.namespaces else [True])
def test_network_is_unreachable(audit_hook: bool) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(TIMEOUT + 1)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # timeout or closed: nobody connected
            accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    program = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "s.sendall(b'exfiltrate')\n"
    )
    result = run(program, audit_hook)
    server.close()
    thread.join()
    assert not result.completed
    assert accepted == []


@pytest.mark.parametrize("audit_hook", HOOK_MODES)
def test_killing_the_parent_fails_and_we_survive(audit_hook: bool) -> None:
    """By our real pid: refused (hook), not permitted (nobody), or no such process (the
    PID namespace hides us)."""
    program = f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\n"
    result = run(program, audit_hook)
    assert not result.completed
    assert "PermissionError" in result.error or "ProcessLookupError" in result.error
    os.kill(os.getpid(), 0)  # still alive


def test_early_exit_with_status_zero_does_not_count_as_success() -> None:
    for program in (
        "import os\nos._exit(0)\n",
        "raise SystemExit(0)\n",
        "import sys\nsys.exit()\n",
    ):
        result = run(program)
        assert not result.completed


def test_output_is_capped() -> None:
    result = run("print('x' * 10**8)\n")
    assert not result.completed and len(result.stdout) <= sb.MAX_OUTPUT_BYTES


def test_refuses_to_run_without_a_sandbox(monkeypatch) -> None:
    monkeypatch.setattr(sb, "_detect", lambda: (None, "no way to contain code here"))
    assert sandbox_available() == (False, "no way to contain code here")
    with pytest.raises(CdscopeError, match="refusing to run generated code"):
        run_sandboxed("print(1)", timeout=1)
    task = Task(
        "c/1", "code", "def f():\n", "code", tests="def check(c):\n    pass\n", entry_point="f"
    )
    with pytest.raises(CdscopeError, match="refusing"):
        verify(task, "    return 1\n")


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(CdscopeError, match="timeout must be positive"):
        run_sandboxed("pass", timeout=0)
    with pytest.raises(CdscopeError, match="memory_mb"):
        run_sandboxed("pass", timeout=1, memory_mb=1)


def test_every_fallback_configuration_runs_and_contains(tmp_path) -> None:
    """The weaker configurations (used where the OS allows less) still work and hold."""
    target = tmp_path / "pwned"
    working = []
    for drop_user, namespaces, mount in sb._candidates():
        for interpreter in sb._interpreters():
            layers = sb.Layers(interpreter, drop_user, namespaces, mount)
            if not sb._try_layers(layers):
                continue
            working.append(layers)
            ok = sb._run("print(6 * 7)\n", layers, timeout=TIMEOUT, memory_mb=512, audit_hook=True)
            assert ok.completed and ok.stdout.strip() == "42"
            for attack in (
                f"import os\nos.system('touch {target}')\n",
                f"open({str(target)!r}, 'w').write('x')\n",
                "import os\nos._exit(0)\n",
            ):
                bad = sb._run(attack, layers, timeout=TIMEOUT, memory_mb=512, audit_hook=True)
                assert not bad.completed, (layers.describe(), attack)
            break
    assert working and working[0] == sb.sandbox_layers()  # the strongest one is chosen
    assert not target.exists()
