"""An optimizer that replaces the one a Watch was given: the loop built a new one over the same model.

Old scripts decay their lr by building a new optimizer at each epoch, and a
fine-tuning that unfreezes its backbone builds one over more of the model at
each stage. A Watch given the first read every later step without a gradient
norm, an lr or an update, and said nothing; ``tuiwatch run`` made a run per
optimizer. Now the Watch follows the new one (its hooks go on it, off the old
one) and says so in one line.

Taken for a replacement: an optimizer that steps on its own, not inside the
watched one's step (Lookahead's inner optimizer and SAM's, under a closure,
step there), and holds every parameter the watched one holds and none
outside the model. A GAN's other optimizer (another model), ``Muon`` beside
``AdamW`` (other parameters of the same model) and a student's optimizer
(another model) are not. Only a Watch of one optimizer follows.

One the watched optimizer holds as an attribute is its own inner one, stepped
outside its ``step()``: SAM's ``base_optimizer`` in a loop that calls
``first_step()`` and ``second_step()``, which never runs SAM's ``step()``.
Its hooks measured nothing there; now the base optimizer's steps are the
updates (the gradient norm is the one SAM's update applies, at the perturbed
point), and no line is said: the loop replaced nothing.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tuiwatch.publisher.optimizers import params_of

# The ModelHooks told of every optimizer's step. A tuple replaced whole, never changed: torch iterates its global
# hooks' dict while they run, and a Watch starts (tuiwatch run's, at a new optimizer's first step) or is collected
# (a gc.collect() there, any allocation's collection) inside that iteration: a hook registered or removed then
# raised "OrderedDict mutated during iteration" in the loop's optimizer.step(). So torch holds one hook, for good.
_told: tuple[weakref.ref[Any], ...] = ()
_installed = False


def install() -> None:
    """torch's global step pre-hook, registered once per process, before any hook of tuiwatch's can run."""
    global _installed
    if not _installed:
        register_optimizer_step_pre_hook(_an_optimizer_steps)
        _installed = True


def tell_steps(hooks: Any) -> _Told:
    """``hooks.an_optimizer_steps(optimizer)`` is called at every optimizer's step from now on, until the handle
    returned is removed or ``hooks`` collected."""
    install()
    return _Told(hooks)


class _Told:
    def __init__(self, hooks: Any) -> None:
        global _told
        self._ref = weakref.ref(hooks, _forget)
        _told = (*_told, self._ref)

    def remove(self) -> None:
        _forget(self._ref)


def _forget(ref: weakref.ref[Any]) -> None:
    global _told
    _told = tuple(r for r in _told if r is not ref)


def _an_optimizer_steps(optimizer: Any, args: Any, kwargs: Any) -> None:
    if torch.compiler.is_compiling():
        return  # (nothing to trace: a replacement is seen at an eager step)
    for ref in _told:
        hooks = ref()
        if hooks is not None:
            # Never the loop's optimizer.step() failing: a replacement not followed. (A try, free in the usual
            # case, where contextlib.suppress enters and leaves a context at every optimizer step.)
            try:  # noqa: SIM105
                hooks.an_optimizer_steps(optimizer)
            except Exception:  # noqa: S110
                pass


def held_by(watched: Any, candidate: Any) -> bool:
    """Whether ``candidate`` is an attribute of the watched optimizer: the optimizer it steps (SAM's
    ``base_optimizer``), not one that replaces it."""
    return any(value is candidate for value in getattr(watched, "__dict__", {}).values())


def replaces(candidate: Any, watched: Any, model_params: list[torch.Tensor]) -> bool:
    """Whether ``candidate`` (a torch optimizer stepping, not the watched one) holds every parameter ``watched``
    holds and only parameters of the model."""
    if not isinstance(candidate, torch.optim.Optimizer):
        return False
    mine, theirs = {id(p) for p in params_of(watched)}, {id(p) for p in params_of(candidate)}
    return bool(mine) and mine <= theirs and theirs <= {id(p) for p in model_params}


def scheduler_of(optimizer: Any, objects: list[Any] | None = None) -> Any:
    """The LR scheduler built on ``optimizer``, if the loop made one, among ``objects`` (by default one walk of the
    collector's: a few ms, once an optimizer is replaced)."""
    if objects is None:
        objects = gc.get_objects()
    # type(), not isinstance(): some module-level objects warn when their __class__ is read (torch.distributed's
    # reduce_op).
    return next((o for o in objects if issubclass(type(o), LRScheduler) and o.optimizer is optimizer), None)
