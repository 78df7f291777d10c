"""The forward hook against the model's own ``_compiled_call_impl``: a prototype of issue 18's lead, measured.

    python bench/call_impl.py [--rounds 15] [--steps 3000]

torch runs a module with any forward hook through ``_call_impl``'s slow path (a closure, a set, the hook tables
walked): on a small model that costs more than the Watch's hook body. ``Module.__call__`` asks the instance's
``_compiled_call_impl`` first (``model.compile()`` sets it), so a function put there sees every call of the model
without a hook and without touching ``model.forward``. Three arms in one process, rotating their order round by
round, on ``overhead.py``'s tiny MLP (the same model copy, the same batches): the bare loop; a default Watch; the
same Watch with its forward hook taken off and its hook called from ``_compiled_call_impl`` instead. Printed:
each arm's added wall and training-thread CPU a step over bare (median of the paired differences, with the
interquartile range), and the load average at start and end.

Not adopted (docs/performance.md, "Measured on 2026-12-06"): dynamo calls a submodule's ``_call_impl`` directly,
so a model compiled after the Watch (``torch.compile(model)``) would lose the output probe and the forward count
without a word, where the hook is traced; and ``model.compile()`` replaces the function.
"""

from __future__ import annotations

import os
from typing import Any

from overhead import Arm, iqr, print_added, rotating_rounds, tiny_bench

ARMS = ("bare", "hooked", "call_impl")


def call_impl_instead_of_the_hook(arm: Arm) -> None:
    """Take the Watch's forward hook off ``arm``'s model and call it from ``_compiled_call_impl``."""
    model = arm.model
    (hook_id,) = list(model._forward_hooks)
    hook = model._forward_hooks.pop(hook_id)
    model._forward_hooks_always_called.pop(hook_id, None)
    call = model._call_impl

    def called(*args: Any, **kwargs: Any) -> Any:
        out = call(*args, **kwargs)
        hook(model, args, out)
        return out

    model._compiled_call_impl = called
    assert not model._forward_hooks


def main() -> None:
    b = tiny_bench(__doc__ or "", rounds=15)
    arms = {kind: Arm(b.case, "bare" if kind == "bare" else "watched", b.run_dir, b.model) for kind in ARMS}
    call_impl_instead_of_the_hook(arms["call_impl"])
    wall, cpu = rotating_rounds(arms, b.loader, b.rounds, b.steps)
    forwards = {kind: arms[kind].watch._tracker.training_forwards for kind in ARMS[1:]}  # type: ignore[union-attr]
    for arm in arms.values():
        if arm.watch is not None:
            arm.watch.close()
    print(f"load average at end: {os.getloadavg()[0]:.2f}; forwards seen {forwards}")
    print_added(wall, cpu)
    saved = iqr([(h - c) * 1e6 for h, c in zip(cpu["hooked"], cpu["call_impl"], strict=True)])
    print(f"hooked - call_impl, training-thread CPU: {saved[0]:.1f} µs [{saved[1]:.1f}, {saved[2]:.1f}]")


if __name__ == "__main__":
    main()
