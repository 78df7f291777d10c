"""``Watch``: the three lines a training loop adds (SPEC §2)."""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import torch

from tuiwatch._version import __version__
from tuiwatch.errors import NonFiniteError, StopRequested, TuiwatchError
from tuiwatch.ledger.codec import encode
from tuiwatch.ledger.reader import LEDGER_NAME
from tuiwatch.ledger.records import END_REASONS, RESERVED_METRIC_NAMES, SCHEMA, Record
from tuiwatch.ledger.socketdir import ensure_socket_dir, remove_stale_sockets, safe_name, socket_path
from tuiwatch.ledger.tcp import format_address, tcp_option
from tuiwatch.ledger.wire import Command, action_record
from tuiwatch.ledger.writer import FileLedger, LedgerStore, MemoryTail
from tuiwatch.publisher import process
from tuiwatch.publisher.checkpoints import (
    FORMAT,
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    restore_rng,
    rng_states,
    versions,
    write_checkpoint,
)
from tuiwatch.publisher.control import CommandQueue, CommandRefused
from tuiwatch.publisher.deferred import PendingDuration, defer, device_mark, resolve
from tuiwatch.publisher.dumps import DUMP_REASONS, write_dump
from tuiwatch.publisher.loader import iter_with_ids
from tuiwatch.publisher.measure import BatchInfo, finiteness_probe, first_tensor, total_norm
from tuiwatch.publisher.pipeline import Pipeline
from tuiwatch.publisher.seeding import last_seeding
from tuiwatch.publisher.steps import EvalState, StepState
from tuiwatch.rules import Diagnosis, RulesConfig

T = TypeVar("T")
ON_NONFINITE = ("stop", "skip", "warn")
STOP_MODES = ("flag", "raise")
# Batches kept (by reference, no copy) so that a dump written a few steps after
# its step, on the publisher thread, still has the tensors: at most this many,
# and no more bytes than the budget (always the latest one).
RECENT_BATCHES = 32
RECENT_BATCH_BYTES = 64 << 20
# How long the training thread waits for the ledger and the dump at a
# non-finite stop or an OOM (it is ending or failing anyway).
STOP_SYNC_S = 30.0
OOM_SYNC_S = 5.0


def _default_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else "python"
    return Path(argv0).stem or "python"


