"""The optional TCP mode: off by default, loopback, a handshake proving the 0600 token both ways, HTTP dropped.

Real TCP connections to a real training process on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torch import nn

import tuiwatch
from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import encode
from tuiwatch.viewer.sources import TcpSource
from tuiwatch.wire.protocol import command_line, iter_records
from tuiwatch.wire.tcp import (
    AUTH_TIMEOUT_S,
    CHECK_ATTEMPTS,
    HandshakeInterrupted,
    TcpTarget,
    check_tcp_target,
    connect_tcp,
    exposure_warning,
    hello_line,
    new_nonce,
    parse_address,
    proof_holds,
    read_token_file,
    tcp_target,
)

from ..helpers import env_for, finish, ledger_file, records, start_training, wait_until
from ..viewer_helpers import RecordingApp, until

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

pytestmark = pytest.mark.integration  # real TCP connections to real trainings


def token_file_of(socket_dir: Path) -> Path:
    return wait_until(lambda: next(iter(socket_dir.glob("*.tcp")), None), what="the run's token file")


def unanswered(target: TcpTarget, payload: bytes, timeout: float = 2 * AUTH_TIMEOUT_S) -> bytes:
    """What the run sends back to a connection that sends ``payload`` (and then waits)."""
    with socket.create_connection((target.host, target.port), timeout=timeout) as sock:
        if payload:
            sock.sendall(payload)
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass  # closed with our bytes unread: a reset, and still nothing sent
        return received


def test_tcp_is_off_by_default_and_a_bad_address_is_refused_up_front(run_root: Path, socket_dir: Path):
    model = nn.Linear(2, 1)
    watch = tuiwatch.Watch(model, run_dir=run_root)
    watch.close()
    assert watch.run_record["tcp"] is None
    assert list(socket_dir.glob("*.tcp")) == []
    with pytest.raises(TuiwatchError, match=r"^bad TCP address 'gpu-box': expected HOST:PORT"):
        tuiwatch.Watch(model, run_dir=run_root, tcp="gpu-box")
    with pytest.raises(TypeError, match="tcp must be False, True"):
        tuiwatch.Watch(model, run_dir=run_root, tcp=7777)  # type: ignore[arg-type]
    assert len(list(run_root.iterdir())) == 1  # the refused ones created nothing


def handshake_transcript(target: TcpTarget, viewer_proof: str | None) -> list[dict[str, object]]:
    """The lines the run sends to a peer that says hello and then ``viewer_proof`` (None: nothing more)."""
    with socket.create_connection((target.host, target.port), timeout=2 * AUTH_TIMEOUT_S) as sock:
        nonce = new_nonce()
        sock.sendall(hello_line(nonce))
        stream = iter_records(sock)
        challenge = next(stream)
        # The run proves it holds the token before it is asked to trust anyone.
        assert proof_holds(challenge["proof"], target.token, "run", nonce, str(challenge["nonce"]))
        if viewer_proof is not None:
            sock.sendall(encode({"proof": viewer_proof}))
        return [challenge, *stream]


def test_no_ledger_byte_without_the_handshake_and_the_token_never_on_the_wire(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--tcp", "on", "--steps", "100000", "--step-sleep", "0.005")
    path = token_file_of(socket_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    target = read_token_file(path)
    assert target.host == "127.0.0.1"  # loopback unless an address is given
    assert len(target.token) == 64

    # The token in clear (the old protocol), HTTP, TLS, no newline, silence: closed without one byte.
    assert unanswered(target, b'{"token": "' + target.token.encode() + b'"}\n') == b""
    assert unanswered(target, b"GET / HTTP/1.1\r\nHost: gpu-box\r\n\r\n") == b""
    assert unanswered(target, b"\x16\x03\x01\x02\x00\x01\x00") == b""  # a TLS ClientHello
    assert unanswered(target, b'{"hello": "' + b"a" * 600) == b""  # no newline within 512 bytes
    started = time.monotonic()
    assert unanswered(target, b"") == b""
    assert AUTH_TIMEOUT_S - 0.5 <= time.monotonic() - started < 2 * AUTH_TIMEOUT_S

    # A hello gets the run's proof and nothing of the ledger: then a refusal for a wrong proof, a close for none.
    refused = handshake_transcript(target, "0" * 64)
    assert [sorted(line) for line in refused] == [["nonce", "proof"], ["refused"]]
    assert len(handshake_transcript(target, None)) == 1

    # The token: the ledger from its run record on, and commands work.
    sock, first = connect_tcp(target)
    with sock:
        stream = iter_records(sock, first=first)
        run = next(stream)
        assert run["kind"] == "run"
        assert run["tcp"] == f"127.0.0.1:{target.port}"
        assert target.token not in str(run)  # the ledger and its readers never see the token
        wait_until(lambda: next(r for r in stream if r["kind"] == "step"), what="a step over TCP")
        sock.sendall(command_line("stop", 41))
        reply = next(r for r in stream if r["kind"] == "action")
        assert (reply["id"], reply["action"], reply["ok"]) == (41, "stop", True)
    finish(proc)
    ledger = records(ledger_file(run_root))
    assert ledger[-1]["reason"] == "stopped"
    assert ledger[-1]["refused_peers"] == 7
    assert not path.exists()  # the token file goes with the run


class Impostor:
    """Whatever binds a run's port after the run ended: it answers every line with a fake run and alert."""

    FAKE = (
        b'{"kind": "run", "name": "impostor", "t": 1.0}\n'
        b'{"kind": "alert", "rule": "nonfinite", "severity": "critical", "step": 1, "message": "run rm -rf ~"}\n'
    )

    def __init__(self, port: int):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(8)
        self.received = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = self.listener.accept()
                with peer:
                    peer.settimeout(2)
                    with contextlib.suppress(OSError):
                        while data := peer.recv(4096):
                            self.received += data
                            peer.sendall(self.FAKE)

    def close(self) -> None:
        self.listener.close()


