"""``tuiwatch run script.py``: a Watch on a training script nobody edited.

Nothing in the script names tuiwatch, so everything is found from torch's
side, through hooks and patches that last while the script runs:

- the **optimizer** is the first one whose ``step()`` runs (torch's global
  step pre-hook); at that moment the Watch is made, so the ledger's step 0 is
  the script's first optimizer step. Its hooks (pre-clip norm, lr, parameter
  and update norms, the non-finite check) are the Watch's own. Optimizers
  alive then that step the model's parameters and no others (torch's ``Muon``
  for the matrices beside ``AdamW`` for the rest) are watched with it. Once
  the script lets go of that optimizer (a sweep's trial, a teacher's
  ``train()`` returned), its run ends, and the next optimizer to step starts
  another run the same way;
- the **model** is the outermost module that holds the optimizer's
  parameters (the fewest other parameters if several do), or that holds
  them with those of the optimizers whose parameters the same backward
  gave gradients to (Muon over a GPT's blocks, AdamW over the rest); the LR
  scheduler and the GradScaler, the ones built on those optimizers, found
  once, then;
- a **step** ends when that optimizer's ``step()`` returns (torch's global
  post-hook), or after the optimizers watched with it have stepped too:
  viewer commands run there. Micro-batches before it fold into
  it (``step_per="optimizer"``). The next opens at the next training batch
  from a loader or, in a loop that draws none, at the model's next forward
  in training mode with gradients enabled: what runs between (validation,
  saving, logging) is no step's time;
- **data**: each batch drawn from a torch DataLoader while gradients are
  enabled and the model is in training mode is timed (data wait) and recorded
  (shapes, tokens, sample ids for a map-style loader); batches drawn in
  ``torch.no_grad()`` or with the model in ``eval()`` are validation's;
- the **loss** is what the update descends: the sum of the scalars
  ``backward()`` was called on since the last optimizer step (loss.py), less
  what another optimizer stepped on in between (a GAN's generator); for
  ``optimizer.step(closure)``, those of the closure's first call (LBFGS calls
  it again at each of its inner iterations).

What this cannot see is written in the run record (``integration``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import runpy
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from tuiwatch.errors import NonFiniteError, StopRequested
from tuiwatch.integrations.loss import BackwardLoss, on_new_subclasses, wrap_attribute
from tuiwatch.publisher import pickling, process, replaced
from tuiwatch.publisher.clipping import ClipBeforeTheWatch, unwatch_clipping, watch_clipping
from tuiwatch.publisher.closures import after_first_call, step_closure, with_closure
from tuiwatch.publisher.compiling import uncompiled
from tuiwatch.publisher.hooks import ForwardHook, is_forward_hook
from tuiwatch.publisher.loader import (
    IndexRecorder,
    draws_one_ahead,
    epoch_length,
    iter_owners,
    iter_with_ids,
    record_draws,
    resumable,
)
from tuiwatch.publisher.optimizers import inner_optimizer, params_of
from tuiwatch.publisher.pending import StepState
from tuiwatch.publisher.watch import Watch

# Steps of another optimizer in a row, the watched one not stepping, after which the script is taken to train
# another model (a teacher, then its student): at least this many, and three times the longest such run seen
# between two of the watched one's steps. Optimizers that take turns do so every step or every few (a GAN's,
# WGAN's critic 5 or 100 times a generator step), or many times in a row from the start (Spinning Up's VPG: its
# value function's 80 steps after each policy step): judged only once the watched one has stepped twice.
OTHERS_ALONE = 50

NOT_SEEN = [
    "validation metrics (eval records): the script computes them itself",
    "batches that do not come from a torch DataLoader, or that a thread of the script's draws ahead of the loop: no "
    "data wait, shapes or ids (the forward time and output check from the second step on)",
    "the first optimizer step's data wait and timing: the Watch starts at that step",
    "optimizers other than the first that steps, and their models (their losses are left out), except those that "
    "step parameters of its model alone (Muon beside AdamW): they are watched with it",
]


def _roots(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The modules that are no other module's child."""
    children = {id(c) for m in modules for c in m.children()}
    return [m for m in modules if id(m) not in children]


def find_model(optimizer: torch.optim.Optimizer, objects: list[Any]) -> torch.nn.Module:
    """The outermost module holding the optimizer's parameters; a wrapper of them when no module does.

    Where that module also holds parameters another optimizer steps (stable-baselines3's SACPolicy holds an
    actor and a critic, each with its own optimizer), the outermost module inside it that holds as many of this
    optimizer's and none of theirs: the norms are of the parameters this optimizer steps, not of the actor's
    gradients left from its last step.
    """
    wanted = {id(p) for p in params_of(optimizer)}
    stepped = _stepped_by_others(optimizer, objects) - wanted
    # type(), not isinstance(): some module-level objects warn when their __class__ is read.
    modules = [o for o in objects if issubclass(type(o), torch.nn.Module)]
    found, key = _most_of(_roots(modules), wanted, stepped)
    if found is not None and key[1]:
        inner, inner_key = _most_of(modules, wanted, stepped)
        if inner is not None and inner_key[:2] == (key[0], 0):
            found = inner
    if found is None:  # bare tensors: a module over them, for the norms and the checkpoint
        found = BareTensors(params_of(optimizer))
    return found


def _most_of(
    modules: list[torch.nn.Module], wanted: set[int], stepped: set[int]
) -> tuple[torch.nn.Module | None, tuple[int, int, int]]:
    """The module holding the most of ``wanted``, then the fewest that another optimizer steps (``stepped``), then
    the fewest of anyone else's; of modules that tie (a wrapper and the module it wraps), the outermost."""
    best: tuple[int, int, int] = (0, 0, 0)
    tied: list[torch.nn.Module] = []
    for module in modules:
        held = {id(p) for p in module.parameters()}
        covered = len(wanted & held)
        if not covered:
            continue
        key = (-covered, len(held & stepped), len(held) - covered)
        if not tied or key < best:
            best, tied = key, [module]
        elif key == best:
            tied.append(module)
    return (_roots(tied)[0] if tied else None), best