def _new_run_dir(root: Path, name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{safe_name(name)}-{stamp}"
    candidate, n = base, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
        except OSError as exc:
            raise TuiwatchError(
                f"cannot create the run directory {candidate}: {exc.strerror}; "
                "give Watch(run_dir=...) a writable directory, or run_dir=None for no ledger file"
            ) from None


def _rank_and_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except (ImportError, RuntimeError):
        pass  # no usable process group: the launcher's environment says
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _default_update_norm_every(param_count: int) -> int:
    # The update norm needs a copy of the parameters before the step: about
    # 20 µs on the tiny MLP and a full memory copy on a large model, so it is
    # sampled; every 10th optimizer step is plenty to see "no update".
    return 10 if param_count <= 10_000_000 else 100


def _default_param_norm_every(param_count: int) -> int:
    # A parameter norm reads every weight: ~8 µs on the tiny MLP, ~100 µs on a
    # 1M-parameter model on the CPU, so large models sample it.
    return 1 if param_count <= 100_000 else 10


class Watch:
    """Publishes one ledger record per training step; see SPEC §2 for the loop it expects.

    ``Watch(...)`` returns at once: a background thread owns the ledger file,
    the socket and the system sampler, and nothing on the training thread
    waits for a viewer, the disk or the device.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        name: str | None = None,
        scheduler: Any = None,
        scaler: Any = None,
        run_dir: str | Path | None = "runs",
        every: int = 1,
        on_nonfinite: str = "stop",
        seed: int | None = None,
        system: bool | float = True,
        update_norm_every: int | None = None,
        param_norm_every: int | None = None,
        rules: RulesConfig | None = None,
        queue_size: int = 10_000,
        viewer_stall_s: float = 5.0,
        stop: str = "flag",
        tcp: bool | str = False,
    ):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"tuiwatch.Watch needs a torch.nn.Module as model, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"tuiwatch.Watch needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {', '.join(ON_NONFINITE)}, got {on_nonfinite!r}")
        if stop not in STOP_MODES:
            raise ValueError(f"stop must be 'flag' (watch.should_stop) or 'raise' (StopRequested), got {stop!r}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        tcp_address = tcp_option(tcp)  # a bad address is refused before anything is created
        diagnosis = Diagnosis(rules)  # raises for an unknown rule id, before anything is created
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.name = name or _default_name()
        self.every = every
        self.on_nonfinite = on_nonfinite
        seeding = last_seeding()
        self.seed = seed if seed is not None or seeding is None else seeding["seed"]
        self.should_stop = False
        self.stop_mode = stop
        self._commands = CommandQueue()
        self._paused = False
        self._batch_index = 0  # batches drawn in the current epoch: the data position of a checkpoint
        self._epoch_rng: dict[str, Any] | None = None
        self._resume: Checkpoint | None = None
        self._last_batch: tuple[int, Any, list[int] | None] | None = None
        self._inert = False
        self._closed = False
        self._step = 0
        self._epoch = -1
        self._opt_steps = 0
        self._cur: StepState | None = None
        self._eval: EvalState | None = None
        self._last_boundary = time.perf_counter()
        self._before_update: list[torch.Tensor] | None = None
        self._param_cache: tuple[int, list[torch.Tensor]] = (-1, [])
        self._hooks: list[Any] = []
        self._recent_batches: deque[tuple[int, Any, list[int] | None, int]] = deque()
        self._recent_bytes = 0
        self._stopping_step: int | None = None  # the step whose non-finite stop waits for its dump
        self._last_dump: str | None = None
        self._oom_seen = 0  # id() of the last OOM recorded, so that each is recorded once
        self._classes_reported = False

        first = next(iter(model.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self._cuda = self.device.type == "cuda"
        param_count = sum(p.numel() for p in self._params())
        self.update_norm_every = update_norm_every or _default_update_norm_every(param_count)
        self.param_norm_every = param_norm_every or _default_param_norm_every(param_count)

        self.run_dir: Path | None = None
        store: LedgerStore
        if run_dir is not None:
            self.run_dir = _new_run_dir(Path(run_dir), self.name)
            store = FileLedger(self.run_dir / LEDGER_NAME)
        else:
            store = MemoryTail()
        self.ledger_path = store.path if isinstance(store, FileLedger) else None
        interval = (1.0 if system else None) if isinstance(system, bool) else float(system)
        self._pipeline = Pipeline(
            store,
            capacity=queue_size,
            system_interval_s=interval,
            cuda_device=self.device.index if self._cuda else None,
            diagnosis=diagnosis,
            on_alert=self._on_alert,
        )

        self.socket_path: Path | None = None
        socket_error = None
        try:
            directory = ensure_socket_dir()
            remove_stale_sockets(directory)
            wanted = socket_path(directory, self.name, os.getpid())
            self._pipeline.start_server(wanted, b"", self._on_command, stall_s=viewer_stall_s)
            self.socket_path = wanted
        except (TuiwatchError, OSError) as exc:
            socket_error = str(exc) if isinstance(exc, TuiwatchError) else f"cannot listen: {exc}"
            print(
                f"tuiwatch: no live socket for this run ({socket_error}); the ledger is still written", file=sys.stderr
            )
        self.tcp_address: str | None = None
        if tcp_address is not None and self._pipeline.server is not None:
            try:
                self.tcp_address = self._pipeline.server.listen_tcp(*tcp_address)
            except OSError as exc:
                print(f"tuiwatch: no TCP listener at {format_address(*tcp_address)} ({exc.strerror or exc}); "
                      "the Unix socket works", file=sys.stderr)  # fmt: skip

        self.run_record = self._make_run_record(param_count, socket_error)
        run_line = encode(self.run_record)
        store.append(run_line)
        if self._pipeline.server is not None:
            self._pipeline.server.run_line = run_line

        if optimizer is not None:
            self._hooks.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
            self._hooks.append(optimizer.register_step_post_hook(self._after_optimizer_step))
        # always_call: the hook also runs when the forward raises, which is how an OOM in it is seen.
        self._hooks.append(model.register_forward_hook(self._after_forward, always_call=True))
        self._pipeline.start()
        process.watches.add(self)
        process.install_hooks()

    # --- the loop -------------------------------------------------------------------

    def batches(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate over ``loader``, one step per batch: times the wait, records ids and shapes."""
        self._epoch += 1
        epoch = self._epoch
        resume, self._resume = self._resume, None
        if resume is not None and resume.epoch_rng is not None:
            _restore_epoch_rng(resume.epoch_rng, loader)  # the same shuffle as the epoch that was saved
        self._epoch_rng = _epoch_rng(loader)
        self._batch_index = 0
        it, recorder = iter_with_ids(loader)
        if resume is not None:
            self._fast_forward(it, recorder, resume)
        clock = time.perf_counter
        try:
            while True:
                t0 = clock()
                self._end_step(t0)
                if self._commands or self._paused:
                    self._at_boundary()
                    t0 = clock()  # a pause or a checkpoint is neither data wait nor compute
                try:
                    batch = next(it)
                except StopIteration:
                    return
                t1 = clock()
                self._batch_index += 1
                ids = recorder.pop() if recorder is not None else None
                if self._inert or self._closed:
                    yield batch
                    continue
                s = self._open_step(t1, at_boundary=True)
                s.epoch = epoch
                s.data_wait_s = t1 - t0
                s.batch_ids = ids
                self._last_batch = (s.step, batch, ids)
                if s.step % self.every == 0:
                    s.batch = BatchInfo(batch)
                    self._keep_batch(s.step, batch, ids, s.batch.nbytes)
                yield batch
        finally:
            self._end_step(clock())

    def _keep_batch(self, step: int, batch: Any, ids: list[int] | None, nbytes: int) -> None:
        kept = self._recent_batches
        kept.append((step, batch, ids, nbytes))
        self._recent_bytes += nbytes
        while len(kept) > 1 and (len(kept) > RECENT_BATCHES or self._recent_bytes > RECENT_BATCH_BYTES):
            self._recent_bytes -= kept.popleft()[3]

    def step(self) -> None:
        """Mark a step boundary in a loop that does not draw from :meth:`batches`."""
        now = time.perf_counter()
        self._end_step(now)
        if self._commands or self._paused:
            self._at_boundary()
            now = time.perf_counter()
        if not (self._inert or self._closed):
            self._open_step(now, at_boundary=True).epoch = max(self._epoch, 0)

    def log(self, **metrics: Any) -> None:
        """Record scalars for this step (or this validation); tensors stay on their device."""
        if self._inert or self._closed:
            return
        if self._eval is not None:
            target = self._eval.metrics
            self._eval.training = bool(self._eval.training) or self.model.training
        else:
            target = (self._cur or self._open_step(self._last_boundary)).metrics
        for key, value in metrics.items():
            if key in RESERVED_METRIC_NAMES:
                raise ValueError(f"tuiwatch: '{key}' is a field tuiwatch records itself; log it under another name")
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(
                        f"tuiwatch: log({key}=...) needs a scalar, got a tensor of shape {list(value.shape)}"
                    )
                target[key] = defer(value)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                target[key] = value
            else:
                raise TypeError(
                    f"tuiwatch: log({key}=...) needs a number or a scalar tensor, got {type(value).__name__}"
                )

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, **kwargs: Any) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the optimizer's parameters; records the pre-clip norm."""
        params = self._params()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type, **kwargs)
        if not (self._inert or self._closed):
            s = self._cur or self._open_step(self._last_boundary)
            s.grad_norm = norm
            s.clip_max_norm = float(max_norm)
        return norm

    @contextmanager
    def validation(self) -> Iterator[Watch]:
        """Logs inside this block form one ``eval`` record at the current step."""
        state = EvalState(step=max(self._step - 1, 0), epoch=max(self._epoch, 0))
        self._eval = state
        try:
            yield self
        finally:
            self._eval = None
            if state.training is None:
                state.training = self.model.training
            state.t_end = time.time()
            if state.metrics and not (self._inert or self._closed):
                self._pipeline.put(state)

    # --- step bookkeeping ------------------------------------------------------------

    def _open_step(self, start: float, *, at_boundary: bool = False) -> StepState:
        s = StepState(self._step, start)
        if at_boundary and self._cuda and not s.step % self.every:
            s.device_start = device_mark()
        self._step += 1
        self._cur = s
        self._last_boundary = start
        return s

    def _end_step(self, now: float) -> None:
        s = self._cur
        if s is None:
            return
        self._cur = None
        self._last_boundary = now
        if s.step % self.every and not s.step_forced:
            return
        if s.batch is None and not s.metrics and s.grad_norm is None and s.opt_step is None:
            return  # an empty step (a boundary with nothing in it) is not a step
        s.compute_s = now - s.started
        if s.device_start is not None:
            s.compute_s = PendingDuration(s.device_start, device_mark(), s.compute_s)
        s.training = self.model.training
        s.t_end = time.time()
        if self._cuda:
            index = self.device.index
            s.mem = (
                torch.cuda.memory_allocated(index),
                torch.cuda.memory_reserved(index),
                torch.cuda.max_memory_allocated(index),
            )
            torch.cuda.reset_peak_memory_stats(index)
        # Still a tensor only when clipped through watch.clip_grad_norm_ without an optimizer step.
        s.grad_norm = _defer_opt(s.grad_norm)
        self._pipeline.put(s)

    # --- hooks ----------------------------------------------------------------------

    def _params(self) -> list[torch.Tensor]:
        """The model's parameters: what the gradient, parameter and update norms measure.

        The model's, not the optimizer's: an optimizer built on a copy of the
        model must show as "gradients arrive, parameters do not move". The list
        is rebuilt when the optimizer's parameter count changes (a new group).
        """
        groups = self.optimizer.param_groups if self.optimizer is not None else []
        key = sum(len(g["params"]) for g in groups)
        if self._param_cache[0] != key or not self._param_cache[1]:
            self._param_cache = (key, list(self.model.parameters()))
        return self._param_cache[1]

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._inert or self._closed:
            return
        s = self._cur or self._open_step(self._last_boundary)
        params = self._params()
        measured = s.step % self.every == 0
        checking = self.on_nonfinite != "warn"
        if s.grad_norm is None and (measured or checking):
            s.grad_norm = total_norm([p.grad for p in params if p.grad is not None])
        if isinstance(s.grad_norm, torch.Tensor):
            # "stop"/"skip" must know now: free on the CPU, the one documented sync per step on CUDA.
            s.grad_norm = s.grad_norm.item() if checking else defer(s.grad_norm)
        if checking and isinstance(s.grad_norm, float) and not math.isfinite(s.grad_norm):
            self._stop_or_skip_nonfinite(s, params)
        if measured and self._opt_steps % self.update_norm_every == 0 and not s.opt_skipped:
            with torch.no_grad():
                self._before_update = list(torch._foreach_mul(params, 1.0))

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._inert or self._closed or self._cur is None:
            return
        s = self._cur
        s.lr = [defer(g["lr"]) if isinstance(g["lr"], torch.Tensor) else g["lr"] for g in optimizer.param_groups]
        if s.opt_skipped:
            return
        self._opt_steps += 1
        s.opt_step = self._opt_steps
        if s.step % self.every:
            return
        params = self._params()
        if (self._opt_steps - 1) % self.param_norm_every == 0:
            s.param_norm = _defer_opt(total_norm(params))
        before = self._before_update
        if before is not None:
            self._before_update = None
            with torch.no_grad():
                s.update_norm = _defer_opt(total_norm(torch._foreach_sub(params, before)))

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        if output is None:
            failure = sys.exc_info()[1]  # always_call: the forward is raising
            if failure is not None and process.is_oom(failure):
                self._record_oom(failure)
            return
        s = self._cur
        if s is None or self._eval is not None or s.forward_probe is not None or s.step % self.every:
            return
        out = first_tensor(output)
        if out is not None and out.is_floating_point():
            s.forward_probe = defer(finiteness_probe(out))
            if not self._classes_reported and out.dim() == 2 and out.shape[1] >= 2:
                # The width of a 2-D output is the class count that loss-chance compares with.
                self._classes_reported = True
                s.classes = int(out.shape[1])

    # --- failures: OOM and non-finite values, with their dumps ------------------------

    def _record_oom(self, failure: BaseException) -> None:
        """Write the failing step with an ``oom`` field, let the rule fire and the dump land; the caller re-raises."""
        if self._inert or self._closed or self._oom_seen == id(failure):
            return
        self._oom_seen = id(failure)
        s = self._cur or self._open_step(self._last_boundary)
        message = str(failure).strip().splitlines()
        oom: dict[str, Any] = {"error": type(failure).__name__, "message": message[0][:300] if message else ""}
        if self._cuda:
            index = self.device.index
            oom["mem_allocated"] = torch.cuda.memory_allocated(index)
            oom["mem_reserved"] = torch.cuda.memory_reserved(index)
        else:
            import psutil

            oom["rss"] = psutil.Process().memory_info().rss
        s.oom = oom
        if s.step % self.every:
            s.step_forced = True
        self._end_step(time.perf_counter())
        self._pipeline.sync(OOM_SYNC_S)

    def _on_alert(self, found: Record, records: list[Record]) -> str | None:
        """On the publisher thread: write the dump an alert calls for, return its path."""
        reason, step = found.get("rule"), found.get("step")
        if reason not in DUMP_REASONS or self.run_dir is None or not isinstance(step, int):
            return None
        batch, ids = next(((b, i) for st, b, i, _ in list(self._recent_batches) if st == step), (None, None))
        if ids is None:
            ids = next((r.get("batch_ids") for r in reversed(records) if r.get("kind") == "step"
                        and r.get("step") == step), None)  # fmt: skip
        weights = None
        if reason == "nonfinite" and self._stopping_step == step:
            # The training thread waits in _stop_or_skip_nonfinite and the bad update
            # was not applied: these are the last healthy weights.
            weights = self.model.state_dict()
        path = write_dump(
            self.run_dir, step=step, reason=str(reason), alert=found, batch=batch, batch_ids=ids,
            records=records, seed=self.seed, weights=weights,
        )  # fmt: skip
        self._last_dump = str(path)
        return str(path)

    def _stop_or_skip_nonfinite(self, s: StepState, params: list[torch.Tensor]) -> None:
        boundary = _first_failing_boundary(s)
        if self.on_nonfinite == "skip":
            # Optimizers leave parameters without a grad untouched, state included.
            for p in params:
                p.grad = None
            s.opt_skipped = True
            return
        s.opt_skipped = True
        step = s.step
        loss = s.metrics.get("loss")
        loss_text = "loss n/a" if loss is None else f"loss {_scalar(loss):.4g}"
        norm = _scalar(s.grad_norm)
        self._stopping_step = step
        self._last_dump = None
        self._end_step(time.perf_counter())
        self._pipeline.sync(STOP_SYNC_S)  # the nonfinite rule fires and its dump is written
        dump = self._last_dump
        self.close("nonfinite")
        raise NonFiniteError(
            f"nonfinite: first at step {step}, boundary={boundary} ({loss_text}, grad norm {norm}); "
            f"the optimizer step was not taken; dump: {dump or _no_dump_reason(self.run_dir)}",
            step=step,
            boundary=boundary,
            dump=dump,
        )

    # --- commands: queued by the publisher thread, run here at a step boundary ------

    def _on_command(self, command: Command) -> Record | None:
        """Publisher thread: queue the command; the training thread replies when it has run it."""
        refused = "the run has ended" if self._closed else self._commands.offer(command)
        if refused is None:
            return None
        return action_record(command.cmd, cmd_id=command.id, ok=False, step=self._step - 1 if self._step else None,
                             error=refused)  # fmt: skip

    def _at_boundary(self) -> None:
        """Run queued commands; while paused, block here (no spinning) and keep serving commands."""
        if self._inert or self._closed:
            return
        while True:
            self._commands.wake.clear()
            stop = False
            for command in self._commands.take():
                reply = self._run_command(command)
                self._pipeline.put(reply)
                stop = stop or (command.cmd == "stop" and reply["ok"])
            if stop and self.stop_mode == "raise":
                raise StopRequested(f"a viewer asked the run to stop at step {self._step}")
            if not self._paused or self._closed:
                return
            self._commands.wake.wait(1.0)

    def _run_command(self, command: Command) -> Record:
        step = self._step - 1 if self._step else None
        result: dict[str, Any] = {}
        try:
            if command.cmd == "checkpoint":
                result = self._checkpoint()
                result["dump"] = self._request_dump("checkpoint")
            elif command.cmd == "dump":
                result = {"path": self._request_dump("request")}
            elif command.cmd == "pause":
                if self._paused:
                    raise CommandRefused("the run is already paused; send resume")
                self._paused = True
            elif command.cmd == "resume":
                if not self._paused:
                    raise CommandRefused("the run is not paused")
                self._paused = False
            elif command.cmd == "stop":
                self.should_stop = True
                self._paused = False
                try:
                    result = self._checkpoint()
                except CheckpointError as exc:
                    result = {"checkpoint_error": str(exc)}  # the stop itself still happens
        except TuiwatchError as exc:
            return action_record(command.cmd, cmd_id=command.id, ok=False, step=step, error=str(exc))
        except Exception as exc:  # a failed command never stops training
            return action_record(command.cmd, cmd_id=command.id, ok=False, step=step,
                                 error=f"{type(exc).__name__}: {exc}"[:300])  # fmt: skip
        reply = action_record(command.cmd, cmd_id=command.id, ok=True, step=step, path=result.pop("path", None))
        reply.update(result)
        return reply

    def _checkpoint(self) -> dict[str, Any]:
        if self.run_dir is None:
            raise CheckpointError("this run has no run directory (Watch(run_dir=None)): nowhere to write")
        path, size = write_checkpoint(self.run_dir / "checkpoints", self._step, self.checkpoint_state())
        return {"path": str(path), "bytes": size, "steps_done": self._step}

    def _request_dump(self, reason: str) -> str:
        if self.run_dir is None:
            raise CommandRefused("this run has no run directory (Watch(run_dir=None)): nowhere to write")
        step, batch, ids = self._last_batch or (max(self._step - 1, 0), None, None)
        path = write_dump(self.run_dir, step=step, reason=reason, alert=None, batch=batch, batch_ids=ids,
                          records=list(self._pipeline.recent), seed=self.seed)  # fmt: skip
        return str(path)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds (SPEC §7): call at a step boundary, where everything is consistent."""
        return {
            "tuiwatch_checkpoint": FORMAT,
            "name": self.name,
            "run_id": self.run_record.get("run_id"),
            "step": self._step,
            "epoch": max(self._epoch, 0),
            "batch_index": self._batch_index,
            "opt_steps": self._opt_steps,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng_states(),
            "epoch_rng": self._epoch_rng,
            "versions": versions(),
        }

    def restore(self, path: str | Path) -> Checkpoint:
        """Load a checkpoint into the model, optimizer, scheduler, scaler and RNGs, and resume the data there.

        Call before the loop. The next :meth:`batches` replays the saved
        epoch's shuffle and skips the batches already trained on, so the run
        continues exactly where the checkpoint was taken.
        """
        ckpt = load_checkpoint(path)
        self.model.load_state_dict(ckpt.model)
        parts: list[tuple[str, Any, dict[str, Any] | None]] = [
            ("optimizer", self.optimizer, ckpt.optimizer),
            ("scheduler", self.scheduler, ckpt.scheduler),
            ("scaler", self.scaler, ckpt.scaler),
        ]
        for name, target, saved in parts:
            if saved is not None and target is None:
                raise TuiwatchError(f"the checkpoint has a {name} state: give Watch(..., {name}=...) to restore it")
            if saved is not None:
                target.load_state_dict(saved)
        self._step = ckpt.step
        self._epoch = ckpt.epoch - 1  # the next batches() call is the saved epoch
        self._opt_steps = ckpt.opt_steps
        self._resume = ckpt
        restore_rng(ckpt.rng)
        return ckpt

    @property
    def epoch(self) -> int:
        """The epoch the next :meth:`batches` call starts (after :meth:`restore`, the saved one)."""
        return self._epoch + 1

    def _fast_forward(self, it: Iterator[Any], recorder: Any, ckpt: Checkpoint) -> None:
        for _ in range(ckpt.batch_index):
            next(it, None)
            if recorder is not None:
                recorder.pop()
        self._batch_index = ckpt.batch_index
        restore_rng(ckpt.rng)  # the RNGs as they were at the checkpoint, after the epoch's shuffle

    # --- run record and closing ------------------------------------------------------

    def _make_run_record(self, param_count: int, socket_error: str | None) -> Record:
        rank, world = _rank_and_world()
        return {
            "kind": "run",
            "t": time.time(),
            "schema": SCHEMA,
            "name": self.name,
            "run_id": os.environ.get("TORCHELASTIC_RUN_ID") or uuid.uuid4().hex[:12],
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "rank": rank,
            "world_size": world,
            "argv": list(sys.argv),
            "seed": self.seed,
            "seeding": last_seeding(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": str(self.device),
            "mem_total": _device_total_memory(self.device),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tuiwatch": __version__,
            "run_dir": None if self.run_dir is None else str(self.run_dir),
            "socket": None if self.socket_path is None else str(self.socket_path),
            "socket_error": socket_error,
            "tcp": self.tcp_address,
            "model": type(self.model).__name__,
            "optimizer": None if self.optimizer is None else type(self.optimizer).__name__,
            "params": param_count,
            "every": self.every,
            "update_norm_every": self.update_norm_every,
            "param_norm_every": self.param_norm_every,
            "on_nonfinite": self.on_nonfinite,
        }

    @property
    def status(self) -> str:
        """``live``, ``degraded`` (the publisher hit an error; training is unaffected) or ``closed``."""
        if self._closed:
            return "closed"
        return "degraded" if self._pipeline.status == "degraded" else "live"

    @property
    def steps(self) -> int:
        return self._step

    def close(self, reason: str = "finished") -> None:
        """Write the ``end`` record and flush; returns within about 2 s even with a hung disk."""
        if reason not in END_REASONS:
            raise ValueError(f"close(reason=...) must be one of {', '.join(END_REASONS)}, got {reason!r}")
        if self._closed or self._inert:
            return
        if self.should_stop and reason == "finished":
            reason = "stopped"  # the loop ended because a viewer asked it to
        self._end_step(time.perf_counter())
        self._closed = True
        self._paused = False
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._pipeline.close(
            {"kind": "end", "t": time.time(), "reason": reason, "steps": self._step, "opt_steps": self._opt_steps}
        )
        process.watches.discard(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and process.is_oom(exc):
            self._record_oom(exc)
        self.close(process.end_reason(exc_type))

    def _forked_child(self) -> None:
        self._inert = True
        self._pipeline.abandon_after_fork()


def _defer_opt(value: Any) -> Any:
    return defer(value) if isinstance(value, torch.Tensor) else value


def _scalar(value: Any) -> float:
    return float(resolve(defer(value) if isinstance(value, torch.Tensor) else value))


def _first_failing_boundary(s: StepState) -> str:
    """Walk the chain data → model → loss → gradients; off the hot path (it syncs)."""
    checks: list[tuple[str, Any]] = [
        ("batch", s.batch.finite_probe if s.batch is not None else None),
        ("forward", s.forward_probe),
        ("loss", s.metrics.get("loss")),
    ]
    for boundary, value in checks:
        if value is not None and not math.isfinite(_scalar(value)):
            return boundary
    return "grad"


def _no_dump_reason(run_dir: Path | None) -> str:
    return "none (no run directory)" if run_dir is None else "none (the nonfinite rule is off)"


def _epoch_rng(loader: Any) -> dict[str, Any]:
    """The RNG states a loader's shuffle draws from, taken before ``iter(loader)``."""
    generator = getattr(loader, "generator", None)
    return {"rng": rng_states(),
            "loader_generator": generator.get_state() if isinstance(generator, torch.Generator) else None}  # fmt: skip


def _restore_epoch_rng(saved: dict[str, Any], loader: Any) -> None:
    restore_rng(saved["rng"])
    generator = getattr(loader, "generator", None)
    if saved.get("loader_generator") is not None and isinstance(generator, torch.Generator):
        generator.set_state(saved["loader_generator"])


def _device_total_memory(device: torch.device) -> int | None:
    """The device's memory in bytes, the scale of the pane's memory bars (a property: no sync)."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.get_device_properties(device).total_memory)
    except (RuntimeError, AssertionError):
        return None
