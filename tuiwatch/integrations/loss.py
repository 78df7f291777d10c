"""The loss of a loop that does not log it: the scalars ``backward()`` runs on, summed until the optimizer steps.

That sum is what the update descends: with gradient accumulation, a loop that
divides each micro-batch's loss by N gets the mean, one that does not gets the
sum, and a Trainer's per-step loss is the same sum. ``Tensor.backward``,
``torch.autograd.backward`` and ``GradScaler.scale`` are wrapped while a
:class:`BackwardLoss` is installed; a tensor that ``scale`` returned counts as
the loss it scaled.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import torch


def wrap_attribute(owner: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    """Replace ``owner.name`` with ``make(original)``; returns what puts the original back."""
    original = owner.__dict__[name]
    setattr(owner, name, make(original))
    return lambda: setattr(owner, name, original)


def on_new_subclasses(base: type, found: Callable[[type], None]) -> Callable[[], None]:
    """Call ``found(cls)`` for each subclass of ``base`` defined from now on (in a module the script imports later);
    returns what stops it. ``found`` failing never fails the class."""
    own = vars(base).get("__init_subclass__")  # (a classmethod, where base has one of its own)

    def __init_subclass__(cls: Any, /, **kwargs: Any) -> None:
        if own is not None:
            own.__get__(None, cls)(**kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]  # (Generic's, for a DataLoader)
        with contextlib.suppress(Exception):
            found(cls)

    base.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    if own is not None:
        return lambda: setattr(base, "__init_subclass__", own)
    return lambda: delattr(base, "__init_subclass__")


class BackwardLoss:
    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.enabled = True
        self.held = False  # the step's loss is complete (a closure's first call returned): nothing more counts
        self.unreadable = False  # a loss of this step could not be added: the step has none
        self._scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None
        self._in_tensor_backward = False  # Tensor.backward calls torch.autograd.backward: counted once
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        self._undo.append(wrap_attribute(torch.Tensor, "backward", self._backward))
        self._undo.append(wrap_attribute(torch.autograd, "backward", self._autograd_backward))
        self._undo.append(wrap_attribute(torch.amp.GradScaler, "scale", self._scale))

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def add(self, loss: torch.Tensor) -> None:
        """One more scalar into the step's sum (what the wrapped backward does; a framework that hands the loss
        over calls it itself, without installing anything). Runs inside the loop's backward: never raises."""
        if self.unreadable:
            return
        try:
            value = loss.detach()
            total = self.total
            if total is not None and value.device != total.device:
                # A model split over devices backpropagates a loss on each: summed on the first one's device (an
                # asynchronous copy). Two 1-element tensors on two devices cannot be added as they are.
                value = value.to(total.device, non_blocking=True)
            self.total = value if total is None else total + value  # on the device: no sync
        except Exception:  # (a loss torch cannot copy or add): this step records no loss rather than a part of it
            self.total, self.unreadable = None, True

    def hold(self) -> None:
        """Count nothing more until the next :meth:`take`."""
        self.held = True

    def take(self) -> torch.Tensor | None:
        """The sum since the last take (None when nothing was backpropagated, or a loss could not be read); starts
        the next."""
        total, self.total = self.total, None
        self.held = self.unreadable = False
        return total

    def _count(self, tensor: torch.Tensor) -> None:
        try:
            one = tensor.numel() == 1
        except Exception:  # a tensor of ragged parts has no element count: no loss (its backward is torch's to judge)
            return
        if self.enabled and not self.held and one:
            scaled = self._scaled
            self.add(scaled[1] if scaled is not None and scaled[0]() is tensor else tensor)

    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self._count(tensor)
            outer, self._in_tensor_backward = self._in_tensor_backward, True
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._in_tensor_backward = outer

        return backward

    def _autograd_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
            # Called directly (a loop's torch.autograd.backward(loss)): its scalars with the implicit gradient of
            # one are the loss; weighted ones (grad_tensors given) are not a loss to record.
            weighted = grad_tensors is not None or kwargs.get("grad_variables") is not None
            if not self._in_tensor_backward and not weighted:
                # A tensor or a list or tuple of them (an iterator is not looked into: it would be used up).
                many = tensors if isinstance(tensors, list | tuple) else (tensors,)
                for tensor in many:
                    if isinstance(tensor, torch.Tensor):
                        self._count(tensor)
            return original(tensors, grad_tensors, *args, **kwargs)

        return backward

    def _scale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def scale(scaler: Any, outputs: Any) -> Any:
            result = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor):
                self._scaled = (weakref.ref(result), outputs)
            return result

        return scale