def other_optimizers(optimizer: torch.optim.Optimizer, objects: list[Any]) -> list[Any]:
    """The optimizers alive other than ``optimizer``, each once: the one that steps (a wrapper and the optimizer it
    wraps are one)."""
    found: dict[int, Any] = {}
    for o in objects:
        if issubclass(type(o), torch.optim.Optimizer):
            stepping = inner_optimizer(o)
            if stepping is not optimizer:
                found.setdefault(id(stepping), stepping)
    return list(found.values())


def _stepped_by_others(optimizer: torch.optim.Optimizer, objects: list[Any]) -> set[int]:
    """The ids of the parameters the optimizers alive other than ``optimizer`` hold."""
    return {id(p) for o in other_optimizers(optimizer, objects) for p in params_of(o)}


def model_of_one_backward(
    optimizer: torch.optim.Optimizer, others: list[Any], objects: list[Any]
) -> torch.nn.Module | None:
    """The outermost module holding the parameters of ``optimizer`` and of every other optimizer whose parameters
    already hold gradients when it first steps, if one holds them all; else None.

    Those gradients came from the same backward: Muon for a GPT's hidden matrices beside AdamW for its embedding
    and head, where ``find_model`` alone finds the blocks (a ModuleList that no forward runs through, which holds
    Muon's parameters and none of AdamW's). A GAN's generator, an actor beside its critic, get theirs from a
    backward of their own, after this first step: they are not in it.
    """
    wanted = {id(p) for p in params_of(optimizer)}
    filled = [params for params in map(params_of, others) if any(p.grad is not None for p in params)]
    if not filled:
        return None
    wanted.update(id(p) for params in filled for p in params)
    modules = [o for o in objects if issubclass(type(o), torch.nn.Module)]
    found, key = _most_of(_roots(modules), wanted, set())
    return found if found is not None and -key[0] == len(wanted) else None


