"""``tuiwatch.lightning.TuiwatchCallback``: a Watch on a Lightning ``Trainer`` (2.x), in one line.

    trainer = Trainer(callbacks=[tuiwatch.lightning.TuiwatchCallback()])

The class is a Callback of ``lightning.pytorch`` and of ``pytorch_lightning``,
whichever are installed, so either namespace's Trainer takes it. One ledger step
per optimizer step (``step_per="optimizer"``), from Lightning's hooks:

- the Watch is made at ``on_train_start`` on the LightningModule, the first
  optimizer and its scheduler;
- Lightning runs ``training_step`` and the backward inside
  ``optimizer.step(closure)``, after torch's step pre-hook, so the Watch is made
  with ``late_gradients``: the pre-clip norm is measured, and checked for
  ``on_nonfinite``, at ``on_before_optimizer_step``, which Lightning calls after
  the backward and before its clipping;
- a **batch** is the one ``on_train_batch_start`` receives; its **data wait** is
  the time since the previous batch ended (or validation did): Lightning
  fetches it just before; accumulated batches fold into their optimizer step;
  its **sample ids** come from a recorder of the training DataLoader's sampler,
  put in at ``DataLoader.__iter__`` (and the ``__iter__`` of a subclass that has
  its own: torchdata's ``StatefulDataLoader``) for the fit (Lightning makes the
  iterator before ``on_train_start``);
- the **loss** is the sum of the losses ``on_before_backward`` receives during
  the step (Lightning divides each by ``accumulate_grad_batches`` first),
  logged once at ``on_before_optimizer_step``, before the non-finite check
  (LBFGS calls the closure, and that hook, several times a step: the first
  call's loss and norm are the step's);
- **validation** is one ``eval`` record at the step it ran after: the metrics
  it logged (the ``callback_metrics`` that changed during it), ``val_`` taken
  off, and ``training`` as the model's forwards saw it;
- a run resumed with ``Trainer.fit(ckpt_path=...)`` numbers its steps on from
  the checkpoint's ``global_step`` and links back to the ledger of the run that
  saved it, which the callback's state in every Lightning checkpoint names
  (resumed.py);
- keys: ``c`` calls ``trainer.save_checkpoint`` at the step's end (on every
  rank: it is collective), which ``Trainer.fit(ckpt_path=...)`` resumes; ``s``
  saves the same way and sets ``trainer.should_stop``; ``p`` pauses at the
  step's end; ``d`` dumps the last batch.
"""

from __future__ import annotations

import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from tuiwatch.integrations import resumed
from tuiwatch.integrations.loss import BackwardLoss, wrap_attribute
from tuiwatch.integrations.metrics import eval_metrics
from tuiwatch.publisher.loader import IndexRecorder, ids_of_size, iter_owners, iter_with_ids
from tuiwatch.publisher.measure import batch_size
from tuiwatch.publisher.watch import Watch


def _callback_bases() -> tuple[type, ...]:
    bases: list[type] = []
    try:
        from lightning.pytorch import Callback as LightningCallback

        bases.append(LightningCallback)
    except ImportError:
        pass
    try:
        from pytorch_lightning import Callback as PLCallback

        bases.append(PLCallback)
    except ImportError:
        pass
    if not bases:
        raise ImportError("tuiwatch.lightning needs Lightning 2: pip install 'tuiwatch[lightning]'")
    return tuple(bases)


NOT_SEEN = [
    "with several optimizers (manual optimization), the norm of the gradients a later optimizer steps on after a "
    "backward of its own (a GAN's generator): the step's grad_norm is its first optimizer's (the later ones' "
    "gradients are checked for non-finite values all the same)",
    "data wait is the time between batches, less validation: Lightning's fetch itself is not timed",
]
VALIDATION_PREFIXES = ("val_", "val/", "valid_", "validation_", "validation/")


