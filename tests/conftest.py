from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import STARTED, kill_tree
from .ssh_helpers import Sshd, TwoHosts, ssh_command, start_sshd

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A suite started as a background job of a shell without job control (`cmd &` in a script) inherits SIGINT
    # ignored, and so would every training process it starts: Python then installs no KeyboardInterrupt, and the
    # tests that press Ctrl-C on a run would wait for nothing. A handler here becomes the default in each child.
    signal.signal(signal.SIGINT, signal.default_int_handler)

# This process's temporaries (pytest's tmp_path among them) stay where they are: tempfile reads TMPDIR once, and
# each test sets it for the processes it starts (socket_dir below).
tempfile.gettempdir()


@pytest.fixture(autouse=True)
def socket_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private socket directory for every test, its Watches and the processes it starts: a test's runs never land
    among the sockets of whoever runs the suite (their `tuiwatch ls` listed the tests' runs, and a test that lists
    runs connected to their live ones). Declared before the fixture that kills a test's training processes, so it
    is taken down after them.

    Short path: a Unix socket path must fit in 108 bytes.
    """
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    os.chmod(path, 0o700)
    monkeypatch.setenv("TUIWATCH_DIR", str(path))
    # The processes a test starts make their temporaries in a directory of the test's own, removed after it:
    # torchrun left a torchelastic_* log directory in /tmp at every launch, ~20 a run of the suite.
    scratch = tempfile.mkdtemp(prefix="twt-", dir="/tmp")
    monkeypatch.setenv("TMPDIR", scratch)
    yield path
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_user_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The viewer's config file of whoever runs the tests (a light theme, fps 10) is not the tests' own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


@pytest.fixture(autouse=True)
def no_training_left_behind() -> Iterator[None]:
    """A test that fails midway must not leave a (possibly paused) training process running."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            kill_tree(proc)


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def tmux(socket_dir: Path) -> Iterator[list[str]]:
    """A tmux server of the test's own (its own name: the last test's server may still be shutting down)."""
    server = ["tmux", "-L", f"tuiwatch-test-{os.getpid()}-{secrets.token_hex(4)}", "-f", "/dev/null"]
    yield server
    subprocess.run([*server, "kill-server"], capture_output=True)


@pytest.fixture
def sshd(tmp_path: Path, socket_dir: Path) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 with a throwaway host key and user key."""
    proc, port, key = start_sshd(tmp_path / "ssh")
    yield Sshd("127.0.0.1", ssh_command(port, key), f"env TUIWATCH_DIR={socket_dir} {sys.executable} -m tuiwatch")
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[TwoHosts]:
    """Two "hosts" for one job: two sshd on loopback, each with a socket directory of its own (sshd's
    SetEnv), reached as h1 and h2 through an ssh config of the test's."""
    dirs, procs, lines = [], [], []
    for i in (1, 2):
        sockets = Path(tempfile.mkdtemp(prefix=f"tw-h{i}-", dir="/tmp"))
        os.chmod(sockets, 0o700)
        proc, port, key = start_sshd(tmp_path / f"ssh{i}", f"SetEnv TUIWATCH_DIR={sockets}\n")
        dirs.append(sockets)
        procs.append(proc)
        lines.append(
            f"Host h{i}\n  HostName 127.0.0.1\n  Port {port}\n  IdentityFile {key}\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n  ServerAliveInterval 2\n"
        )
    config = tmp_path / "ssh_config"
    config.write_text("".join(lines))
    yield TwoHosts(f"ssh -F {config}", f"{sys.executable} -m tuiwatch", dirs)
    for proc in procs:
        proc.terminate()
        proc.wait(10)
    for sockets in dirs:
        for child in sockets.iterdir():
            child.unlink()
        sockets.rmdir()
