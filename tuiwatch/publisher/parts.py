"""A model whose own forward the loop never calls: the parts it is made of stand in for it.

Lightning's own README module has no ``forward``: its ``training_step`` calls
``self.encoder`` and ``self.decoder``. CleanRL's ``Agent`` has none either (its
``get_action_and_value`` calls ``self.actor`` and ``self.critic``), and a loop may
call ``model.forward(x)`` or its model's parts itself. A hook on the root
module sees none of these calls: no output check, no phases, no mode in a
validation block. The parts are what the loop calls: the outermost submodules
that have a forward of their own and hold parameters (a loss module or a
metric holds none; a ``ModuleList`` has no forward, so its items are parts).
"""

from __future__ import annotations

import torch


def has_forward(module: torch.nn.Module) -> bool:
    """Whether ``module``'s class writes a forward (``nn.Module``'s raises; LightningModule's only calls it)."""
    forward = type(module).forward
    if forward is torch.nn.Module.forward:
        return False
    return getattr(forward, "__qualname__", "") != "LightningModule.forward"


def model_parts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost submodules of ``model`` that have a forward of their own and hold parameters, in order."""
    parts: list[torch.nn.Module] = []
    for child in model.children():
        if next(child.parameters(), None) is None:
            continue
        if has_forward(child):
            parts.append(child)
        else:
            parts += model_parts(child)
    return parts