class _Hooks:
    """What the callback does; the Callback bases come from whichever Lightning is installed."""

    def __init__(self, **watch_options: Any):
        self.options = watch_options
        self.watch: Watch | None = None
        self._trainer: Any = None
        self._idle_since = time.perf_counter()
        self.loss = BackwardLoss()  # not installed: Lightning hands the loss over, at on_before_backward
        # LBFGS calls its closure, and with it on_before_optimizer_step, several times a step: the first is the step's.
        self._loss_logged = False
        self._epoch: int | None = None
        self._validation: ExitStack | None = None
        self._metrics_before: dict[str, Any] = {}
        self._saved: dict[str, Any] | None = None  # what the checkpoint fit() resumes from kept of its run
        self._ids: IndexRecorder | None = None  # the training DataLoader's sampler stand-in, this epoch
        self._recording = False  # inside our own iter() of it
        self._unpatch: Any = None

    # --- sample ids -----------------------------------------------------------------

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """The training DataLoader's iterator is made with a recorder of its sampler, as ``watch.batches()``
        makes it: Lightning makes it before ``on_train_start`` (and again each epoch), so the recorder goes in
        at ``DataLoader.__iter__`` (and a subclass's own) for the fit, for that one loader."""
        if self._unpatch is None:
            undo = [
                wrap_attribute(owner, "__iter__", lambda original: self._iter(trainer, original))
                for owner in iter_owners()
            ]
            self._unpatch = lambda: [u() for u in reversed(undo)]

    def _iter(self, trainer: Any, original: Any) -> Any:
        def __iter__(loader: DataLoader[Any]) -> Any:
            if self._recording or loader is not _training_loader(trainer):
                return original(loader)
            self._recording = True
            try:
                it, self._ids = iter_with_ids(loader)
            except Exception:  # a loader the recorder cannot stand in for: trained on all the same, without ids
                self._ids = None
                return original(loader)
            finally:
                self._recording = False
            return it

        return __iter__

    def _batch_ids(self, batch: Any) -> list[int] | None:
        """The ids of ``batch``, the oldest the recorder holds (Lightning draws one batch ahead), when their count
        is the batch's size: anything else (a loop that draws for itself) gets none rather than another's."""
        return ids_of_size(self._ids.pop() if self._ids is not None else None, batch_size(batch))

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch, self._ids = None, None

    # --- the run --------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.watch is not None:
            return
        optimizers = trainer.optimizers
        configs = getattr(trainer, "lr_scheduler_configs", [])
        options = {"name": type(pl_module).__name__, **self.options}
        if trainer.world_size > 1 and "run_id" not in options:
            # Lightning's own launcher starts ranks 1.. from rank 0's process: no launcher they share to tell the
            # job by, so rank 0's id goes to all (on_train_start runs on every rank: the broadcast is collective).
            options["run_id"] = trainer.strategy.broadcast(uuid.uuid4().hex[:12], src=0)
        self._trainer = trainer
        # Several optimizers (manual optimization: Muon beside AdamW, a GAN's two halves) go to the Watch as a list.
        schedulers = [c.scheduler for c in configs]
        self.watch = Watch(
            pl_module,
            list(optimizers) if len(optimizers) > 1 else next(iter(optimizers), None),
            scheduler=schedulers if len(schedulers) > 1 else next(iter(schedulers), None),
            step_per="optimizer" if optimizers else "batch",
            late_gradients=True,
            checkpoint_with=self._lightning_checkpoint,
            integration={"by": "tuiwatch.lightning.TuiwatchCallback", "not_seen": NOT_SEEN},
            **options,
        )
        if trainer.global_step:  # fit(ckpt_path=...): the ledger goes on from its step, linked to its run
            step, path = int(trainer.global_step), trainer.ckpt_path
            link = resumed.link(
                self._saved,
                step=step,
                checkpoint=None if path is None else str(path),
                rank=self.watch.run_record["rank"],
            )
            self.watch._continue_at(step, link)
        self._idle_since = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """Kept by Lightning in every checkpoint: the link a run resumed from it writes (resumed.py)."""
        return resumed.saved_state(self.watch)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.watch is not None:
            self.watch.close("stopped" if self.watch.should_stop else "finished")
            self.watch = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")
        if self.watch is not None:
            interrupted = isinstance(exception, KeyboardInterrupt)
            self.watch.close("stopped" if interrupted else "exception")  # a NonFiniteError closed it already
            self.watch = None

    # --- steps ----------------------------------------------------------------------

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._epoch = int(trainer.current_epoch)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        watch = self.watch
        if watch is None:
            return
        wait = time.perf_counter() - self._idle_since
        watch.step(batch, ids=self._batch_ids(batch), data_wait_s=wait, run_commands=False)
        if self._epoch is not None:
            watch.log(epoch=self._epoch)
            self._epoch = None

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        if self.watch is not None and loss.numel() == 1:
            self.loss.add(loss)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        watch = self.watch
        if watch is None:
            return
        loss = self.loss.take()
        if loss is not None and not self._loss_logged:
            self._loss_logged = True
            watch.log(loss=loss)  # before the check: a non-finite stop names the loss
        if watch.optimizer is not None:
            watch.gradients_ready()  # (a second call in the same step keeps the first's norm)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        watch = self.watch
        if watch is None:
            return
        watch.end_step()  # a viewer's c/d/p/s run here
        self._loss_logged = False
        if watch.should_stop:
            trainer.should_stop = True
        self._idle_since = time.perf_counter()

    def _lightning_checkpoint(self) -> str:
        """``c`` and ``s``: Lightning's own checkpoint, by every rank at the same step (it is collective)."""
        trainer, watch = self._trainer, self.watch
        root = watch.run_dir if watch is not None and watch.run_dir is not None else Path(trainer.default_root_dir)
        path = root / "checkpoints" / f"lightning-step-{trainer.global_step}.ckpt"
        trainer.save_checkpoint(path)
        return str(path)

    # --- validation: one eval record ----------------------------------------------------

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.watch is None or trainer.sanity_checking:
            return
        self._metrics_before = dict(trainer.callback_metrics)
        self._validation = ExitStack()
        self._validation.enter_context(self.watch.validation())  # its forwards tell the model's mode

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        stack, self._validation = self._validation, None
        if stack is None or self.watch is None:
            return
        before = self._metrics_before
        changed = {k: v for k, v in trainer.callback_metrics.items() if before.get(k) is not v}
        values = eval_metrics(changed, VALIDATION_PREFIXES)
        if values:
            self.watch.log(**values)
        stack.close()
        self._idle_since = time.perf_counter()


TuiwatchCallback: type = type(
    "TuiwatchCallback",
    (_Hooks, *_callback_bases()),
    {
        "__doc__": """A Lightning ``Callback`` that publishes the Trainer's steps to ``tuiwatch attach``.

    Keyword arguments go to the ``Watch`` (``name``, ``run_dir``,
    ``on_nonfinite``, ``rules``, ...); ``name`` defaults to the
    LightningModule's class name.
    """,
        "__module__": __name__,
    },
)


def _training_loader(trainer: Any) -> Any:
    """The fit's one training DataLoader (None for several, or none yet): Lightning sets it before iterating."""
    try:
        loader = trainer.train_dataloader
    except Exception:  # a Lightning whose property needs what is not set up yet
        return None
    return loader if isinstance(loader, DataLoader) else None
