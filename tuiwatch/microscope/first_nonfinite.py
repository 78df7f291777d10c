"""``first_nonfinite_module``: from "step 37 went NaN" to "layer3.conv2 made it"."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tuiwatch.publisher.nested import tensors


@dataclass
class NonFiniteSite:
    """Where a forward pass first went non-finite.

    ``module`` is the first module (in the order modules finish) whose output
    holds a NaN or inf; ``input_module`` the first module (in the order they
    are called) whose input already did, ``""`` being the model itself, so
    ``input_module == ""`` means the batch was bad before the model saw it.
    """

    module: str | None
    module_type: str | None
    input_module: str | None
    batch_finite: bool
    output_finite: bool

    def __str__(self) -> str:
        if self.batch_finite and self.module is None:
            return "every module's output is finite on this batch"
        parts = [] if self.batch_finite else ["the batch itself holds NaN/inf"]
        if self.module is not None:
            parts.append(f"first non-finite output: {self.module or '(the model)'} ({self.module_type})")
        return "; ".join(parts)


def _finite(obj: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors(obj) if t.is_floating_point() or t.is_complex())


def _call(model: torch.nn.Module, batch: Any) -> Any:
    """The model on the batch's inputs: a tensor as is, (inputs, targets...) by its first item, a dict by keyword."""
    if isinstance(batch, list | tuple):
        return model(batch[0])
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(batch)


def first_nonfinite_module(
    model: torch.nn.Module, batch: Any, forward: Callable[[torch.nn.Module, Any], Any] | None = None
) -> NonFiniteSite:
    """Replay ``batch`` through ``model`` with forward hooks on every module; name where NaN/inf appears first.

    The model runs under ``torch.no_grad()`` in the mode it is in (call
    ``model.eval()`` first to take dropout out of the picture). ``forward``
    says how to call the model on the batch when the default (first item of
    a tuple, keywords of a dict, else the batch itself) does not fit.
    """
    names = {id(m): name for name, m in model.named_modules()}
    first_output: list[tuple[str, str]] = []
    first_input: list[str] = []

    def before(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not first_input and not _finite((args, kwargs)):
            first_input.append(names.get(id(module), "?"))

    def after(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not first_output and not _finite(output):
            first_output.append((names.get(id(module), "?"), type(module).__name__))

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(m.register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad():
            output = forward(model, batch) if forward is not None else _call(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    return NonFiniteSite(
        module=first_output[0][0] if first_output else None,
        module_type=first_output[0][1] if first_output else None,
        input_module=first_input[0] if first_input else None,
        batch_finite=_finite(batch),
        output_finite=_finite(output),
    )
