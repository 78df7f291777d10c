"""``tuiwatch.hf.TuiwatchCallback``: a Watch on a Hugging Face ``Trainer`` (transformers 5.x), in one line.

    trainer = Trainer(..., callbacks=[tuiwatch.hf.TuiwatchCallback()])

One ledger step per optimizer step (``step_per="optimizer"``), made from the
Trainer's own events and the Watch's hooks:

- the Watch is made at ``on_train_begin`` on the Trainer's model, optimizer
  (Accelerate's wrapper: the hooks go on the optimizer inside) and scheduler;
- the **pre-clip norm** is the one the Trainer computes every optimizer step
  (``accelerator.clip_grad_norm_``, with ``max_grad_norm`` or with ``inf`` when
  it does not clip), kept by the Watch's clipping hook: it is not computed a
  second time and does not need ``logging_steps=1``;
- a **batch** is what the model's forward receives in training (a pre-hook
  with keyword arguments: ``input_ids``, ``attention_mask``, ``labels``), so
  shapes and the token count of ``attention_mask`` are recorded;
  micro-batches fold into their optimizer step;
- the **data wait** is the time from the end of the previous step (or of the
  logging, evaluation or saving after it) to ``on_step_begin``: the Trainer
  fetches a step's micro-batches just before it;
- the **loss** is the sum of the scalars ``backward()`` ran on during the
  step (loss.py): the Trainer's per-step training loss;
- ``on_evaluate``'s metrics are ``eval`` records (``eval_loss`` as ``loss``);
- a run resumed from a Trainer checkpoint (``train(resume_from_checkpoint=...)``)
  numbers its steps on from the checkpoint's ``global_step``, and links back to
  the ledger of the run that saved it (resumed.py): a file beside
  ``trainer_state.json`` in each ``checkpoint-N`` the Trainer saves;
- keys: ``c`` sets ``control.should_save`` (the Trainer's own checkpoint,
  which ``resume_from_checkpoint`` accepts), ``s`` sets
  ``control.should_training_stop`` (after that checkpoint), ``p`` pauses at
  the step's end, ``d`` dumps the last batch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as exc:  # named without transformers installed: one line that says what to install
    raise ImportError(f"tuiwatch.hf needs transformers 5 ({exc}): pip install 'tuiwatch[hf]'") from None

from tuiwatch.integrations import resumed
from tuiwatch.integrations.handed import HandedIds
from tuiwatch.integrations.loss import BackwardLoss
from tuiwatch.integrations.metrics import eval_metrics
from tuiwatch.publisher.hooks import ForwardHook
from tuiwatch.publisher.watch import Watch

NOT_SEEN = [
    "data wait is the time between steps, less logging, evaluation and saving (the Trainer prefetches a step)",
]


def _checkpoint_dir(args: Any, step: int) -> str:
    """Where the Trainer saves (and, by default, resumes) the checkpoint of ``step``."""
    return os.path.join(args.output_dir, f"checkpoint-{step}")


class TuiwatchCallback(TrainerCallback):  # type: ignore[misc]
    """A ``TrainerCallback`` that publishes the Trainer's steps to ``tuiwatch attach``.

    Keyword arguments go to the ``Watch`` (``name``, ``run_dir``,
    ``on_nonfinite``, ``rules``, ...); ``name`` defaults to ``args.run_name``.
    """

    def __init__(self, **watch_options: Any):
        self.options = watch_options
        self.watch: Watch | None = None
        self.loss = BackwardLoss()
        self._hook: Any = None
        self._handed: HandedIds | None = None  # the sample ids of the batches the Trainer's loader hands it
        self._idle_since = time.perf_counter()  # the previous step's end, or the logging/eval/save after it
        self._wait: float | None = None  # the data wait of the step about to open
        self._epoch: int | None = None  # to log at the step's opening
        self._args: Any = None
        self._state: Any = None
        self._control: Any = None

    # --- the run --------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.watch is not None or model is None:
            return
        options = {"name": getattr(args, "run_name", None) or Path(args.output_dir).name, **self.options}
        self.watch = Watch(
            model,
            kwargs.get("optimizer"),
            scheduler=kwargs.get("lr_scheduler"),
            step_per="optimizer",
            checkpoint_with=self._trainer_checkpoint,
            integration={"by": "tuiwatch.hf.TuiwatchCallback", "not_seen": NOT_SEEN},
            **options,
        )
        self._args, self._state, self._control = args, state, control
        if state.global_step:  # resumed from a checkpoint: the ledger goes on from its step, linked to its run
            step = int(state.global_step)
            saved = _checkpoint_dir(args, step)
            found = os.path.isdir(saved)
            rank = self.watch.run_record["rank"]
            where = resumed.read_sidecar(saved, rank) if found else None
            self.watch._continue_at(
                step, resumed.link(where, step=step, checkpoint=saved if found else None, rank=rank)
            )
        self.loss.install()
        loader = kwargs.get("train_dataloader")
        self._handed = HandedIds(loader) if loader is not None else None
        # ForwardHook: held weakly, and left out of copies of the model as the Watch's own hook is (pickling.py).
        self._hook = model.register_forward_pre_hook(ForwardHook(self._before_forward), with_kwargs=True)
        self._idle_since = time.perf_counter()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close("stopped" if self.watch is not None and self.watch.should_stop else "finished")

    def _close(self, reason: str) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._handed is not None:
            self._handed.remove()
            self._handed = None
        self.loss.remove()
        if self.watch is not None:
            self.watch.close(reason)
            self.watch = None

    # --- steps ----------------------------------------------------------------------

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._epoch = int(state.epoch or 0)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._wait = time.perf_counter() - self._idle_since

    def _before_forward(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        watch = self.watch
        if watch is None or not module.training or not torch.is_grad_enabled():
            return  # evaluation's forwards
        wait, self._wait = self._wait, None
        batch = kwargs or args
        ids = self._handed.take(batch) if self._handed is not None else None
        watch.step(batch, ids=ids, data_wait_s=wait, run_commands=False)  # at on_step_end, where the Trainer saves
        if self._epoch is not None:
            watch.log(epoch=self._epoch)
            self._epoch = None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loss = self.loss.take()
        if self.watch is not None and loss is not None:
            self.watch.log(loss=loss)  # before the update: a non-finite stop there names the loss

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        watch = self.watch
        if watch is None:
            return
        self._args, self._state, self._control = args, state, control
        watch.end_step()  # a viewer's c/d/p/s run here
        if watch.should_stop:
            control.should_training_stop = True
        self._idle_since = time.perf_counter()

    def _trainer_checkpoint(self) -> str:
        """``c`` and ``s``: the Trainer saves after this step's ``on_step_end``, where it always saves."""
        self._control.should_save = True
        return _checkpoint_dir(self._args, self._state.global_step)

    # --- what follows a step: logging, evaluation, saving (none of it data wait) -------

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._idle_since = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # This rank's link beside the checkpoint the Trainer just wrote: a run resumed from it links back here.
        resumed.write_sidecar(_checkpoint_dir(args, state.global_step), self.watch)
        self._idle_since = time.perf_counter()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        values = eval_metrics(metrics or {}, ("eval_",))
        if self.watch is not None and values:
            with self.watch.validation():
                self.watch.log(**values)
        self._idle_since = time.perf_counter()
