"""Dumps (SPEC §7): what was in hand when a rule fired, saved so the failure can be replayed.

``dumps/<step>-<reason>/`` in the run directory holds:

- ``dump.json``: reason, step, the alert, the batch's sample ids, the
  environment (versions, argv, seed, determinism flags) and which files exist;
- ``batch.pt``: the batch exactly as the loader yielded it (tensors on the CPU);
- ``records.jsonl``: the last ledger records up to the one that fired;
- ``weights.pt``: the model's state dict, only for ``nonfinite`` under
  ``on_nonfinite="stop"``, where the bad update was never applied;
- ``cuda_memory.txt``: ``torch.cuda.memory_summary()`` when CUDA is in use.

A dump is written into a hidden temporary directory and renamed into place,
so a crash never leaves a half-written dump under its final name.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from tuiwatch.errors import TuiwatchError
from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.reader import read_ledger, read_small
from tuiwatch.ledger.records import AlertRecord, Record
from tuiwatch.publisher.atomic import Directory
from tuiwatch.publisher.checkpoints import Checkpoint, load_checkpoint
from tuiwatch.publisher.environment import environment
from tuiwatch.publisher.nested import array_as_tensor, fields_of, is_graph_data, tensors

DUMP_REASONS = ("nonfinite", "oom", "loss-spike")

# Batches kept (by reference, no copy) so that a dump written a few steps after
# its step, on the publisher thread, still has the tensors: at most this many,
# and no more bytes than the budget (always the latest one). The publisher thread
# is woken before a batch whose record it has not diagnosed (less DUMP_LAG: a
# loss spike is judged `confirm` steps after its own) would leave.
RECENT_BATCHES = 256
RECENT_BATCH_BYTES = 64 << 20
# What a batch whose size is not known counts for (an object not looked into, a part not read): as a large one, so
# that at most 16 of them are held, where 256 were whatever they held.
UNSIZED_BATCH_BYTES = RECENT_BATCH_BYTES // 16
DUMP_LAG = 8


class KeptBatch(NamedTuple):
    step: int
    batch: Any
    ids: list[int] | None
    nbytes: int


class RecentBatches:
    """The last batches by reference. Written by the training thread, read by the publisher thread's dumps."""

    def __init__(self, count: int = RECENT_BATCHES, max_bytes: int = RECENT_BATCH_BYTES):
        self.count, self.max_bytes = count, max_bytes
        self._kept: deque[KeptBatch] = deque()
        self._bytes = 0

    def keep(self, kept: KeptBatch) -> int:
        """Keep ``kept``, the oldest out past the count or the bytes; how many batches are kept now."""
        self._kept.append(kept)
        self._bytes += kept.nbytes
        while len(self._kept) > 1 and (len(self._kept) > self.count or self._bytes > self.max_bytes):
            self._bytes -= self._kept.popleft().nbytes
        return len(self._kept)

    def forget(self, step: int) -> None:
        """Drop the newest batches if they are ``step``'s (a step undone: its number goes to the next one)."""
        while self._kept and self._kept[-1].step == step:
            self._bytes -= self._kept.pop().nbytes

    def find(self, step: int) -> KeptBatch | None:
        # list() copies the deque in one call, which the GIL makes safe against the training thread's appends.
        return next((k for k in list(self._kept) if k.step == step), None)