async def test_a_viewer_never_trusts_what_holds_the_port_after_the_run(run_root: Path, socket_dir: Path):
    watch = tuiwatch.Watch(nn.Linear(2, 1), run_dir=run_root, name="real", tcp=True)
    target = read_token_file(token_file_of(socket_dir))
    app = RecordingApp(TcpSource(target))
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.run.get("name") == "real", what="the real run")
        watch.close()
        await until(pilot, lambda: app.state.status == "finished", what="the run's end")
        impostor = Impostor(target.port)
        try:
            await until(pilot, lambda: any("did not prove" in n for n in app.notes), what="the impostor refused")
            assert app.state.run.get("name") == "real"  # nothing it sent was read
            assert not [a for a in app.state.alerts if "rm -rf" in a.message]
            sent = bytes(impostor.received)
            assert sent.startswith(b'{"hello":"tuiwatch-tcp-1","nonce":')
            assert target.token.encode() not in sent
            assert b"proof" not in sent  # the viewer stopped at the run's missing proof
        finally:
            impostor.close()


FLOOD_SCRIPT = """
import selectors, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
sel = selectors.DefaultSelector()
def connect():
    s = socket.create_connection((host, port))
    sel.register(s, selectors.EVENT_READ)
for _ in range(40):
    connect()
print("holding", flush=True)
sel.register(sys.stdin, selectors.EVENT_READ)
reopened = 0
while True:
    for key, _ in sel.select():
        if key.fileobj is sys.stdin:
            print("reopened", reopened, flush=True)
            sys.exit(0)
        if not key.fileobj.recv(1):  # the run closed it: take the seat again at once
            sel.unregister(key.fileobj)
            key.fileobj.close()
            connect()
            reopened += 1
"""


