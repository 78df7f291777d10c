"""tuiwatch's hooks under torch.compile: run as they are between graphs, or left out where the graph must stay whole.

Dynamo traces the hooks it meets in a compiled region (a model compiled after
the Watch hooked it, a Trainer's ``torch_compile=True``, an ``opt.step()``
inside a compiled function). Traced, their clock reads and ``.item()`` split
the user's code into more graphs and printed dynamo's warnings about
tuiwatch's lines into the run's log; so they run untraced, between graphs
(``torch.compiler.disable``), which is one graph break where the hook is.
Where the user asked for one graph (``torch.compile(fullgraph=True)``,
``torch._dynamo.error_on_graph_break``, a strict ``torch.export``), that break
raised "Skip inlining `torch.compiler.disable()`d function" at the model's
first forward: there the hook is left out of the compiled region instead, and
what it measures there is not measured. Eagerly (not compiling) the hook is
called as it is: ``torch.compiler.disable``'s wrapper cost ~0.45 µs a call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Whether a hook of tuiwatch was left out of a graph that must stay whole in this process: the forwards of a model
# compiled so run out of the Watch's sight, and parts.py does not take such a model for one whose loop calls parts.
left_out = False


@torch.compiler.assume_constant_result  # type: ignore[untyped-decorator]  # (torch does not type it)
def graph_must_stay_whole() -> bool:
    """Whether the code dynamo is tracing now may not break its graph. Called by dynamo while it traces, once:
    it reads the tracer's own flags, private to torch, so any other torch answers "may break", as before."""
    global left_out
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tracer = InstructionTranslator.current_tx()
        whole = bool(tracer.one_graph or tracer.error_on_graph_break)
    except Exception:
        return False
    left_out = left_out or whole
    return whole


def uncompiled(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` as torch.compile leaves it: called as it is eagerly, run between graphs where dynamo meets it, and
    left out (None) where the graph must stay whole."""
    between_graphs = torch.compiler.disable(hook)  # type: ignore[no-untyped-call]  # (torch does not type it)

    def run(*args: Any) -> Any:
        if torch.compiler.is_compiling():
            return None if graph_must_stay_whole() else between_graphs(*args)
        return hook(*args)

    return run
