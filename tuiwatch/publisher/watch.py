"""``Watch``: the three lines a training loop adds (SPEC §2).

A facade: the work is done by the parts it wires together once, in
:meth:`Watch.__init__` — a :class:`StepTracker` (the step count and the open
step), the model and optimizer hooks, the failure handlers (OOM, non-finite),
the viewer commands, the dumps, and the publishing (pipeline thread, ledger,
socket) opened by :func:`open_publishing` and started once those exist.
"""

from __future__ import annotations

import numbers
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import torch
from torch.nn.parameter import is_lazy

from tuiwatch.ledger.ranks import rank_ledgers
from tuiwatch.ledger.records import END_REASONS
from tuiwatch.publisher import environment, process, resume
from tuiwatch.publisher.activation_checkpointing import in_function_forward
from tuiwatch.publisher.checkpoints import Checkpoint, load_checkpoint
from tuiwatch.publisher.collected import ended_unclosed, weakly
from tuiwatch.publisher.commands import CommandRunner, refused_after_end
from tuiwatch.publisher.deferred import defer, device_mark
from tuiwatch.publisher.dumps import DumpWriter
from tuiwatch.publisher.failures import Failures
from tuiwatch.publisher.hooks import ModelHooks, default_param_norm_every, default_update_norm_every
from tuiwatch.publisher.loader import iter_with_ids
from tuiwatch.publisher.optimizers import as_list
from tuiwatch.publisher.pending import EvalState, StepState
from tuiwatch.publisher.ranks import current_ranks, replicated
from tuiwatch.publisher.replaced import held_by, replaces, scheduler_of
from tuiwatch.publisher.run_record import default_name, start_line
from tuiwatch.publisher.seeding import last_seeding
from tuiwatch.publisher.startup import open_publishing
from tuiwatch.publisher.steps import StepTracker, add_metrics, before_its_work, set_aside
from tuiwatch.rules import Diagnosis, RulesConfig, for_reinforcement_learning, rules_as_data
from tuiwatch.wire.tcp import tcp_option

T = TypeVar("T")
ON_NONFINITE = ("stop", "skip", "warn")
STEP_PER = ("batch", "optimizer")
STOP_MODES = ("flag", "raise")
NO_MARKS = "no steps (neither watch.batches() nor watch.step())"  # what a loop that marks none is told it marks