def steps_beside(model: torch.nn.Module, others: list[Any]) -> list[Any]:
    """The optimizers among ``others`` that step parameters of ``model`` and nothing else (torch's ``Muon`` for its
    matrices beside ``AdamW`` for the rest), in the order of their first parameter in the model: watched with the
    first. A GAN's other optimizer, or an actor's beside a critic's, holds another module's parameters."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    found: list[tuple[int, Any]] = []
    for o in others:
        params = [id(p) for p in params_of(o)]
        if params and all(p in position for p in params):
            found.append((min(position[p] for p in params), o))
    return [o for _, o in sorted(found, key=lambda item: item[0])]


def same_backward_elsewhere(model: torch.nn.Module, others: list[Any], beside: list[Any]) -> str | None:
    """A line naming the optimizers whose parameters the first step's backward filled too, outside ``model``: one
    model trained by one loss, of which the Watch sees a part (where they are not a module apart from it, which
    :func:`parts_of_the_same_backward` finds: the translation tutorial's decoder). None when there are none.

    Called in the first optimizer step, when the gradients are there: a GAN's generator's come later.
    """
    inside = {id(p) for p in model.parameters()}
    filled = _filled_outside(others, beside, inside)
    if not filled:
        return None
    count = sum(p.numel() for o in filled for p in params_of(o) if id(p) not in inside)
    names = ", ".join(type(o).__name__ for o in filled)
    return (
        f"the same backward filled the gradients of {count:,} parameters outside {type(model).__name__} that "
        f"another optimizer ({names}) steps: they are not watched (their gradient and update norms, lr and "
        "checkpoint); a module that holds both parts and calls them in its forward, given to the Watch with both "
        "optimizers (the three lines), watches the whole model"
    )


def _filled_outside(others: list[Any], beside: list[Any], inside: set[int]) -> list[Any]:
    """The optimizers among ``others`` (not ``beside``) holding a gradient of a parameter not in ``inside``."""
    return [
        o for o in others if o not in beside and any(p.grad is not None and id(p) not in inside for p in params_of(o))
    ]


def parts_of_the_same_backward(
    model: torch.nn.Module, others: list[Any], beside: list[Any], objects: list[Any]
) -> list[torch.nn.Module]:
    """The modules, outside ``model``, of the optimizers whose parameters the first step's backward filled too
    (the translation tutorial's decoder beside its encoder), each the outermost holding its optimizer's
    parameters; none unless each such optimizer has one, apart from ``model`` and from each other.

    Called in the first optimizer step, when the gradients are there: a GAN's generator's come later.
    """
    inside = {id(p) for p in model.parameters()}
    parts: list[torch.nn.Module] = []
    for o in _filled_outside(others, beside, inside):
        part = find_model(o, objects)
        held = {id(p) for p in part.parameters()}
        if isinstance(part, BareTensors) or not held.isdisjoint(inside):
            return []
        inside |= held
        parts.append(part)
    return parts


def parts_of_one_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, objects: list[Any]
) -> list[torch.nn.Module]:
    """The modules holding what ``model`` does not of ``optimizer``'s parameters, where no module holds them all
    (one Adam over ``list(encoder.parameters()) + list(decoder.parameters())``, the encoder and the decoder apart):
    each the outermost holding the most of the rest, apart from ``model``, from each other and from other
    optimizers' parameters (none if one is not), and the tensors no module holds (a learnable scale beside the
    model, CLIP's) as a :class:`BareTensors`."""
    inside = {id(p) for p in model.parameters()}
    rest = {id(p) for p in params_of(optimizer)} - inside
    if not rest:
        return []
    roots = _roots([o for o in objects if issubclass(type(o), torch.nn.Module)])
    stepped = _stepped_by_others(optimizer, objects)
    parts: list[torch.nn.Module] = []
    while rest:
        part, key = _most_of(roots, rest, stepped)
        if part is None:
            parts.append(BareTensors([p for p in params_of(optimizer) if id(p) in rest]))
            break
        held = {id(p) for p in part.parameters()}
        if key[1] or not held.isdisjoint(inside):
            return []
        inside |= held
        rest -= held
        parts.append(part)
    return parts


def in_the_optimizers_order(modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> list[torch.nn.Module]:
    """``modules`` in the order of the first of ``optimizer``'s parameters each holds (the encoder, then the
    decoder, as the loop listed them)."""
    position = {id(p): i for i, p in enumerate(params_of(optimizer))}
    first = {id(m): min((position[id(p)] for p in m.parameters() if id(p) in position), default=0) for m in modules}
    return sorted(modules, key=lambda m: first[id(m)])


class ModelOfParts(torch.nn.Module):
    """Modules that one backward trains, each stepped by an optimizer of its own, and that no module holds (the
    translation tutorial's ``EncoderRNN`` and ``AttnDecoderRNN``): one model for the Watch. It has no forward, so
    the Watch watches its parts' forwards (publisher/parts.py); its norms, lr and checkpoints are all of theirs."""

    def __init__(self, parts: list[torch.nn.Module]):
        super().__init__()
        for part in parts:
            name = type(part).__name__
            while name in self._modules:
                name += "_"
            self.add_module(name, part)


def _another_holds_a_module(optimizer: torch.optim.Optimizer, objects: list[Any]) -> bool:
    """Whether an optimizer other than ``optimizer`` holds parameters of a module."""
    stepped = _stepped_by_others(optimizer, objects)
    if not stepped:
        return False
    held = {id(p) for o in objects if issubclass(type(o), torch.nn.Module) for p in o.parameters(recurse=False)}
    return not stepped.isdisjoint(held)


class BareTensors(torch.nn.Module):
    """The optimizer's tensors that no module holds, themselves: a tutorial's ``w`` and ``b``, SAC's entropy
    coefficient. ``nn.ParameterList`` made each plain tensor a new ``Parameter`` over its storage, whose ``.grad``
    backward never fills: every step's gradient norm was missing and ``grad-zero`` said "gradients are missing"."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        for i, t in enumerate(tensors):
            # register_parameter takes only a Parameter; the table takes any tensor (as torch.func's accessor does).
            self._parameters[str(i)] = t  # type: ignore[assignment]


def _how_found(model: torch.nn.Module, parts: list[torch.nn.Module], held_apart: list[torch.nn.Module]) -> str:
    """The run record's ``integration.model``: which module is the model, and why."""
    if not parts and not held_apart:
        return f"{type(model).__name__}: the outermost module holding the optimizer's parameters"
    names = ", ".join(type(m).__name__ for m in model.children())
    if parts:
        return (
            f"ModelOfParts: {names}, the modules one backward trains, each the outermost holding its optimizer's "
            "parameters"
        )
    return f"ModelOfParts: {names}, the modules that hold the optimizer's parameters, which no module holds all of"


def _built_on(optimizer: torch.optim.Optimizer, objects: list[Any]) -> tuple[Any, Any]:
    """The LR scheduler of this optimizer and a GradScaler, if the script made them (None otherwise)."""
    scheduler = replaced.scheduler_of(optimizer, objects)
    scaler = next((o for o in objects if issubclass(type(o), torch.amp.GradScaler)), None)
    return scheduler, scaler


class _Ahead:
    """A base iterator an adapter draws from one batch ahead of what it hands the loop."""

    __slots__ = ("batch", "drawn", "ids", "skip")

    def __init__(self, skip: int):
        self.batch: Any = None  # the last batch drawn, not handed over yet
        self.ids: list[int] | None = None
        self.drawn = 0
        self.skip = skip  # the first batches it draws and never hands over (resuming mid-epoch)

    def handed(self) -> bool:
        """Whether the last batch drawn is one the adapter hands over (when the next is drawn, or the drawing ends)."""
        return self.drawn > self.skip

    def first(self) -> bool:
        return self.drawn == self.skip + 1


class _Opened:
    """A step a batch drawn in training mode opened, until the optimizer steps."""

    __slots__ = ("epoch", "first", "training_forwards")

    def __init__(self, epoch: int, first: bool, training_forwards: int):
        self.epoch = epoch  # the tracker's epoch before it: what undoing the step puts back
        self.first = first  # it began an epoch
        self.training_forwards = training_forwards  # the model's forwards in training mode so far


class ScriptWatch:
    """The hooks and patches of ``tuiwatch run``, and the Watch they make at the first optimizer step."""

    def __init__(self, **watch_options: Any):
        self.options = watch_options
        self.runs = 0  # the Watches made
        self.held_at_end: Watch | None = None  # the current run's Watch, held once the script has returned
        self.declined = False  # the script has a Watch of its own: it is left to it
        self.loss = BackwardLoss()
        self.epochs = 0  # training epochs begun: a training loader's first batch of an iteration
        self._recorders: weakref.WeakKeyDictionary[Any, IndexRecorder] = weakref.WeakKeyDictionary()
        self._one_ahead: weakref.WeakKeyDictionary[Any, _Ahead] = weakref.WeakKeyDictionary()
        # The batches an epoch of an iterator that serves every epoch of its loader (loader.epoch_length), from
        # its first batch.
        self._epoch_lengths: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._building = threading.local()  # inside our own iter(loader): the real __iter__ runs
        # The datasets whose batches steps trained on. A batch from one drawn while the model is in eval mode may
        # be training's (the Trainer fetches the batches after an evaluation before it calls model.train()) or
        # an evaluation's on the training set (minGPT's adder): it is held until the model's next forward says.
        self._trained_on: weakref.WeakSet[Any] = weakref.WeakSet()
        self._first_data: Any = None  # before the Watch: the data whose iteration began last
        self._held: list[tuple[Any, Any, list[int] | None, float, bool]] = []  # (dataset, batch, ids, wait, first)
        self._held_hooks: list[tuple[Any, type]] = []  # (handle, the module class whose copies leave it out)
        self._pid = os.getpid()  # the script's own process: a child it forks inherits these hooks, not the watching
        self._passed: set[int] = set()  # optimizers over bare tensors left for one over a module's parameters
        self._clip = ClipBeforeTheWatch(lambda: self.watch is None and not self.declined)  # step 0's: before its Watch
        self._undo: list[Callable[[], None]] = []
        self._new_run()

    def _new_run(self) -> None:
        """What is kept about one run: none yet, or the next after the last ended (_next_run)."""
        # The Watch and its optimizer, held weakly: a script that trains one model after another lets go of the
        # first one's optimizer (a trial's, a teacher's train() returned), and with it the Watch (the optimizer's
        # hooks hold it), which ends its run (publisher/collected.py); the next optimizer to step starts another.
        self._watch: weakref.ref[Watch] | None = None
        self._optimizer: weakref.ref[torch.optim.Optimizer] | None = None
        self._others: weakref.WeakSet[Any] = weakref.WeakSet()  # other optimizers seen stepping in this run
        self._epochs_stepped = 0  # ``epochs`` when the watched optimizer last stepped
        self._step_opened = False  # a loader's batch (or, without one, the first training forward) opened it
        self._training_thread: int | None = None  # the thread the watched optimizer steps in, once it has
        self._step_dataset: Any = None
        # An evaluator may draw its first batch before it calls model.eval() (ignite's create_supervised_evaluator
        # does): drawn in training mode, it opens a step. If the model then runs forwards in eval mode only until
        # the next batch comes, that batch was the evaluation's, and its step is undone.
        self._opened: _Opened | None = None
        self._steps_ended = 0
        self._forward_hook: Any = None
        self._others_since = 0  # steps of other optimizers (not beside it) since the watched one last stepped
        self._longest_between = 0  # ... the most of them between two of its steps
        self._said_others = False
        # Optimizers stepping the same model beside the first (Muon beside AdamW), by id: the step ends after them.
        self._beside: set[int] = set()
        self._ending: StepState | None = None  # the step the first optimizer stepped in, until the others have
        self._ending_left = 0

    # --- installing ------------------------------------------------------------------

    def install(self) -> None:
        self._undo.append(register_optimizer_step_pre_hook(uncompiled(self._before_step)).remove)
        # Now, not when the first Watch starts inside the hook above (torch iterates its global hooks meanwhile), and
        # after it: the hook above meets a replacing optimizer before its Watch's hooks are on it.
        replaced.install()
        self._undo.append(register_optimizer_step_post_hook(uncompiled(self._after_step)).remove)
        self.loss.install()
        self._undo.append(self.loss.remove)
        # Before the script runs: a script that imports clip_grad_norm_ by name (at its top) gets the wrapper, whose
        # norm is the one before clipping; with the wrappers put on by the Watch, every step's was after clipping.
        watch_clipping(self._clip)
        self._undo.append(lambda: unwatch_clipping(self._clip))
        self._undo.append(wrap_attribute(DataLoader, "__iter__", self._iter))
        self._undo.append(wrap_attribute(_BaseDataLoaderIter, "__next__", self._next))
        # torchdata's StatefulDataLoader makes its iterator without DataLoader.__iter__: its own gets the recorder
        # too, whether it was imported before the script ran or by the script (its steps had no ids).
        for owner in iter_owners():
            self._record_own_iter(owner)
        self._undo.append(on_new_subclasses(DataLoader, self._record_own_iter))

    def _record_own_iter(self, loader_class: type) -> None:
        if resumable(loader_class):
            self._undo.append(wrap_attribute(loader_class, "__iter__", self._iter))

    def remove(self) -> None:
        self._drop_held()
        while self._undo:
            self._undo.pop()()

    def close(self, reason: str) -> None:
        """End the run. At a normal end, an open step that no optimizer step closed and that backpropagated
        nothing is no step: a batch the script drew in training mode after its last step (pytorch/examples'
        mnist_forward_forward draws its test batch so) would be a last step with no loss and its evaluation as
        compute. A run that fails keeps it: that is the step it failed in; so is one that backpropagated."""
        watch = self.watch
        if watch is None:
            return
        s = watch._tracker.cur
        if reason == "finished" and s is not None and self._untrained(s):
            watch._tracker.discard()
        elif s is not None and s.opt_step is None:
            # What it backpropagated with no optimizer step after (the script's last micro-batches; the step a
            # script's own error ended) is its loss, as a step's is.
            loss = self.loss.take()
            if loss is not None:
                watch.log(loss=loss)
        watch.close(reason)

    def _untrained(self, s: StepState) -> bool:
        """Whether the open step ``s`` neither backpropagated nor stepped the optimizer."""
        return s.opt_step is None and self.loss.total is None

    def _next_run(self) -> None:
        """The watched optimizer is gone (its Watch, collected, has ended its run): what was kept about the run is
        forgotten before the next optimizer to step starts another (the next trial of a sweep, a student after its
        teacher). The Watch went with its optimizer (it holds it): nothing to collect."""
        if self._forward_hook is not None:
            self._forward_hook.remove()  # the last model's step opener
        self._drop_held()
        # Epochs begun since the last run's last step are the next run's, at least the one its first step is in: its
        # first batch was drawn before this step, often while the last run's model, still there and in eval mode
        # after its last validation, made it look like a validation batch (not counted).
        self.epochs = max(self.epochs - self._epochs_stepped, 1)
        self._new_run()

    # --- the optimizer: the Watch's start, and each step's end ------------------------

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        watched = self.optimizer
        if watched is None and not self.declined:
            if self.runs:
                self._next_run()  # the watched optimizer is gone, and its run ended with it
            self._start(optimizer)
            watched = self.optimizer
        elif optimizer is not watched and not self.declined and optimizer not in self._others:
            self._others.add(optimizer)
            if self._follows(optimizer):
                # A new optimizer over the same model (an lr decayed by building one an epoch, a stage of gradual
                # unfreezing): the run goes on with it (publisher/replaced.py).
                self._optimizer = weakref.ref(optimizer)
                watched = optimizer
            else:
                # A new optimizer (once each): is the watched one's script done with it? A trial's or a teacher's is
                # garbage in a cycle (it and the Watch its hooks hold) until a collection, so one is made now.
                watched = None  # (not held here meanwhile)
                gc.collect()
                if self.optimizer is None:
                    self._next_run()
                    self._start(optimizer)
                    watched = self.optimizer
        watch = self.watch
        if optimizer is not watched or watch is None:
            return None
        self._end_pending(watch)  # an optimizer beside it did not step last time: that step ends here
        self.loss.held = False  # (a step that raised after its closure's first call never reached take())
        closure = step_closure(args, kwargs)
        if closure is None:
            # The loss is complete: the step has it before the Watch's pre-hook checks the gradients, so a step that
            # stops there (a non-finite gradient) records the loss that made them.
            loss = self.loss.take()
            if loss is not None:
                watch.log(loss=loss)
            return None
        # LBFGS evaluates its closure many times a step: the loss is what the first call (at the step's weights)
        # backpropagated, as the value step() returns.
        return with_closure(args, kwargs, after_first_call(closure, self.loss.hold))

    def _follows(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the run's Watch takes ``optimizer`` for one that replaced its own (and now watches it)."""
        watch = self.watch
        try:
            return watch is not None and not self._beside and watch.follow(optimizer)
        except Exception:  # never the script's optimizer.step() failing: taken for another optimizer, as before
            return False

    def _start(self, optimizer: torch.optim.Optimizer) -> None:
        if os.getpid() != self._pid:
            # A forked child (hogwild's workers): N children would be N runs of one name, and none of them the
            # script's own run. The script's process only; a child is watched by the three lines in its function.
            self.declined = True
            self.loss.enabled = False
            child = f"tuiwatch run: an optimizer stepped in a child process (pid {os.getpid()}); "
            print(child + "tuiwatch run watches the script's own process only: put the three lines in the function "
                  "the child runs", file=sys.stderr)  # fmt: skip
            return
        if process.watches:
            self.declined = True
            self.loss.enabled = False
            print("tuiwatch run: the script makes a Watch of its own; tuiwatch run adds none", file=sys.stderr)
            return
        objects = gc.get_objects()  # what the script built, to find its model, scheduler and scaler
        model = find_model(optimizer, objects)
        if (
            isinstance(model, BareTensors)
            and id(optimizer) not in self._passed
            and _another_holds_a_module(optimizer, objects)
        ):
            # SAC (stable-baselines3) steps its entropy coefficient's optimizer, over one plain tensor, before its
            # critic's and actor's: a run of one parameter. The next optimizer is watched instead, or this one if
            # it steps again first.
            self._passed.add(id(optimizer))
            return
        self._optimizer = weakref.ref(optimizer)
        others = other_optimizers(optimizer, objects)
        model = model_of_one_backward(optimizer, others, objects) or model
        held_apart = [] if isinstance(model, BareTensors) else parts_of_one_optimizer(model, optimizer, objects)
        if held_apart:  # one optimizer over modules no module holds: one model of them all
            model = ModelOfParts(in_the_optimizers_order([model, *held_apart], optimizer))
        beside = [] if isinstance(model, BareTensors) else steps_beside(model, others)
        parts = [] if isinstance(model, BareTensors) else parts_of_the_same_backward(model, others, beside, objects)
        if parts:  # one loss over modules no module holds: watched together, every optimizer with the first
            model = ModelOfParts([*(model.children() if held_apart else [model]), *parts])
            beside = steps_beside(model, others)
        left_out = same_backward_elsewhere(model, others, beside)
        optimizers = [optimizer, *beside]
        found = [_built_on(o, objects) for o in optimizers]
        schedulers = [scheduler for scheduler, _ in found if scheduler is not None]
        scaler = found[0][1]
        del objects
        integration = {
            "by": "tuiwatch run",
            "model": _how_found(model, parts, held_apart),
            "loss": "the sum of the scalars backward() was called on between two optimizer steps, less those another "
            "optimizer stepped on (with step(closure): those of the closure's first call)",
            "not_seen": NOT_SEEN + ([left_out] if left_out else []),
        }
        # Made inside this step's pre-hooks: torch runs the optimizer's own pre-hooks after the global ones, so
        # the Watch's (registered now) already measure this step.
        try:
            watch = Watch(
                model,
                optimizers if beside else optimizer,
                scheduler=schedulers if len(schedulers) > 1 else next(iter(schedulers), None),
                scaler=scaler,
                step_per="optimizer",
                stop="raise",
                integration=integration,
                **self.options,
            )
        except Exception as exc:  # an unwritable run directory, say: the script must run on all the same
            self.declined = True
            self.loss.enabled = False
            print(f"tuiwatch run: cannot watch this run ({exc}); it runs unwatched", file=sys.stderr)
            return
        self._watch = weakref.ref(watch)
        self._training_thread = threading.get_ident()
        self.runs += 1
        clip = self._clip.take()
        if clip is not None:
            watch._hooks.clipped(*clip)  # this step's norm before the script clipped it
        self._beside = {id(o) for o in beside}
        if left_out:
            print(f"tuiwatch run: {left_out}", file=sys.stderr)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        watch = self.watch
        if watch is None:
            self._clip.take()  # a clip before this step is not the next one's
            if id(optimizer) in self._passed:
                self.loss.take()  # what it stepped on is not the loss of the step the Watch will start in
            return
        if optimizer is not self.optimizer:
            # Another optimizer (a GAN's generator's) stepped on what was backpropagated since ours did: not our loss.
            self.loss.take()
            if id(optimizer) in self._beside:
                if self._ending is not None and watch._tracker.cur is self._ending:
                    self._ending_left -= 1
                    if not self._ending_left:
                        self._end_pending(watch)  # the last optimizer of the step has stepped
            else:
                self._another_steps_alone(watch, optimizer)
            return
        if self._steps_ended:
            self._longest_between = max(self._longest_between, self._others_since)
        self._others_since = 0
        loss = self.loss.take()  # a closure's first call's (the others were taken before the step)
        if loss is not None:
            watch.log(loss=loss)
        self._opened = None  # an optimizer step: its batches were training's
        self._steps_ended += 1
        self._epochs_stepped = self.epochs
        if not self._step_opened and self._steps_ended > 1 and self._forward_hook is None:
            self._open_steps_at_forwards(watch)
        if self._step_dataset is not None:
            with contextlib.suppress(TypeError):  # (a dataset that cannot be weakly referenced is not remembered)
                self._trained_on.add(self._step_dataset)
        self._step_opened, self._step_dataset = False, None
        if self._beside:
            # The optimizers beside it step next, in this step: it ends after the last of them (or, if one does not
            # step, at the next boundary: a batch, a training forward, this optimizer's next step).
            self._ending, self._ending_left = watch._tracker.cur, len(self._beside)
            return
        watch.end_step()  # raises StopRequested when a viewer asked the run to stop

    def _another_steps_alone(self, watch: Watch, optimizer: torch.optim.Optimizer) -> None:
        """Another optimizer stepped and the watched one has not since: once that has happened many times in a row
        (``OTHERS_ALONE``, above), the script trains another model now (a teacher, then its student), and one line
        says it is not watched."""
        opened = self._opened
        if opened is not None:
            # The batch that opened the step, the watched model not trained on it, was this optimizer's (a
            # student's, drawn from the loader the teacher trained on): no step, as an evaluation's is not. Left
            # open, every later batch folded into it, its ids one list without end.
            self._undo_if_unused(watch, opened, peeked=True)
            if watch._tracker.cur is not None:
                self._opened = opened  # the watched model trains in it too (accumulating): still its step
        self._others_since += 1
        alone = max(OTHERS_ALONE, 3 * self._longest_between)
        if self._others_since != alone or self._steps_ended < 2 or self._said_others:
            return
        self._said_others = True
        last = watch._tracker.last_step_number()
        print(
            f"tuiwatch run: another optimizer ({type(optimizer).__name__}) has stepped {alone} times since the "
            f"watched one ({type(self.optimizer).__name__} over {type(watch.model).__name__}) last did, at step "
            f"{last}: its model is not watched. A script that trains one model after another (a teacher, then its "
            "student) is watched for the next once it lets go of the first one's optimizer; while it keeps it, the "
            "three lines in the second's loop watch that one",
            file=sys.stderr,
        )

    def _end_pending(self, watch: Watch) -> None:
        """End the step the first optimizer stepped in, unless a boundary has ended it since."""
        ending, self._ending = self._ending, None
        if ending is not None and watch._tracker.cur is ending:
            watch.end_step()  # raises StopRequested when a viewer asked the run to stop

    def _open_steps_at_forwards(self, watch: Watch) -> None:
        """No loader batch opened this step (the first one's was drawn before the Watch existed): from now on the
        model's first training forward after a step's end opens the next, so that what the loop does in between
        (nanoGPT evaluates and saves at the top of its loop) is no step's compute time."""
        # ForwardHook: held weakly, and left out of copies of the model as the Watch's own hook is (pickling.py).
        # On the modules whose forwards the Watch sees: the model, or the parts a loop calls instead (parts.py).
        for module in watch._hooks.forward_modules():
            handle = module.register_forward_pre_hook(ForwardHook(self._before_forward), with_kwargs=True)
            self._forward_hook = handle
            self._undo.append(handle.remove)

    def _before_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if self._step_opened or not module.training or not torch.is_grad_enabled():
            return  # a micro-batch of the open step, or evaluation's forwards
        watch = self.watch
        if watch is not None:
            self._step_opened = True
            watch.step(run_commands=False)  # a viewer's commands still run where steps end
            if self.epochs and watch._tracker.epoch != self.epochs - 1:
                watch.log(epoch=self.epochs - 1)  # begun by a loader a background thread draws from (_next)

    # --- the data ---------------------------------------------------------------------

    def _iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __iter__(loader: DataLoader[Any]) -> Any:
            building = self._building
            if getattr(building, "active", False) or getattr(loader, "base_dataloader", None) is not None:
                return original(loader)  # our own iter(), or Accelerate's adapter (its base loader comes here)
            building.active = True
            try:
                it, recorder = iter_with_ids(loader, original)  # (torch's __iter__ was called: a subclass's super())
            finally:
                building.active = False
            if recorder is not None:
                self._recorders[it] = recorder
            adapter = sys._getframe(1).f_locals.get("self")  # who asked: Accelerate's DataLoaderShard, say
            if draws_one_ahead(adapter, loader):
                # Each batch is taken when the next is drawn, and the last when the drawing ends (Accelerate also
                # skips the first skip_batches when it resumes mid-epoch).
                self._one_ahead[it] = _Ahead(skip=int(getattr(adapter, "skip_batches", 0) or 0))
            return it

        return __iter__

    def _next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter

        def __next__(it: Any) -> Any:
            if self._training_thread is not None and threading.get_ident() != self._training_thread:
                # A thread drawing batches ahead into a queue (prefetch_generator's BackgroundGenerator): which step
                # trains on a batch is not known here, and ids paired with the wrong step are worse than none. The
                # steps open at the model's training forwards instead (_before_forward), without batch facts.
                batch = original(it)
                recorder = self._recorders.get(it)
                if recorder is not None:
                    recorder.pop()  # (not kept: an epoch's worth of ids would pile up)
                if self._begins_epoch(it):
                    self.epochs += 1
                return batch
            ahead = self._one_ahead.get(it) if self._one_ahead else None
            t0 = clock()
            try:
                batch = original(it)
            except StopIteration:
                if ahead is not None and ahead.handed():  # the adapter hands the loop its last batch now
                    self._took(it, ahead.batch, ahead.ids, clock() - t0, ahead.first())
                    ahead.drawn = ahead.skip = 0  # (an iterator asked again after its end hands nothing more)
                raise
            wait = clock() - t0
            recorder = self._recorders.get(it)
            ids = recorder.pop() if recorder is not None else None
            first = self._begins_epoch(it)
            if first and self._epoch_lengths and it in self._epoch_lengths:
                # An iterator that serves every epoch: iter() was not called for this one, so who draws it is asked
                # here. timm's PrefetchLoader draws one ahead of what it hands the loop; the epoch's last batch is
                # handed after the drawing, with no draw to tell: its step opens at its forward, without batch facts.
                ahead = self._ahead_this_epoch(it, sys._getframe(1))
            if ahead is None:
                self._took(it, batch, ids, wait, first)
                return batch
            if ahead.handed():  # drawing this one is when the adapter hands over the one before
                self._took(it, ahead.batch, ahead.ids, wait, ahead.first())
            ahead.batch, ahead.ids = batch, ids
            ahead.drawn += 1
            return batch

        return __next__

    def _ahead_this_epoch(self, it: Any, caller: Any) -> _Ahead | None:
        """A fresh :class:`_Ahead` for ``it`` when the loader's ``__iter__`` (``caller``, the frame that called
        ``next()`` on it) is drawn from by an adapter that draws one ahead; else None."""
        self._one_ahead.pop(it, None)
        try:
            adapter_frame = caller.f_back if caller is not None else None
            loader = caller.f_locals.get("self") if caller is not None else None
            adapter = adapter_frame.f_locals.get("self") if adapter_frame is not None else None
            if loader is None or adapter is None or not draws_one_ahead(adapter, loader):
                return None
        except Exception:  # never the loop's failure: taken as drawn by the loop itself
            return None
        ahead = self._one_ahead[it] = _Ahead(skip=0)
        return ahead

    def _begins_epoch(self, it: Any) -> bool:
        """Whether the batch ``it`` handed out last is an epoch's first: its first, or (an iterator that serves every
        epoch: YOLOv5's InfiniteDataLoader, timm's MultiEpochsDataLoader) the first after a whole epoch's."""
        handed = getattr(it, "_num_yielded", None)
        if handed == 1:
            with contextlib.suppress(Exception):  # (an iterator of another torch's making: epochs as before)
                length = epoch_length(getattr(it, "_index_sampler", None))
                if length is not None:
                    self._epoch_lengths[it] = length
                    if it not in self._recorders:
                        # Made some other way than iter(loader), which would have put a recorder in (Ultralytics'
                        # reset(), at close_mosaic: self.iterator = self._get_iterator()): its next batches' ids.
                        recorder = record_draws(it)
                        if recorder is not None:
                            self._recorders[it] = recorder
            return True
        length = self._epoch_lengths.get(it) if self._epoch_lengths else None
        return length is not None and handed is not None and (handed - 1) % length == 0

    def _took(self, it: Any, batch: Any, ids: list[int] | None, wait: float, first: bool) -> None:
        """The loop was handed ``batch`` after waiting ``wait``: a training step's (or validation's, or skipped)."""
        watch = self.watch
        dataset = getattr(it, "_dataset", None)
        if not torch.is_grad_enabled() or (watch is not None and not watch.model.training):
            if watch is not None and self._trains_on(dataset):
                self._hold(watch, (dataset, batch, ids, wait, first))
            return  # validation's, or held until the next forward tells
        if self._held:  # batches drawn for an evaluation on the training set: no forward in training mode came
            self._drop_held()
        self._open(dataset, batch, ids, wait, first)

    def _open(self, dataset: Any, batch: Any, ids: list[int] | None, wait: float, first: bool) -> None:
        """A step for ``batch``, or one more micro-batch of the open one."""
        watch, opened = self.watch, self._opened
        again = first and dataset is not None  # a new iteration of this data: a peek at it if nothing used the last
        if opened is not None and watch is not None:
            self._undo_if_unused(watch, opened, peeked=again and dataset is self._step_dataset)
        if watch is None and again:
            # Nothing has stepped yet (the first optimizer step makes the Watch): a second iteration of the same
            # data began an epoch that the first one, a peek, had not.
            first = dataset is not self._first_data
            self._first_data = dataset
        self.epochs += first  # an epoch's first batch (a persistent iterator's too)
        if watch is not None:
            tracker = watch._tracker
            step, epoch = tracker.step, tracker.epoch
            self._step_opened = True
            self._step_dataset = dataset
            watch.step(batch, ids=ids, data_wait_s=wait)
            if first:
                watch.log(epoch=self.epochs - 1)
            if tracker.step != step:  # a new step, not a micro-batch folded into the open one
                self._opened = _Opened(epoch, first, tracker.training_forwards)

    def _undo_if_unused(self, watch: Watch, opened: _Opened, *, peeked: bool) -> None:
        """The step the last batch opened is no step if nothing was trained since and either the model ran
        forwards, none in training mode (that batch was an evaluation's first: the Watch's forward hook counts the
        forwards), or, with ``peeked``, the model ran no forward at all before a new iteration of the same data
        began (``len(next(iter(loader))[0])``, a batch size read off a batch that no step trains on). An
        evaluation between a step's draw and its training forward (nanoGPT evaluates there) leaves it be."""
        self._opened = None
        tracker = watch._tracker
        s = tracker.cur
        if s is None or tracker.training_forwards != opened.training_forwards or not self._untrained(s):
            return
        if not s.forwards and not peeked:
            return
        tracker.discard()
        tracker.epoch = opened.epoch
        self.epochs -= opened.first
        self._step_opened, self._step_dataset = False, None

    def _hold(self, watch: Watch, drawn: tuple[Any, Any, list[int] | None, float, bool]) -> None:
        self._held.append(drawn)
        if not self._held_hooks:
            # On the model and the module a wrapper holds (DDP's and DataParallel's .module, torch.compile's
            # _orig_mod): a script evaluates through either. Before any other pre-hook (the one that opens a step at
            # a training forward): these batches open it.
            model = watch.model
            inner = getattr(model, "module", None)
            if not isinstance(inner, torch.nn.Module):
                inner = getattr(model, "_orig_mod", None)
            for target in (model, inner) if isinstance(inner, torch.nn.Module) else (model,):
                hook = ForwardHook(self._forward_after_held)
                handle = target.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)
                # Left out of copies meanwhile (an EMA copy made while evaluating), as the Watch's own hook is.
                pickling.hide_hooks(type(target), is_forward_hook)
                self._held_hooks.append((handle, type(target)))

    @property
    def watch(self) -> Watch | None:
        return self._watch() if self._watch is not None else None

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self._optimizer() if self._optimizer is not None else None

    def _forward_after_held(self, module: Any, args: Any, kwargs: Any) -> None:
        """The model's first forward since batches were held: in training mode, they were a step's."""
        held = self._held
        self._drop_held()
        if module.training and torch.is_grad_enabled():
            for drawn in held:
                self._open(*drawn)

    def _drop_held(self) -> None:
        while self._held_hooks:
            handle, cls = self._held_hooks.pop()
            handle.remove()
            pickling.show_hooks(cls)
        self._held = []

    def _trains_on(self, dataset: Any) -> bool:
        """Whether steps have trained on ``dataset`` (not weak-referable: no)."""
        try:
            return dataset in self._trained_on
        except TypeError:
            return False


def run_script(
    target: str, args: list[str], *, module: bool, report: Callable[[str], None], **watch_options: Any
) -> int:
    """Run ``target`` (a path, or a module with ``module=True``) as ``python target args`` would, watched.

    The exit status is the script's. A viewer's stop ends it with 0 and one
    line; an exception in it prints its own traceback and gives 1.
    """
    hooks = ScriptWatch(**watch_options)
    hooks.install()
    status, reason = 0, "finished"
    try:
        with _as_main(target, args, module=module) as run:
            try:
                run()
            finally:
                # The script is done (or failing): its last run ends with its reason, below, not when its optimizer,
                # a global of the script's namespace now being let go of, is collected.
                hooks.held_at_end = hooks.watch
    except SystemExit as exc:
        status = _exit_status(exc.code)
        reason = "finished" if status == 0 else process.end_reason(SystemExit)
    except StopRequested as exc:
        reason = "stopped"
        report(f"tuiwatch run: {exc}; the script was ended there")
    except NonFiniteError as exc:
        status, reason = 1, "nonfinite"
        report(f"tuiwatch run: {exc}")
    except KeyboardInterrupt:
        status, reason = 130, "stopped"
        _print_script_traceback(target)
    except BaseException as exc:  # the script's own failure: its traceback, as python prints it
        status, reason = 1, process.end_reason(type(exc))
        _print_script_traceback(target)
    finally:
        hooks.remove()
        if hooks.watch is not None:
            hooks.close(reason)
        elif hooks.runs:
            pass  # each run ended when the script let go of its optimizer
        elif status != 0:
            # A script that failed before training (a bad argument, a missing file): its own error says why;
            # the advice below would send its user to the three lines for nothing.
            report(f"tuiwatch run: the script ended (exit status {status}) before any torch optimizer stepped, so "
                   "nothing was watched")  # fmt: skip
        elif not hooks.declined and "fastai.optimizer" in sys.modules:
            # fastai's Learner steps an Optimizer of fastai's own (its default opt_func, Adam), not a torch one.
            report("tuiwatch run: no torch optimizer stepped in this script's process, so nothing was watched; "
                   "fastai's own optimizers are not torch's: a Learner given opt_func=partial(OptimWrapper, "
                   "opt=torch.optim.AdamW) (from fastai.optimizer) steps a torch optimizer, which tuiwatch run "
                   "watches")  # fmt: skip
        elif not hooks.declined:
            # A loop that updates its weights by hand (p.data.add_(p.grad, ...)) has no step to find.
            report("tuiwatch run: no torch optimizer stepped in this script's process, so nothing was watched; a "
                   "loop that updates the weights itself, or trains in processes the script starts (torch."
                   "multiprocessing, mp.spawn), needs the three lines (docs/integrations.md)")  # fmt: skip
    return status


@contextmanager
def _as_main(target: str, args: list[str], *, module: bool) -> Iterator[Callable[[], Any]]:
    """``sys.argv`` and ``sys.path[0]`` as python sets them for ``python target args`` (or ``-m target``)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        sys.argv = [target, *args]  # for -m, runpy puts the module's file in argv[0]
        # sys.path[0] is tuiwatch's own bin directory here; python's is the script's directory (-m: the cwd).
        sys.path[0] = str(Path.cwd() if module else Path(target).resolve().parent)
        if module:
            yield lambda: runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            yield lambda: runpy.run_path(target, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _exit_status(code: Any) -> int:
    """What python exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): printed, status 1
    return 1


def _print_script_traceback(target: str) -> None:
    """The traceback from the script's first frame on: tuiwatch's and runpy's frames above it are not the script's."""
    exc_type, exc, tb = sys.exc_info()
    ours = (str(Path(__file__).resolve()), runpy.__file__, "<frozen runpy>")
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
