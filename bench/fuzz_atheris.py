"""Coverage-guided fuzzing (atheris) of everything that reads bytes from a peer or a ledger.

Not part of the test suite (hypothesis covers the same entry points there, in
seconds); this runs for as long as you give it:

    pip install atheris
    python bench/fuzz_atheris.py -max_total_time=120 -rss_limit_mb=1024

One input is a byte string, read as a viewer's or a run's stream: split into
lines (the wire's splitter, 64 KiB limit), each line parsed as a command,
checked as a TCP token line, decoded as a record, folded into the viewer's
state, and, at the end, the records run through the rules and ``report``.
Any exception other than the documented ProtocolError/DecodeError is a
crash; the state must stay bounded across all inputs.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import atheris

with atheris.instrument_imports():
    from tuiwatch.analysis.report import as_text, summarize
    from tuiwatch.ledger.codec import DecodeError, decode
    from tuiwatch.rules import Diagnosis
    from tuiwatch.viewer.state import MAX_ALERTS, MAX_METRICS, RunState
    from tuiwatch.wire.protocol import LineSplitter, ProtocolError, parse_command
    from tuiwatch.wire.tcp import could_be_hello, field_of, hello_nonce, proof_holds

STATE = RunState()  # one state across every input: it must stay bounded


def one_input(data: bytes) -> None:
    could_be_hello(data)
    if hello_nonce(data) is not None:
        proof_holds(field_of(data, "proof"), "f" * 64, "viewer", "a" * 32, "b" * 32)
    splitter = LineSplitter()
    try:
        lines = splitter.feed(data)
    except ProtocolError:
        return
    stream: list[dict[str, Any]] = []
    for line in lines:
        with contextlib.suppress(ProtocolError):
            parse_command(line)
        try:
            record = decode(line)
        except DecodeError:
            continue
        stream.append(record)
        STATE.apply(record)
    if stream:
        Diagnosis().run(stream)
        as_text(summarize(stream))
    assert len(STATE.alerts) <= MAX_ALERTS
    assert len(STATE.metrics) <= MAX_METRICS


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