class Watch:
    """Publishes one ledger record per training step; see SPEC §2 for the loop it expects.

    ``Watch(...)`` returns at once: a background thread owns the ledger file,
    the socket and the system sampler, and nothing on the training thread
    waits for a viewer, the disk or the device.

    ``optimizer`` may be a list of the optimizers that step one model
    (``Muon`` for its matrices beside ``AdamW`` for the rest): the step's
    lr lists the groups of them all, its update norm covers every one's
    update, and a checkpoint holds each one's state (``scheduler`` may be a
    list too).

    Three arguments are for integrations (docs/integrations.md):
    ``integration``, what one sees and does not, for the run record;
    ``checkpoint_with``, a callable that makes the framework's own checkpoint
    at the boundary where ``c`` or ``s`` runs and returns where it goes;
    ``late_gradients``, for gradients made inside ``optimizer.step(closure)``:
    the pre-clip norm and the non-finite check wait for :meth:`gradients_ready`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
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
        quiet: bool = False,
        step_per: str = "batch",
        resume_from: str | Path | None = None,
        run_id: str | None = None,
        integration: dict[str, Any] | None = None,
        checkpoint_with: Callable[[], str] | None = None,
        late_gradients: bool = False,
    ):
        _check_arguments(model, optimizer, on_nonfinite=on_nonfinite, stop=stop, every=every, step_per=step_per)
        if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
            raise ValueError(f"run_id must be a non-empty string shared by the job's ranks, got {run_id!r}")
        tcp_address = tcp_option(tcp)  # a bad address is refused before anything is created
        rules = rules_as_data(rules)  # as the run record keeps it, for report to replay the same rules
        rules, rules_note = _rules_for_this_loop(rules)
        diagnosis = Diagnosis(rules)  # raises for an unknown rule id, before anything is created
        self._parts = resume.Trainables(model, optimizer, scheduler, scaler)
        saved = None
        if resume_from is not None:  # a checkpoint that cannot be read or loaded is refused before too
            saved = load_checkpoint(resume_from)
            resume.check_parts(saved, self._parts)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.name = name or default_name()
        self.every = every
        self.on_nonfinite = on_nonfinite
        seeding = last_seeding()
        self.seed = seed if seed is not None or seeding is None else seeding["seed"]
        first = next(iter(model.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self._resume: Checkpoint | None = None
        self._epoch_rng: dict[str, Any] | None = None
        # Saved in every checkpoint and given back by restore (Checkpoint.extra): plain data, or a callable
        # called at the checkpoint's boundary (the loop's best_val_loss, a data cursor, a prefetched batch).
        self.extra_state: Any = None
        self._closed = False
        self._unmarked_forwards = 0  # training forwards after an update in a loop that marks no steps

        # A lazy module's parameters have no size until its first forward (LazyLinear): counted as unknown.
        params = list(model.parameters())
        known = sum(p.numel() for p in params if not is_lazy(p))
        param_count = None if any(is_lazy(p) for p in params) else known
        # The update norm's passes are over the parameters that can move (hooks.py): a LoRA adapter's few thousand
        # on a frozen model are sampled as often as a small model's.
        moving = sum(p.numel() for p in params if p.requires_grad and not is_lazy(p))
        self.update_norm_every = update_norm_every or default_update_norm_every(moving)
        self.param_norm_every = param_norm_every or default_param_norm_every(known)
        _close_earlier_watches(model, quiet=quiet)
        publishing = open_publishing(
            name=self.name,
            run_dir=run_dir,
            tcp=tcp_address,
            diagnosis=diagnosis,
            queue_size=queue_size,
            system_interval_s=(1.0 if system else None) if isinstance(system, bool) else float(system),
            device=self.device,
            ranks=current_ranks(run_id),
            run_info={
                "seed": self.seed,
                "model": model,
                "optimizer": optimizer,
                "param_count": param_count,
                "every": every,
                "update_norm_every": self.update_norm_every,
                "param_norm_every": self.param_norm_every,
                "on_nonfinite": on_nonfinite,
                "rules": rules,
                "rules_note": rules_note,
                "step_per": step_per,
                "resumed_from": None if saved is None else resume.link(saved),
                "integration": integration,
            },
        )
        self.run_record = publishing.run_record
        self._run_files = publishing.run_dir
        self.run_dir = publishing.run_dir.path if publishing.run_dir is not None else None
        self.ledger_path = publishing.ledger_path
        self.socket_path = publishing.socket_path
        self.tcp_address = publishing.tcp_address
        self._pipeline = publishing.pipeline
        self._tracker = tracker = StepTracker(
            self._pipeline, model, self.device, every, per_optimizer=step_per == "optimizer"
        )
        tracker.scaler = scaler
        if saved is not None:
            self._load(saved)
        dumps = DumpWriter(self._run_files, self.seed, tracker.recent)
        self._commands = CommandRunner(
            tracker, dumps, self.checkpoint_state, stop_mode=stop, checkpoint_with=checkpoint_with
        )
        self._failures = Failures(tracker, dumps, model, on_nonfinite=on_nonfinite, close=self.close)
        self._hooks = ModelHooks(
            tracker,
            self._failures,
            model,
            as_list(optimizer),
            checking=on_nonfinite != "warn",
            update_norm_every=self.update_norm_every,
            param_norm_every=self.param_norm_every,
            late_gradients=late_gradients,
            name=self.name,
        )
        self._said_replaced = False  # the one line about an optimizer that replaced the Watch's
        self._not_replacing: weakref.WeakSet[Any] = weakref.WeakSet()  # optimizers seen stepping that replace none
        if len(self._hooks.optimizers) == 1 and not late_gradients:  # (Lightning's own optimizers are its affair)
            self._hooks.on_other_optimizer = weakly(self.follow, _no_replacement)
        self._hooks.attach()
        if integration is None:  # (an integration marks its steps itself, from its framework's events)
            tracker.on_first_update = weakly(self._unmarked_loop, _nothing)
            # Without an optimizer to hook, a loop that marks no steps is told its updates at its backwards' ends.
            self._hooks.updates_at_backward = not self._hooks.optimizers
        self._replicated = replicated(model, optimizer, self.run_record["world_size"])
        # The thread holds the Watch's parts weakly, and a finalizer ends a run whose Watch the loop let go of.
        publishing.start(
            weakly(self._commands.on_command, refused_after_end),
            weakly(dumps.on_alert, _no_dump),
            viewer_stall_s=viewer_stall_s,
        )
        self._finalizer = weakref.finalize(self, ended_unclosed, self._pipeline, self._hooks.attached, self._run_files)
        self._finalizer.atexit = False  # at exit, process.py closes the Watches still open, with the exit's reason
        socket_error = self.run_record["socket_error"]
        world, first_here = self.run_record["world_size"], self.run_record["local_rank"] == 0
        if socket_error is not None or not (quiet or os.environ.get("TUIWATCH_QUIET") or not first_here):
            # Quiet silences the start line, never the reason a run has no socket; one line per host for a job.
            line = start_line(self.name, self.ledger_path, self.socket_path, socket_error, world_size=world)
            print(line, file=sys.stderr, flush=True)
        process.watches.add(self)
        process.install_hooks()

    # --- the loop -------------------------------------------------------------------

    def batches(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate over ``loader``, one step per batch: times the wait, records ids and shapes.

        With ``step_per="optimizer"``, the batches up to the one after which
        the optimizer steps make one step (gradient accumulation).
        """
        tracker, commands = self._tracker, self._commands
        tracker.marked = True
        tracker.epoch += 1
        epoch = tracker.epoch
        saved, self._resume = self._resume, None
        if saved is not None and saved.epoch_rng is not None:
            resume.restore_epoch_rng(saved.epoch_rng, loader)  # the same shuffle as the epoch that was saved
        self._epoch_rng = resume.epoch_rng(loader)
        tracker.batch_index = 0
        it, recorder = iter_with_ids(loader)
        if saved is not None:
            resume.fast_forward(it, recorder, saved, tracker)
        clock = time.perf_counter
        try:
            while True:
                t0 = clock()
                folding = tracker.per_optimizer and tracker.folding()  # (a call a step saved without it)
                if not folding:
                    tracker.end(t0)
                    if commands.pending():
                        commands.at_boundary()
                        t0 = clock()  # a pause or a checkpoint is neither data wait nor compute
                try:
                    batch = next(it)
                except StopIteration:
                    return
                t1 = clock()
                tracker.batch_index += 1
                ids = recorder.pop() if recorder is not None else None
                if tracker.off:
                    yield batch
                    continue
                if folding:
                    tracker.fold(batch, ids, t1 - t0)
                else:
                    s = tracker.open(t1, at_boundary=True, data_wait_s=t1 - t0)
                    s.epoch = epoch
                    tracker.add_batch(s, batch, ids)
                try:
                    yield batch
                except GeneratorExit:
                    # The loop left right after drawing this batch, before any use of it: a limit of batches an epoch
                    # (Optuna's examples: `if batch_idx * BATCHSIZE >= N_TRAIN_EXAMPLES: break`) drew one more that no
                    # step trains on, a step with no loss or update every epoch. Or an exception raised before the
                    # model's forward: then close() puts the step back, the one the run failed in.
                    if (
                        not folding
                        and tracker.cur is s
                        and before_its_work(s)
                        and not s.metrics
                        and not s.forward_raised
                    ):
                        tracker.leave()
                    raise
        finally:
            tracker.end(clock())

    def step(
        self,
        batch: Any = None,
        *,
        ids: Iterable[int] | torch.Tensor | None = None,
        data_wait_s: float | None = None,
        run_commands: bool = True,
    ) -> None:
        """Mark a step boundary in a loop that does not draw from :meth:`batches`.

        ``batch`` (and the sample ``ids`` in it, if the loop knows them) is the
        batch this step trains on, fetched since the last boundary: its shapes
        and token count are recorded as for :meth:`batches`. Time spent in
        :meth:`fetching` blocks since the last boundary is this step's data wait;
        ``data_wait_s`` is for a caller that timed the fetch of ``batch`` itself
        (an integration's loader hook). With ``step_per="optimizer"``, a batch
        fetched before the open step's optimizer step is one more micro-batch of it.
        ``run_commands=False`` leaves a viewer's commands to :meth:`end_step`:
        for a framework whose own checkpoint is taken only where its steps end.
        """
        tracker = self._tracker
        now = time.perf_counter()
        tracker.marked = True
        batch_ids = _sample_ids(ids)
        if data_wait_s is not None and type(data_wait_s) is not float:  # (a float, the usual, as it is)
            data_wait_s = _seconds(data_wait_s)
        if tracker.folding():
            if batch is not None and not tracker.off:
                tracker.fold(batch, batch_ids, data_wait_s)
            return
        self._boundary(now, run_commands, data_wait_s)
        s = tracker.cur
        if batch is not None and s is not None:
            tracker.add_batch(s, batch, batch_ids)

    def _boundary(self, now: float, run_commands: bool = True, data_wait_s: float | None = None) -> None:
        """End the open step and open the next: what a step boundary does, whoever marks it."""
        tracker = self._tracker
        tracker.end(now)
        if run_commands and self._commands.pending():
            self._commands.at_boundary()
            now = time.perf_counter()
        if not tracker.off:
            s = tracker.open(now, at_boundary=True, data_wait_s=data_wait_s)
            s.epoch = max(tracker.epoch, 0)

    def end_step(self) -> bool:
        """End the open step here, without opening the next one (for integrations that see a step's end).

        What runs until the next boundary (validation, the loop's own logging
        or checkpoint) belongs to no step. A viewer's queued commands run here,
        as at any boundary. With ``step_per="optimizer"``, a step ends only
        once its optimizer has stepped: before that this does nothing. True
        when a step ended.
        """
        tracker = self._tracker
        tracker.marked = True
        if tracker.off or tracker.folding():
            return False
        ended = tracker.cur is not None
        tracker.end(time.perf_counter())
        if self._commands.pending():
            self._commands.at_boundary()
            tracker.last_boundary = time.perf_counter()  # a pause is no step's time
        return ended

    def gradients_ready(self) -> None:
        """With ``Watch(late_gradients=True)``: this step's gradients are complete, before any clipping.

        The pre-clip gradient norm is measured now and, with
        ``on_nonfinite="stop"`` or ``"skip"``, checked before the update.
        Called again in the step (before each of several optimizers), the
        first norm stays, and the gradients a backward made since are checked.
        """
        self._hooks.gradients_ready()

    @contextmanager
    def fetching(self) -> Iterator[None]:
        """Time a batch fetch (``x, y = get_batch()``) as data wait, in a loop without :meth:`batches`.

        The time goes to the next step boundary's step (the step that trains
        on what was fetched) and is not counted as compute of the step it ran in.
        """
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._tracker.fetched(time.perf_counter() - t0)

    def log(self, **metrics: Any) -> None:
        """Record scalars for this step (or this validation); tensors stay on their device.

        ``epoch=`` sets the epoch (a loop without :meth:`batches`), and
        ``lr=`` the learning rate of a loop that updates without an optimizer
        (with one, tuiwatch reads the lr from its param groups).
        """
        tracker = self._tracker
        if tracker.off:
            return
        if tracker.eval is None and "epoch" not in metrics and "lr" not in metrics:
            add_metrics(tracker.current().metrics, metrics)  # the usual call, once a step: the step's scalars
            return
        epoch = metrics.pop("epoch", None)
        lr = metrics.pop("lr", None)
        if lr is not None and self.optimizer is not None:
            raise ValueError(
                "tuiwatch: lr is read from the optimizer's param groups; log(lr=...) is for loops without one"
            )
        epoch = None if epoch is None else _epoch(epoch)
        lrs = None if lr is None else _learning_rates(lr)
        target: EvalState | StepState
        if tracker.eval is not None:
            target = tracker.eval
            if not target.forwards:
                # No forward of the model ran inside the block yet: judge its mode now.
                target.training = bool(target.training) or self._mode_without_forward()
        else:
            target = tracker.current()
        if epoch is not None:
            target.epoch = tracker.epoch = epoch
        if lrs is not None and isinstance(target, StepState):
            target.lr = lrs
        add_metrics(target.metrics, metrics)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, **kwargs: Any) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the optimizer's parameters; records the pre-clip norm."""
        norm = torch.nn.utils.clip_grad_norm_(self._hooks.params(), max_norm, norm_type=norm_type, **kwargs)
        if not self._tracker.off:
            s = self._tracker.current()
            s.grad_norm = norm
            s.clip_max_norm = float(max_norm)
        return norm

    @contextmanager
    def validation(self) -> Iterator[Watch]:
        """Logs inside this block form one ``eval`` record at the current step; its time is not the step's compute."""
        tracker = self._tracker
        # The last step that trained: at the top of an open step (nanoGPT's place, after the boundary and before
        # the step's forward) that is the step before it, whose weights the evaluation sees.
        s = tracker.cur
        at_top = s is not None and before_its_work(s)
        state = EvalState(step=max(tracker.step - 1 - at_top, 0), epoch=max(tracker.epoch, 0))
        tracker.eval = state
        entered = time.perf_counter()
        try:
            yield self
        finally:
            tracker.eval = None
            if tracker.cur is not None:
                set_aside(tracker.cur, entered, time.perf_counter())  # evaluating is not the step's compute
            if state.training is None:
                state.training = self._mode_without_forward()  # neither a forward nor a log inside the block
            state.t_end = time.time()
            if state.metrics and not tracker.off:
                self._pipeline.put(state)

    def _mode_without_forward(self) -> bool | None:
        """Whether a validation block in which the model ran no forward evaluated in training mode.

        Its numbers were computed before it: by the model's last forward when that ran in eval mode (an
        evaluation that restored ``model.train()`` before returning, then logged, as the README's loop does).
        When the model's last forward was a training step's (the optimizer updated the model after it), the
        block evaluated something else, an EMA or SWA copy, say, whose mode the Watch never saw: None, no
        claim either way. Else judged by the model's mode now (a forgotten ``model.eval()``).
        """
        tracker = self._tracker
        last = tracker.forward_training
        if last is False:
            return False
        if last and tracker.training_forwards == tracker.forwards_at_update:
            return None
        return self.model.training

    @property
    def should_stop(self) -> bool:
        """True once a viewer asked the run to stop (``s``): end the loop, then close."""
        return self._commands.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self._commands.should_stop = bool(value)  # a loop may stop itself the same way

    # --- checkpoints ------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds (SPEC §7): call at a step boundary, where everything is consistent."""
        return resume.checkpoint_state(
            self._parts,
            self._tracker,
            name=self.name,
            run_id=self.run_record["run_id"],
            ledger=self.ledger_path,
            epoch_rng=self._epoch_rng,
            extra=self.extra_state,
            replica_of=self._replica_of(),
        )

    def _replica_of(self) -> str | None:
        """For a rank of a DDP job above its host's lowest: that rank's file of this step, which holds the model
        and optimizer states every rank has (the same weights, the same gradients after the all-reduce)."""
        if not self._replicated or self.run_dir is None:
            return None
        ranks = rank_ledgers(self.run_dir.parent)
        lowest = min(ranks, default=None)
        if lowest is None or lowest >= self.run_record["rank"]:
            return None
        target = ranks[lowest].parent / "checkpoints" / f"step-{self._tracker.step}.pt"
        return os.path.relpath(target, self.run_dir / "checkpoints")

    def restore(self, path: str | Path) -> Checkpoint:
        """Load a checkpoint into the model, optimizer, scheduler, scaler and RNGs, and resume the data there.

        Call before the loop. The next :meth:`batches` replays the saved
        epoch's shuffle and skips the batches already trained on, so the run
        continues exactly where the checkpoint was taken. ``Watch(...,
        resume_from=path)`` does the same and also says so in the run record;
        here the link is a ``resumed`` record. ``watch.extra_state`` is set
        to what the checkpoint holds of it.
        """
        ckpt = load_checkpoint(path)
        resume.check_parts(ckpt, self._parts)
        self._load(ckpt)
        self._pipeline.put({"kind": "resumed", "t": time.time(), "resumed_from": resume.link(ckpt)})
        return ckpt

    def _continue_at(self, step: int, resumed_from: dict[str, Any]) -> None:
        """An integration's framework restored its own checkpoint: the steps go on from its count of optimizer
        steps (one ledger step each), and a ``resumed`` record links back, as :meth:`restore` writes."""
        tracker = self._tracker
        tracker.step = tracker.opt_steps = step
        self._pipeline.put({"kind": "resumed", "t": time.time(), "resumed_from": resumed_from})

    def _load(self, ckpt: Checkpoint) -> None:
        resume.restore(ckpt, self._parts, self._tracker)
        self.extra_state = ckpt.extra  # the loop's own state, back (then its own again)
        self._resume = resume.without_weights(ckpt)  # until batches() replays the data position

    @property
    def epoch(self) -> int:
        """The epoch the next :meth:`batches` call starts (after :meth:`restore`, the saved one)."""
        return self._tracker.epoch + 1

    # --- state and closing ---------------------------------------------------------------

    @property
    def status(self) -> str:
        """``live``, ``degraded`` (the publisher hit an error; training is unaffected) or ``closed``."""
        if self._closed:
            return "closed"
        return "degraded" if self._pipeline.status == "degraded" else "live"

    @property
    def steps(self) -> int:
        return self._tracker.step

    def close(self, reason: str = "finished") -> None:
        """Write the ``end`` record and flush; returns within about 2 s even with a hung disk."""
        if reason not in END_REASONS:
            raise ValueError(f"close(reason=...) must be one of {', '.join(END_REASONS)}, got {reason!r}")
        tracker = self._tracker
        if tracker.off:
            return
        if reason != "finished":
            tracker.put_back()  # a step the loop left by this exception (batches())
        elif self.should_stop:
            reason = "stopped"  # the loop ended because a viewer asked it to
        self._finalizer.detach()
        unmarked = not tracker.marked and self.run_record["integration"] is None
        if unmarked and not self._hooks.optimizers and tracker.training_forwards > 1 and not tracker.opt_steps:
            # (a backward through the model's output tells an update: none ran, or the loss is not the output's)
            self._say(
                f"the loop marked {NO_MARKS} and no update was seen (no optimizer, and no backward through the "
                "model's output): this run has no step per update; call watch.step() where each step begins"
            )
        now = time.perf_counter()
        if tracker.cur is not None:
            _evaluation_set_aside(tracker.cur, now)  # the run's last evaluation (a loop that marks no steps)
        tracker.end(now)
        tracker.off = self._closed = True
        self._commands.paused = False
        self._hooks.remove()
        stopped = self._pipeline.close(
            {"kind": "end", "t": time.time(), "reason": reason, "steps": tracker.step, "opt_steps": tracker.opt_steps}
        )
        if stopped and self._run_files is not None:
            self._run_files.close()  # not while a thread stuck on a hung disk may still write a dump through it
        process.watches.discard(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and process.is_oom(exc):
            self._record_oom(exc)
        self.close(process.end_reason(exc_type))

    # --- a loop that marks no steps ------------------------------------------------------

    def _unmarked_loop(self) -> None:
        """The first update, and the loop has marked no step: it draws its batches itself (a loader, a list, a
        generator) and calls neither batches() nor step(). Left so, every update to the end of the run would be in one
        step, its loss the last logged. From now on the model's first training forward after an update opens the next
        step (a loop that calls ``watch.step()`` at the bottom of its loop marks its second step before that). A
        model whose own forward did not run in that first step (the loop calls its parts) is watched by its parts
        from here, so that their forwards open the steps from the second on."""
        if not self._tracker.marked:
            self._hooks.forward_seen()
            self._hooks.open_steps_at_forwards(self._step_at_forward)

    def _step_at_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        tracker = self._tracker
        if tracker.marked:
            self._hooks.stop_steps_at_forwards()
            return
        s = tracker.cur
        if tracker.off or s is None or (s.opt_step is None and not s.opt_skipped):
            return  # no update yet in this step: its next micro-batch (accumulation), or its other parts' forwards
        if not (torch.is_grad_enabled() or in_function_forward(args)) or not tracker.trains(module):
            # An evaluation after the update (an epoch's validation, a test set at the end): in the step, as a
            # watch.log() of its result is, but not its compute. A validation() block sets its own time aside.
            if s.evaluated_at is None and tracker.eval is None:
                s.evaluated_at = time.perf_counter()
                if s.device_start is not None:
                    s.evaluated_mark = device_mark()  # its kernels are not the step's device time either
            return
        self._unmarked_forwards += 1
        if len(self._hooks.optimizers) > 1:
            # A GAN's generator forwards after its discriminator's update, in the same step: where one ends is not
            # known. Said at the second such forward (a loop that marks its steps at the bottom has marked by then).
            if self._unmarked_forwards == 2:
                self._hooks.stop_steps_at_forwards()
                self._say(
                    f"the loop marks {NO_MARKS}, and with several optimizers where a step ends is not known: the run "
                    "stays in one step; call watch.step() where each step begins"
                )
            return
        if self._unmarked_forwards == 1:
            after = "an update" if self._hooks.optimizers else "a backward"
            self._say(
                f"the loop marks {NO_MARKS}: a step opens at each training forward after {after}, without data "
                "wait or sample ids; `for batch in watch.batches(loader)` records them"
            )
        now = time.perf_counter()
        _evaluation_set_aside(s, now)
        self._boundary(now)

    # --- an optimizer that replaces the Watch's (replaced.py) ----------------------------

    def follow(self, optimizer: Any) -> bool:
        """Whether ``optimizer``, stepping now, is the Watch's: the one it was given, or one that replaced it (a new
        one over the same model, replaced.py), whose hooks measure this step on. Called at its step's start, before
        its own pre-hooks (torch runs the global ones first)."""
        hooks = self._hooks
        if hooks.is_watched(optimizer):
            return True
        tracker = self._tracker
        if tracker.off or len(hooks.optimizers) != 1 or optimizer in self._not_replacing:
            return False
        if hooks.stepping_in is not None and hooks.stepping_in is tracker.cur:
            return False  # stepped inside the watched one's step
        if held_by(hooks.optimizer, optimizer):
            # The watched one's own inner optimizer, stepped outside its step(): SAM's base optimizer, at the
            # second_step() of a loop that never calls SAM's step(). Its steps are the updates.
            hooks.step_with(optimizer)
            return True
        try:
            follows = replaces(optimizer, hooks._stepping[0], hooks.params())
        except Exception:  # an optimizer of one's own without param_groups: not a replacement
            follows = False
        if not follows:
            self._not_replacing.add(optimizer)
            return False
        old = hooks.replace_optimizer(optimizer)
        self.optimizer = self._parts.optimizer = optimizer
        scheduler = self._parts.scheduler
        if scheduler is not None and getattr(scheduler, "optimizer", None) is old:
            self.scheduler = self._parts.scheduler = scheduler_of(optimizer)  # the new one's, or none
        if not self._said_replaced:  # once: a loop that builds one an epoch would say it at every epoch
            self._said_replaced = True
            s = tracker.cur
            self._say(
                f"the loop replaced its optimizer at step {s.step if s is not None else tracker.step}: a new "
                f"{type(optimizer).__name__} over the model's parameters, whose lr, norms and updates are read from "
                "there on (and those of any later one that replaces it)"
            )
        return True

    def _say(self, line: str) -> None:
        print(f"tuiwatch: {self.name}: {line}", file=sys.stderr, flush=True)

    # --- called by the process-wide hooks (publisher/process.py) ---------------------------

    def _record_oom(self, failure: BaseException) -> None:
        self._failures.record_oom(failure)

    def _forked_child(self) -> None:
        self._finalizer.detach()  # the parent's run: a child never ends it
        self._tracker.off = True
        self._pipeline.abandon_after_fork()


def _evaluation_set_aside(s: StepState, now: float) -> None:
    """``s`` ends at ``now``: an evaluation that began after its update (a loop that marks no steps) is not its
    compute."""
    if s.evaluated_at is not None:
        s.not_compute += now - s.evaluated_at


def _nothing() -> None:
    return None  # the first update of a Watch collected meanwhile


def _no_replacement(optimizer: Any) -> bool:
    return False  # an optimizer stepping after the Watch was collected


def _no_dump(found: Any, records: Any) -> None:
    return None  # an alert of the last records of a Watch collected unclosed: its batches went with it


def _rules_for_this_loop(
    rules: list[str] | dict[str, Any] | None,
) -> tuple[list[str] | dict[str, Any] | None, str | None]:
    """The rules a loop of this kind runs, and a note of what its kind changed (None when nothing)."""
    library = environment.reinforcement_learning()
    if library is None:
        return rules, None
    rules, off = for_reinforcement_learning(rules)
    if not off:
        return rules, None
    # The rules it turned off are in ``rules`` (false): the note says why, as the viewer's i shows them together.
    return rules, (
        f"reinforcement learning ({library} is imported): a policy's loss and gradients jump with each new rollout; "
        "rules={...: True} turns one back on"
    )


def _close_earlier_watches(model: torch.nn.Module, *, quiet: bool) -> None:
    """A notebook cell run again makes a new Watch of the same model: the earlier one is closed first.

    Left open, its run looked live for good (a socket, a thread, a viewer that never moved), and its hooks
    measured each of the new run's steps a second time, into its own last step.
    """
    for earlier in [w for w in process.watches if w.model is model]:
        earlier.close("finished")
        if not (quiet or os.environ.get("TUIWATCH_QUIET")):
            where = f"ledger {earlier.ledger_path}" if earlier.ledger_path is not None else "no ledger"
            print(
                f"tuiwatch: {earlier.name}: closed ({where}): a new Watch of the same model replaces it",
                file=sys.stderr,
            )


def _check_arguments(model: Any, optimizer: Any, *, on_nonfinite: str, stop: str, every: Any, step_per: str) -> None:
    """One line for the first bad argument, before anything is created."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tuiwatch.Watch needs a torch.nn.Module as model, got {type(model).__name__}")
    optimizers = as_list(optimizer)
    if isinstance(optimizer, list | tuple) and not optimizers:
        raise ValueError("tuiwatch.Watch got an empty list of optimizers: give the optimizers, or None")
    for o in optimizers:
        if not isinstance(o, torch.optim.Optimizer):
            line = f"tuiwatch.Watch needs a torch.optim.Optimizer (or a list of them), got {type(o).__name__}"
            if hasattr(o, "param_groups") and callable(getattr(o, "step", None)):  # a course's, a paper's
                line += ": an optimizer of your own is watched as updates made by hand, Watch(model) without it"
            raise TypeError(line)
    if len({id(o) for o in optimizers}) < len(optimizers):
        raise ValueError("tuiwatch.Watch was given the same optimizer twice: give each optimizer once")
    if on_nonfinite not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {', '.join(ON_NONFINITE)}, got {on_nonfinite!r}")
    if stop not in STOP_MODES:
        raise ValueError(f"stop must be 'flag' (watch.should_stop) or 'raise' (StopRequested), got {stop!r}")
    if step_per not in STEP_PER:
        raise ValueError(f"step_per must be 'batch' or 'optimizer' (one step per optimizer step), got {step_per!r}")
    if step_per == "optimizer" and optimizer is None:
        raise ValueError("step_per='optimizer' needs the optimizer: Watch(model, optimizer, step_per='optimizer')")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1, got {every!r}")


def _sample_ids(ids: Any) -> list[int] | None:
    """``watch.step(ids=...)``: the sample ids of the batch as a list of ints, from a sequence or a CPU tensor."""
    if ids is None:
        return None
    if isinstance(ids, torch.Tensor):
        if ids.device.type != "cpu":
            raise ValueError("tuiwatch: step(ids=...) needs the ids on the CPU (reading a device tensor would sync)")
        return [int(i) for i in ids.reshape(-1).tolist()]
    try:
        return [int(i) for i in ids]
    except (TypeError, ValueError):
        raise TypeError(f"tuiwatch: step(ids=...) needs a sequence of integers, got {type(ids).__name__}") from None


def _seconds(value: Any) -> float:
    """``step(data_wait_s=...)`` as a plain float: the rules read numbers of Python's types only, and a numpy
    float would count as missing in the run's own diagnosis but as a number once the ledger is read back."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"tuiwatch: step(data_wait_s=...) needs a number of seconds, got {type(value).__name__}")
    return float(value)


def _epoch(value: Any) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:  # numpy's ints are numbers
        raise ValueError(f"tuiwatch: log(epoch=...) needs an integer >= 0, got {value!r}")
    return int(value)


def _learning_rates(value: Any) -> list[Any]:
    """``log(lr=...)``: one learning rate, or one per parameter group."""
    values = list(value) if isinstance(value, list | tuple) else [value]
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"tuiwatch: log(lr=...) needs a number (or one per group), got {type(v).__name__}")
    return [defer(v) if isinstance(v, torch.Tensor) else float(v) for v in values]