@dataclass
class Dump:
    """A dump read back by :func:`load_dump`: plain objects, tensors on the CPU."""

    path: Path
    reason: str
    step: int
    alert: Record | None
    batch: Any
    batch_ids: list[int] | None
    records: list[Record]
    env: dict[str, Any]
    weights: dict[str, torch.Tensor] | None = None
    cuda_memory: str | None = None
    files: list[str] = field(default_factory=list)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):  # named tuples too: a plain tuple loads back without their class
        return tuple(_to_cpu(v) for v in obj)
    if isinstance(obj, Mapping):  # a dict, and what is not one: a Hugging Face BatchEncoding, a TensorDict
        return {k: _to_cpu(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, int | float | str | bool):
        return obj
    if (named := fields_of(obj)) is not None:  # a batch class of one's own: a dict (weights_only loads no class)
        return _to_cpu(named)
    if (array := array_as_tensor(obj)) is not None:  # a collate's output left as numpy: its numbers, not its text
        return array
    return repr(obj)  # what weights_only loading cannot take back is kept as text


def nonfinite_samples(batch: Any, batch_ids: list[int] | None) -> list[int] | None:
    """The ids of the samples whose floating tensors hold NaN/inf (rows along the batch dimension)."""
    if batch_ids is None:
        return None
    if is_graph_data(type(batch)):
        return _nonfinite_graphs(batch, batch_ids)
    bad = torch.zeros(len(batch_ids), dtype=torch.bool)
    for t in tensors(batch, arrays=True):
        if t.is_floating_point() and t.dim() and t.shape[0] == len(batch_ids):
            bad |= _bad_rows(t)
    return [batch_ids[i] for i in bad.nonzero().flatten().tolist()]


def _bad_rows(t: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(t.detach()).reshape(t.shape[0], -1).all(dim=1).cpu()


def _nonfinite_graphs(batch: Any, batch_ids: list[int]) -> list[int] | None:
    """The ids of the graphs of a PyTorch Geometric ``Batch`` whose features hold NaN/inf: a node's row belongs to
    the graph its ``batch`` entry names, an edge's to its source node's graph, a row of a graph-level tensor to
    that graph (which rows are nodes' and which edges' as PyG reads its own keys). None where the batch does not
    say which graph a row is of."""
    try:
        graph_of_node = batch.batch.detach().cpu()
        edges = batch.edge_index.detach().cpu()
        graph_of_edge = graph_of_node[edges[0]]
        bad = torch.zeros(len(batch_ids), dtype=torch.bool)
        for name, t in batch.to_dict().items():
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or not t.dim():
                continue
            rows = _bad_rows(t)
            if not rows.any():
                continue
            if batch.is_node_attr(name):  # (PyG's own reading: by the key and the row count)
                bad[graph_of_node[rows]] = True
            elif batch.is_edge_attr(name):
                bad[graph_of_edge[rows]] = True
            elif t.shape[0] == len(batch_ids):
                bad |= rows
            else:
                return None
        return [batch_ids[i] for i in bad.nonzero().flatten().tolist()]
    except Exception:  # not a Batch of graphs (one graph, a neighbour loader's sample): which is not known
        return None


def write_dump(
    run_dir: Directory,
    *,
    step: int,
    reason: str,
    alert: Record | None,
    batch: Any,
    batch_ids: list[int] | None,
    records: Iterable[Record],
    seed: int | None,
    weights: dict[str, torch.Tensor] | None = None,
    nonfinite_ids: list[int] | None = None,
) -> Path:
    """Write ``dumps/<step>-<reason>/`` in ``run_dir`` atomically and return its path."""
    with run_dir.sub("dumps") as parent:
        final = f"{step}-{reason}"
        n = 1
        while parent.exists(final):
            n += 1
            final = f"{step}-{reason}-{n}"
        tmp = f".tmp-{final}-{os.getpid()}"
        parent.remove(tmp)
        try:
            # A fresh name: the mkdir fails rather than follow anything planted there.
            with parent.sub(tmp) as out:
                files = ["dump.json", "records.jsonl"]
                if batch is not None:
                    with out.create("batch.pt") as f:
                        torch.save(_to_cpu(batch), f)
                    files.append("batch.pt")
                if weights is not None:
                    with out.create("weights.pt") as f:
                        torch.save({k: v.detach().cpu() for k, v in weights.items()}, f)
                    files.append("weights.pt")
                if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
                    out.write("cuda_memory.txt", torch.cuda.memory_summary().encode())
                    files.append("cuda_memory.txt")
                out.write("records.jsonl", b"".join(encode(r) for r in records))
                meta = {
                    "reason": reason,
                    "step": step,
                    "alert": alert,
                    "batch_ids": batch_ids,
                    "nonfinite_sample_ids": (
                        nonfinite_ids if nonfinite_ids is not None else nonfinite_samples(batch, batch_ids)
                    ),
                    "env": environment(seed),
                    "files": sorted(files),
                }
                out.write("dump.json", json.dumps(meta, indent=1, default=repr).encode())
                for name in files:
                    out.sync(name)
                out.sync()
            parent.move_into_place(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                parent.remove(tmp)
            raise
        return parent.where() / final


def load_dump(path: str | os.PathLike[str]) -> Dump | Checkpoint:
    """Read a dump directory back (batch, ids, last records, environment, weights), or a checkpoint file."""
    root = Path(path)
    if root.is_file():
        return load_checkpoint(root)
    meta_path = root / "dump.json"
    if not meta_path.is_file():
        raise TuiwatchError(
            f"{root} is not a tuiwatch dump (no dump.json): give a runs/<run>/dumps/<step>-<reason>/ "
            "or a runs/<run>/checkpoints/step-<N>.pt"
        )
    try:
        meta = json.loads(read_small(meta_path))  # bounded: a dump may be someone else's
    except (ValueError, RecursionError) as exc:
        raise TuiwatchError(f"cannot read {meta_path}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(meta, dict):
        raise TuiwatchError(f"cannot read {meta_path}: not a JSON object")
    step = meta.get("step")
    files = [str(name) for name in meta.get("files") or [] if isinstance(name, str)]

    def tensors(name: str) -> Any:
        if name not in files:
            return None
        # weights_only: a dump may come from someone else's run; nothing in it runs code on load.
        return torch.load(root / name, map_location="cpu", weights_only=True)

    memory = root / "cuda_memory.txt"
    return Dump(
        path=root,
        reason=str(meta.get("reason")),
        step=step if isinstance(step, int) else -1,
        alert=meta.get("alert"),
        batch=tensors("batch.pt"),
        batch_ids=meta.get("batch_ids"),
        records=list(read_ledger(root / "records.jsonl")) if "records.jsonl" in files else [],
        env=dict(meta.get("env") or {}),
        weights=tensors("weights.pt"),
        cuda_memory=read_small(memory).decode(errors="replace") if memory.is_file() else None,
        files=files,
    )


class DumpWriter:
    """Writes the dumps that alerts call for (publisher thread) and those a viewer asks for (training thread).

    The training thread hands it two things, each before the moment the
    publisher thread needs it: the batches it keeps (:class:`RecentBatches`,
    by reference) and, at a non-finite stop, the last healthy weights
    (:meth:`hold_weights`, just before it waits in ``Pipeline.sync``). After
    that wait, :meth:`written` says where the dump went.
    """

    def __init__(self, run_dir: Directory | None, seed: int | None, recent: RecentBatches):
        self.run_dir = run_dir
        self.seed = seed
        self.recent = recent
        self._weights: tuple[int, dict[str, torch.Tensor]] | None = None
        self._last: tuple[int, str, str] | None = None  # (step, reason, path) of the last alert's dump

    def hold_weights(self, step: int, weights: dict[str, torch.Tensor]) -> None:
        self._weights = (step, weights)
        self._last = None

    def written(self, step: int, reason: str) -> str | None:
        last = self._last
        return last[2] if last is not None and last[:2] == (step, reason) else None

    def on_alert(self, found: AlertRecord, records: list[Record]) -> str | None:
        """Publisher thread: the dump an alert calls for, written; its path, or None if it calls for none."""
        reason, step = found["rule"], found["step"]
        if reason not in DUMP_REASONS or found["severity"] == "info" or self.run_dir is None or step is None:
            return None
        kept = self.recent.find(step)
        batch, ids = (kept.batch, kept.ids) if kept is not None else (None, None)
        if ids is None:
            ids = next(
                (r.get("batch_ids") for r in reversed(records) if r.get("kind") == "step" and r.get("step") == step),
                None,
            )
        held = self._weights
        weights = held[1] if held is not None and held[0] == step and reason == "nonfinite" else None
        bad = nonfinite_samples(batch, ids) if reason == "nonfinite" and batch is not None else None
        if bad is not None:
            # The alert carries them too: a viewer over SSH shows which samples, without opening the dump.
            found["evidence"]["nonfinite_sample_ids"] = bad[:64]
        path = str(
            write_dump(
                self.run_dir,
                step=step,
                reason=reason,
                alert=found,
                batch=batch,
                batch_ids=ids,
                records=records,
                seed=self.seed,
                weights=weights,
                nonfinite_ids=bad,
            )
        )
        self._last = (step, reason, path)
        return path

    def on_request(self, reason: str, last: KeptBatch | None, step: int, records: list[Record]) -> str:
        """Training thread, at a step boundary: a dump of the current batch for a viewer's ``c`` or ``d``."""
        assert self.run_dir is not None
        if last is not None:
            step = last.step
        path = write_dump(
            self.run_dir,
            step=step,
            reason=reason,
            alert=None,
            batch=last.batch if last else None,
            batch_ids=last.ids if last else None,
            records=records,
            seed=self.seed,
        )
        return str(path)
