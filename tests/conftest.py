from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def socket_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private socket directory for this test, also used by in-process Watches.

    Short path: a Unix socket path must fit in 108 bytes.
    """
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    os.chmod(path, 0o700)
    monkeypatch.setenv("TUIWATCH_DIR", str(path))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    return tmp_path / "runs"