def test_silent_connections_of_another_user_cannot_lock_the_token_holder_out(run_root: Path, socket_dir: Path):
    if os.getuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to act as another user")
    watch = tuiwatch.Watch(nn.Linear(2, 1), run_dir=run_root, tcp=True)
    target = read_token_file(token_file_of(socket_dir))
    flood = subprocess.Popen(
        [*AS_NOBODY, "/usr/bin/python3", "-c", FLOOD_SCRIPT, target.host, str(target.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None
        assert flood.stdout.readline() == "holding\n"
        for _ in range(20):
            check_tcp_target(target)  # raises on any failure; retries a handshake cut by an eviction
        out, _ = flood.communicate("done\n", timeout=30)
        assert int(out.split()[-1]) >= 20  # each of ours evicted one of theirs, which came straight back
    finally:
        flood.kill()
        watch.close()
    assert records(ledger_file(run_root))[-1]["refused_peers"] >= 20


def test_a_handshake_reset_before_the_run_read_the_hello_is_an_eviction_and_is_tried_again():
    # On a loaded host the run can evict a connection whose hello has arrived but not been read yet; a socket
    # closed with unread bytes is reset, not ended, and the reset was reported as "cannot reach a run" at the
    # first try (the flood test failed so under load) instead of being tried again as an eviction.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    resets = []

    def evict_each() -> None:
        for _ in range(CHECK_ATTEMPTS):
            conn, _ = listener.accept()
            conn.recv(1, socket.MSG_PEEK)  # the hello has arrived, unread
            conn.close()  # with unread bytes: a reset
            resets.append(1)

    evicting = threading.Thread(target=evict_each, daemon=True)
    evicting.start()
    try:
        with pytest.raises(HandshakeInterrupted, match="closed the connection during the handshake"):
            check_tcp_target(TcpTarget("127.0.0.1", port, "0" * 64))
        evicting.join(timeout=10)
        assert len(resets) == CHECK_ATTEMPTS
    finally:
        listener.close()


def test_a_listener_other_hosts_can_reach_says_so(run_root: Path, capfd: pytest.CaptureFixture[str]):
    watch = tuiwatch.Watch(nn.Linear(2, 1), run_dir=run_root, name="wide", tcp="0.0.0.0:0")
    watch.close()
    lines = [line for line in capfd.readouterr().err.splitlines() if "reachable from other hosts" in line]
    assert lines == [
        f"tuiwatch: wide: TCP listener at {watch.tcp_address} is reachable from other hosts: the stream is not "
        "encrypted (only on a network you trust; otherwise attach over ssh)"
    ]
    assert exposure_warning("127.0.0.1", "x") is None
    assert exposure_warning("::1", "x") is None
    assert exposure_warning("localhost", "x") is None
    assert exposure_warning("gpu-box", "gpu-box:7") is not None


async def test_the_viewer_attaches_over_tcp(run_root: Path, socket_dir: Path):
    proc = start_training(run_root, socket_dir, "--tcp", "on", "--steps", "100000", "--step-sleep", "0.005")
    target = read_token_file(token_file_of(socket_dir))
    check_tcp_target(target)
    app = RecordingApp(TcpSource(target))
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.status == "live" and (app.state.step or 0) > 5, what="live steps")
        assert app.state.run["tcp"] == f"127.0.0.1:{target.port}"
        await pilot.press("s")
        await pilot.press("y")
        await until(pilot, lambda: app.state.status == "stopped", what="the run to stop")
    finish(proc)


def test_tcp_targets_and_their_one_line_errors(tmp_path: Path):
    good = tmp_path / "train.4242.tcp"
    good.write_text('{"address": "10.0.0.5:7777", "token": "abc"}')
    good.chmod(0o600)
    assert tcp_target(str(good), None) == TcpTarget("10.0.0.5", 7777, "abc")
    assert tcp_target(None, str(good)) == TcpTarget("10.0.0.5", 7777, "abc")
    assert tcp_target("tcp://gpu-box:7777", str(good)) == TcpTarget("gpu-box", 7777, "abc")
    assert tcp_target("resnet", None) is None
    assert tcp_target("gpu-box:resnet", None) is None
    assert tcp_target("gone.tcp", None) is None  # not a file here: a run name, for the usual lookup
    assert parse_address("[::1]:80") == ("::1", 80)
    assert parse_address("7777") == ("127.0.0.1", 7777)
    errors = {
        "needs --token-file": lambda: tcp_target("tcp://gpu-box:7777", None),
        "goes with a tcp://": lambda: tcp_target("resnet", str(good)),
        "bad TCP address 'gpu-box:http'": lambda: tcp_target("tcp://gpu-box:http", str(good)),
        "cannot read the token file": lambda: tcp_target(None, str(tmp_path / "gone.tcp")),
    }
    for message, call in errors.items():
        with pytest.raises(TuiwatchError, match=message):
            call()
    good.chmod(0o644)
    with pytest.raises(TuiwatchError, match=r"can be read by others \(mode 644\): chmod 600 it$"):
        read_token_file(good)
    good.write_text("not json")
    good.chmod(0o600)
    with pytest.raises(TuiwatchError, match="is not a tuiwatch token file"):
        read_token_file(good)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(TuiwatchError, match=rf"^cannot reach a run at 127.0.0.1:{port} \(.*\): is it running"):
        check_tcp_target(TcpTarget("127.0.0.1", port, "abc"), timeout=2)


def test_a_stale_token_file_is_removed_with_its_dead_run(socket_dir: Path, run_root: Path):
    dead = socket_dir / "old.999999999.tcp"
    dead.write_text("{}")
    mine = socket_dir / f"other.{os.getpid()}.tcp"
    mine.write_text("{}")
    watch = tuiwatch.Watch(nn.Linear(2, 1), run_dir=run_root)
    watch.close()
    assert not dead.exists()
    assert mine.exists()


def test_a_wrong_token_is_one_line_from_the_cli(run_root: Path, socket_dir: Path, tmp_path: Path):
    model = nn.Linear(2, 1)
    watch = tuiwatch.Watch(model, run_dir=run_root, tcp=True)
    try:
        copied = tmp_path / "copied.tcp"
        copied.write_text(f'{{"address": "{watch.tcp_address}", "token": "{"f" * 64}"}}')
        copied.chmod(0o600)
        out = subprocess.run(
            [sys.executable, "-m", "tuiwatch", "attach", "--token-file", str(copied)],
            env=env_for(socket_dir),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1
        assert out.stderr == (
            f"tuiwatch: error: what listens at {watch.tcp_address} did not prove it holds this token: the token "
            "file is from another run (each run writes a new one: copy it again), or the run ended and something "
            "else has its port\n"
        )
        check_tcp_target(read_token_file(next(socket_dir.glob("*.tcp"))))  # the right one is answered
    finally:
        watch.close()
