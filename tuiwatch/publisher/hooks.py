"""The hooks a Watch puts on the model and the optimizer: what a step measures without the loop asking.

- optimizer step pre-hook: the pre-clip gradient norm (unless
  ``clip_grad_norm_`` already gave it), the non-finite check of
  ``on_nonfinite="stop"/"skip"`` (both when the closure's first call returns,
  for ``optimizer.step(closure)``), and a copy of the parameters when the
  update norm is sampled;
- optimizer step post-hook: lr per group, the parameter and update norms;
- several optimizers on one model (``Muon`` for the matrices beside
  ``AdamW`` for the rest): the step's first pre-hook measures the gradients
  and takes the snapshot, a later one checks the gradients a backward of its
  own made since (a GAN's other half), each post-hook reads the lr of them
  all, and the parameter and update norms are read when the step ends, after
  every one of them has stepped; until the first update, a parameter of the
  model that none of them holds and that moves is said on stderr (another
  optimizer the Watch was not given);
- forward hook on the root module: the output's finiteness probe, the class
  count, the model's mode during a validation block, and an OOM raised
  inside the forward; on its parts instead where the loop does not call the
  model itself (parts.py): a model without a forward (Lightning's README
  module, CleanRL's ``Agent``) from the start, any other whose forward ran
  in none of its first two optimizer steps from the second;
- without an optimizer (a loop that updates the weights by hand), the step
  boundaries stand in for the optimizer hooks: a step that ends with
  gradients counts as an update, and the gradient, parameter and update
  norms are read from the model then.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from tuiwatch.publisher import compiling, pickling, process, room, scripting
from tuiwatch.publisher.activation_checkpointing import in_backward
from tuiwatch.publisher.clipping import unwatch_clipping, watch_clipping
from tuiwatch.publisher.closures import after_first_call, step_closure, with_closure
from tuiwatch.publisher.collected import weakly
from tuiwatch.publisher.compiling import graph_must_stay_whole, uncompiled
from tuiwatch.publisher.deferred import defer, defer_tensor, device_mark
from tuiwatch.publisher.failures import Failures
from tuiwatch.publisher.measure import (
    NO_BATCH,
    class_count,
    finiteness_probe,
    flat_normable,
    gradient_norm,
    output_tensor,
    total_norm,
)
from tuiwatch.publisher.nested import tensors
from tuiwatch.publisher.optimizers import inner_optimizer, params_of
from tuiwatch.publisher.parts import has_forward, model_parts
from tuiwatch.publisher.pending import StepState
from tuiwatch.publisher.replaced import tell_steps
from tuiwatch.publisher.steps import StepTracker


def default_update_norm_every(moving_count: int) -> int:
    # The update norm costs three passes over the parameters that can move (a copy before the step, the
    # difference, its norm): ~70 µs of dispatch on the tiny MLP, ~0.9 ms on the 3x512 MLP (0.8M parameters, an
    # 8 ms step), so every 10th step cost that model 1 % (79 µs a step, paired). Above 100k of them it is read
    # every 100th: the parameter norm, one pass every 10th, still tells parameters that do not move within 20
    # steps (no-update).
    return 10 if moving_count <= 100_000 else 100


def default_param_norm_every(param_count: int) -> int:
    # A parameter norm reads every weight: 14-20 µs of the training thread on the tiny MLP, ~100 µs on a
    # 1M-parameter model on the CPU. no-update counts the optimizer steps between two equal samples, so
    # every 10th keeps its sensitivity (it fires after 20 optimizer steps either way).
    return 10


KEEP_SNAPSHOT_ELEMENTS = 4_000_000  # 16 MB of float32: below it the update norm's buffers are kept
# The outputs of at most this many forwards a step are checked: a model's micro-batches (accumulation), its parts'
# calls (an RNN cell called once a time step would add two small kernels a call); a step with more leaves its output
# unchecked.
OUTPUT_PROBES = 64


class ForwardHook:
    """What a Watch registers on the user's model: a model with it stays a normal model.

    Copies of the model leave it out (pickling.py). Where a copy is made some
    other way (a shallow ``copy.copy`` shares the table), this hook holds its
    :class:`ModelHooks` only weakly, acts only for the module it was put on,
    and copies or pickles as an inert hook: no lock or thread of the Watch is
    ever reached, and a copy never publishes into the original's Watch.
    """

    __slots__ = ("_func", "_owner")

    def __init__(self, target: Any = None):
        # A bound method (the usual) is held through a weak reference to its object and called through its
        # function: a WeakMethod builds a bound method in Python at every forward. A plain function (a bench's
        # timing wrapper) is held weakly itself.
        bound = isinstance(target, types.MethodType)
        self._func = target.__func__ if bound else None
        self._owner = None if target is None else weakref.ref(target.__self__ if bound else target)

    def __call__(self, module: Any, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            # A model compiled after the Watch hooked it (or a Trainer's torch_compile=True, whose model the
            # callback hooks): this runs between its graphs, or not at all where they must stay whole (compiling.py).
            # An export's forward (torch.export, strict or not) is not the run's: nothing of it is recorded.
            if not torch.compiler.is_exporting() and not graph_must_stay_whole():
                _between_graphs(self, module, args, output)
            return
        if torch._C._get_tracing_state():
            return  # torch.jit.trace's (and the ONNX exporter's) forwards are an export's, not the run's
        if output is not None and in_backward():
            return  # a checkpoint's recomputation, not the step's forward (activation_checkpointing.py); an OOM is told
        self.act(module, args, output)

    def act(self, module: Any, args: Any, output: Any) -> None:
        owner = self._owner() if self._owner is not None else None
        if owner is None:
            return
        if self._func is not None:
            self._func(owner, module, args, output)
        else:
            owner(module, args, output)

    def __reduce__(self) -> tuple[type[ForwardHook], tuple[()]]:
        return (ForwardHook, ())


@torch.compiler.disable  # type: ignore[untyped-decorator]  # (torch does not type it)
def _between_graphs(hook: ForwardHook, module: Any, args: Any, output: Any) -> None:
    hook.act(module, args, output)


def _holds_any(params: list[Any], mine: list[torch.Tensor]) -> bool:
    """Whether a clip's ``params`` include any of the watched model's, not another model's (a GAN's other half,
    an EMA copy)."""
    if not mine:
        return False
    first = mine[0]
    if any(p is first for p in params):  # usually found at once: the clip's first parameter is ours
        return True
    given = {id(p) for p in params}  # our first one is frozen, say: any of ours
    return any(id(p) in given for p in mine)


def _stepped(s: StepState, groups: list[dict[str, Any]]) -> None:
    """An optimizer's step has ended: the step's optimizer phase ends here, and its lr is read from ``groups``."""
    s.opt_end = time.perf_counter()
    if s.device_start is not None:
        s.opt_end_mark = device_mark()
    # .get: an optimizer of one's own may give its groups a step size and no "lr" (a KeyError here ended runs).
    s.lr = [defer(lr) if isinstance(lr := g.get("lr"), torch.Tensor) else lr for g in groups]


def _own_gradient_norm(optimizer: Any, read: bool) -> tuple[list[torch.Tensor], Any]:
    """An optimizer's parameters and the norm of their gradients (None: no gradient), a number where ``read`` (a
    check before the update: the one documented sync a step on CUDA) or on the CPU, else a device tensor."""
    params = params_of(optimizer)
    norm = gradient_norm([p.grad for p in params if p.grad is not None])
    if isinstance(norm, torch.Tensor) and (read or not norm.is_cuda):
        norm = norm.item()
    return params, norm


def _gradient_mark(optimizer: Any) -> tuple[Any, int] | None:
    """An optimizer's gradients as they are now: its first gradient (held weakly: a gradient set to None and made
    again may get the freed one's id) and that gradient's version (a backward adds into it in place)."""
    for group in optimizer.param_groups:
        mark = _first_gradient_mark(group["params"])
        if mark is not None:
            return mark
    return None


def _first_gradient_mark(params: Iterable[torch.Tensor]) -> tuple[Any, int] | None:
    for p in params:
        grad = p.grad
        if grad is not None:
            return weakref.ref(grad), grad._version
    return None


def _unchanged(mark: tuple[Any, int] | None, optimizer: Any) -> bool:
    return _same_mark(mark, _gradient_mark(optimizer))


def _same_mark(mark: tuple[Any, int] | None, now: tuple[Any, int] | None) -> bool:
    if mark is None or now is None:
        return mark is None and now is None
    return mark[0]() is now[0]() and mark[1] == now[1]


def _no_watch(grad: Any) -> None:
    return None  # a tensor hook whose Watch is gone


def is_forward_hook(hook: Any) -> bool:
    return isinstance(hook, ForwardHook)


class Attached:
    """What a Watch's hooks put on the model, its parts and its optimizers, removable without any of them: a Watch
    collected unclosed is unhooked by a finalizer that holds this and nothing of the Watch (watch.py)."""

    __slots__ = ("handles", "hidden")

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.hidden: list[type] = []  # the classes whose copies leave the hooks out (pickling.py), once a module

    def forward_hook(self, module: torch.nn.Module, hook: ForwardHook) -> Any:
        # always_call: the hook also runs when the forward raises, which is how an OOM in it is seen.
        return self._held(module, module.register_forward_hook(hook, always_call=True))

    def forward_pre_hook(self, module: torch.nn.Module, hook: ForwardHook) -> Any:
        # with_kwargs: torch then calls it with three arguments, as a ForwardHook is called.
        return self._held(module, module.register_forward_pre_hook(hook, with_kwargs=True))

    def _held(self, module: torch.nn.Module, handle: Any) -> Any:
        self.handles.append(handle)
        pickling.hide_hooks(type(module), is_forward_hook)
        self.hidden.append(type(module))
        return handle

    def remove(self) -> None:
        """Take everything off (once: a second call finds nothing)."""
        for cls in self.hidden:
            pickling.show_hooks(cls)
        for handle in self.handles:
            handle.remove()
        self.hidden.clear()
        self.handles.clear()


class ModelHooks:
    # Several optimizers stepping inside the backward: the step, and the sum of their gradients' squared norms. Class
    # defaults, set on the instance only in that case, as StepState's are: every other Watch's hooks object stays
    # as it was (two more instance attributes counted ~4,000 more instructions a step on the tiny MLP, at the edge
    # of bench/instructions.py's spread).
    _in_backward: StepState | None = None
    _backward_squares: Any = None

    def __init__(
        self,
        tracker: StepTracker,
        failures: Failures,
        model: torch.nn.Module,
        optimizers: list[Any],
        *,
        checking: bool,
        update_norm_every: int,
        param_norm_every: int,
        late_gradients: bool = False,
        name: str = "",
    ):
        self.tracker = tracker
        self.failures = failures
        self.name = name  # the run's, for the one line on stderr about parameters another optimizer moves
        self._said_twice = False  # the one line about an optimizer that steps twice in a step
        self.model = model
        self.optimizers = optimizers
        self.optimizer = optimizers[0] if optimizers else None  # the usual one, asked at every step without a list
        self._stepping = [inner_optimizer(o) for o in optimizers]
        self._several = len(optimizers) > 1
        self._optimizer_handles: list[Any] = []
        # The step whose watched optimizer's step() is running (between its pre- and post-hook): an optimizer stepped
        # meanwhile is one it steps inside (Lookahead's), never one that replaces it (replaced.py). A step that
        # raised there (an OOM the loop caught) leaves it set, until another step opens.
        self.stepping_in: StepState | None = None
        # How deep in it: torch runs an optimizer's step hooks again inside a subclass's step() that calls its
        # parent's (both are wrapped once a parent instance has been made), so one update went by as two.
        self._depth = 0
        # Told of an optimizer stepping that is not the watched one (the Watch sets it before attach(): replaced.py)
        self.on_other_optimizer: Callable[[Any], Any] | None = None
        # Several optimizers: each one's gradients as the step's check saw them, and that step (_check_newer).
        self._marks: list[tuple[Any, int] | None] = []
        self._marked: StepState | None = None
        self.checking = checking  # on_nonfinite "stop" or "skip": the grad norm is read before the update
        self.update_norm_every = update_norm_every
        self.param_norm_every = param_norm_every
        # The gradients are made inside optimizer.step(closure) (Lightning): measured when gradients_ready() says.
        self.late_gradients = late_gradients
        self._before_update: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # (moving, their copy)
        self._param_cache: tuple[int, list[torch.Tensor]] = (-1, [])
        self._flat_norms = False  # whether the cached parameters' norms are read as one flat copy (measure.py)
        self._kept_snapshot: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # (moving, buffers)
        self._classes_decided = False
        self._classes_waited: int | None = None  # a measured step whose forward went by without its batch
        self._classes_step = -1  # the step that decided: a model watched by its parts decides at each of its calls
        self.attached = Attached()
        self._root_hook: Any = None
        # The model's trainable parameters no watched optimizer holds, until the first update (_watch_outside), and
        # which of them had a gradient at the first optimizer step's pre-hook
        self._outside: list[torch.Tensor] = []
        self._outside_grads: list[bool] | None = None
        self.parts: dict[int, torch.nn.Module] | None = None  # a model watched by its parts (parts.py): id -> part
        self._at_forward: Any = None  # a loop that marks no steps: what opens a step at a training forward (watch.py)
        self._at_forward_handles: list[Any] = []
        # No optimizer and no marks (watch.py): an update is told where a backward through the model's output ends.
        self.updates_at_backward = False
        self._grads_at_open: tuple[Any, int] | None = None
        self._grads_at_backward: tuple[Any, int] | None = None
        self._backward_queued = False
        # (held weakly: an output the loop keeps never holds the Watch)
        self._backward_began_weakly = weakly(self._backward_began, _no_watch)

    def attach(self) -> None:
        if self._several:
            pre, post = self.before_any_optimizer_step, self.after_each_optimizer_step
            self.tracker.on_end = self.after_all_optimizer_steps
        else:
            pre, post = self.before_optimizer_step, self.after_optimizer_step
        self._hook_optimizers(pre, post)
        if self.on_other_optimizer is not None and not self._several:
            self.attached.handles.append(tell_steps(self))  # to see one that replaces the watched one
        if not self.optimizers:
            self.tracker.on_open = self.at_step_open
            self.tracker.on_end = self.at_step_end
        else:
            self._watch_outside()
        self._root_hook = self.attached.forward_hook(self.model, ForwardHook(self.after_forward))
        scripting.leave_out_of_scripts(is_forward_hook)
        watch_clipping(self)
        if not has_forward(self.model):
            self._watch_parts()

    def _hook_optimizers(self, pre: Callable[..., Any], post: Callable[..., Any]) -> None:
        for stepping in self._stepping:
            # Not traced where the optimizer's step is compiled (PyTorch's recipe: torch.compile of a function that
            # calls opt.step()): one graph became ten, as for the forward hook below.
            for handle in (
                stepping.register_step_pre_hook(uncompiled(pre)),
                stepping.register_step_post_hook(uncompiled(post)),
            ):
                self.attached.handles.append(handle)
                self._optimizer_handles.append(handle)

    def an_optimizer_steps(self, optimizer: Any) -> None:
        """Any optimizer's step is starting (replaced.py; the watched one's too, at every step)."""
        if optimizer is not self._stepping[0] and self.on_other_optimizer is not None:
            self.on_other_optimizer(optimizer)

    def is_watched(self, optimizer: Any) -> bool:
        """Whether ``optimizer`` (as torch's global step hooks see it: the one whose ``step()`` runs) is watched."""
        return any(optimizer is o for o in self.optimizers) or any(optimizer is o for o in self._stepping)

    def replace_optimizer(self, new: Any) -> Any:
        """The loop replaced the one optimizer the Watch was given with ``new`` (replaced.py): the hooks go on it
        and off the old one, which is returned. The norms read the model's parameters either way."""
        old = self.optimizer
        self.optimizers = [new]
        self.optimizer = new
        self.step_with(inner_optimizer(new))
        return old

    def step_with(self, stepping: Any) -> None:
        """The hooks go on ``stepping``, the optimizer whose ``step()`` runs at each of the watched one's updates, and
        off the one they were on."""
        for handle in self._optimizer_handles:
            handle.remove()
            self.attached.handles.remove(handle)
        self._optimizer_handles.clear()
        self._stepping = [stepping]
        self._param_cache = (-1, [])
        self._before_update = None  # a snapshot the other one's step would have been compared with
        self._hook_optimizers(self.before_optimizer_step, self.after_optimizer_step)

    def remove(self) -> None:
        unwatch_clipping(self)
        self.attached.remove()
        self.tracker.on_open = self.tracker.on_end = None

    def forward_modules(self) -> list[torch.nn.Module]:
        """The modules whose forwards the Watch sees: the model, or its parts (parts.py)."""
        return [self.model] if self.parts is None else list(self.parts.values())

    def _watch_parts(self) -> None:
        """Watch the model's parts in place of the model (parts.py): the root's hook comes off, each part gets one."""
        parts = model_parts(self.model)
        if not parts or self.parts is not None:
            return
        self._root_hook.remove()
        self.parts = {id(p): p for p in parts}
        for part in parts:
            self.attached.forward_hook(part, ForwardHook(self.after_part_forward))
            if self._at_forward is not None:
                self._at_forward_handles.append(self.attached.forward_pre_hook(part, ForwardHook(self._at_forward)))

    def open_steps_at_forwards(self, before_forward: Callable[[Any, Any, Any], None]) -> None:
        """Call ``before_forward(module, args, kwargs)`` before each forward of the model (or of its parts, once
        they are watched in its place): for a loop that marks no steps (watch.py)."""
        self._at_forward = before_forward  # (and on the parts, if they are watched later: _watch_parts)
        for module in self.forward_modules():
            self._at_forward_handles.append(self.attached.forward_pre_hook(module, ForwardHook(before_forward)))

    def stop_steps_at_forwards(self) -> None:
        """The loop marks its steps after all (``watch.step()`` at the bottom of its loop): the hooks come off."""
        self._at_forward = None
        for handle in self._at_forward_handles:
            handle.remove()
        self._at_forward_handles.clear()

    def forward_seen(self) -> None:
        """Before the second optimizer step (at the end of the first in a loop that marks no steps, watch.py): a model
        none of whose forwards ran since the Watch began (the loop calls its parts, or ``model.forward(x)``) is
        watched by its parts from now on. Not at the first: ``tuiwatch run`` makes its Watch at the first optimizer
        step, after that step's forward. Not where a hook was left out
        of a graph that must stay whole (compiling.py): such a model's forwards run out of the hook's sight, and
        hooks put on its parts would only make it compile again."""
        if self.tracker.forward_training is None and self.parts is None and not compiling.left_out:
            self._watch_parts()

    def params(self) -> list[torch.Tensor]:
        """The model's parameters: what the gradient, parameter and update norms measure.

        The model's, not the optimizer's: an optimizer built on a copy of the
        model must show as "gradients arrive, parameters do not move". The list
        is rebuilt when the optimizer's parameter count changes (a new group).
        """
        optimizer = self.optimizer
        groups = optimizer.param_groups if optimizer is not None else []
        # Asked at every optimizer step: one group of one optimizer (the usual) without a generator.
        if len(groups) == 1 and not self._several:
            key = len(groups[0]["params"])
        else:
            key = sum(len(g["params"]) for o in self._stepping for g in o.param_groups)
        if self._param_cache[0] != key or not self._param_cache[1]:
            params: list[torch.Tensor] = list(self.model.parameters())
            self._param_cache = (key, params)
            self._flat_norms = flat_normable(params)
        return self._param_cache[1]

    def clipped(self, params: list[Any], norm: torch.Tensor, max_norm: float | None) -> None:
        """The loop clipped with torch's ``clip_grad_norm_`` (clipping.py): its norm is the step's pre-clip one."""
        mine = self.params()
        if self.tracker.off or not _holds_any(params, mine):
            return
        s = self.tracker.current()
        s.grad_norm = norm
        s.clip_max_norm = max_norm

    def before_value_clip(self, params: list[Any]) -> None:
        """The loop is about to clip each gradient to a value (``clip_grad_value_``, clipping.py): the norm the
        optimizer's pre-hook would read after it is read now, before it (an exploding gradient clipped to 0.25
        per element read as a calm norm of ~0.25·√n)."""
        mine = self.params()
        if self.tracker.off or not _holds_any(params, mine):
            return
        s = self.tracker.current()
        s.grad_norm = self._gradient_norm(s, mine)

    def _snapshot(self, params: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """The parameters that can move (``requires_grad``) and their values before an update, for its norm.

        Frozen parameters do not move, and copying them is all the cost on a fine-tuned model (a LoRA adapter on
        a frozen 7B model: a 14 GB copy for a few MB that move, the run's OOM). The copy goes into buffers kept
        between samples up to :data:`KEEP_SNAPSHOT_ELEMENTS` (a fresh 3.2 MB copy of the 3x512 MLP cost 980 µs a
        sampled step, a copy into kept buffers 441), a fresh one above (a second buffer of that size held for
        good is too much), and only where it takes at most half of the device's spare memory (room.py): a full
        fine-tune of a large model skips the samples its device has no room for.
        """
        moving = [p for p in params if p.requires_grad]
        if not moving:
            return None
        with torch.no_grad():
            kept = self._kept_snapshot
            if (
                kept is not None
                and len(kept[0]) == len(moving)
                and all(a is b for a, b in zip(kept[0], moving, strict=True))
                and kept[1][0].device == moving[0].device
            ):
                torch._foreach_copy_(kept[1], moving)
                return kept
            if not room.has_room(moving):
                return None  # this sample is not taken: a copy that could run the training out of memory
            try:
                copy = list(torch._foreach_mul(moving, 1.0))
            except Exception:  # an allocation that failed all the same (fragmented memory): not out of the user's step
                return None
            if sum(p.numel() for p in moving) <= KEEP_SNAPSHOT_ELEMENTS:
                self._kept_snapshot = (moving, copy)
            return moving, copy

    @staticmethod
    def _update_norm(snapshot: tuple[list[torch.Tensor], list[torch.Tensor]]) -> Any:
        moving, before = snapshot
        with torch.no_grad():
            torch._foreach_sub_(before, moving)  # in place: -(the update), whose norm is the update's
            return total_norm(before)

    def _decide_classes(self, s: StepState, output: Any) -> None:
        """The class count, once: with the step's batch where it was seen, else from the output alone at the second
        step without one (tuiwatch run's first step never has its batch, drawn before the Watch was made: skorch's
        classifier has its forward there, inside optimizer.step(closure)). A regression's answer would cost a walk
        of its batch at every step."""
        kept = self.tracker.last_batch
        if kept is not None and kept.step == s.step:
            batch = kept.batch
        elif self._classes_waited is not None and self._classes_waited != s.step:
            batch = NO_BATCH
        else:
            self._classes_waited = s.step
            return
        self._classes_decided = True
        self._classes_step = s.step
        s.classes = class_count(output, batch)

    def before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        tracker = self.tracker
        if tracker.off:
            return None
        s = tracker.cur or tracker.current()
        if self.stepping_in is s and self._depth:
            self._depth += 1  # the parent's step() inside a subclass's: the same update
            return None
        self.stepping_in, self._depth = s, 1
        s.opt_start = time.perf_counter()
        if s.device_start is not None:
            s.opt_start_mark = device_mark()
        if tracker.opt_steps < 2:
            self._early_step(tracker.opt_steps)
        params = self.params()
        closure = None if self.late_gradients else step_closure(args, kwargs)
        if not self.late_gradients and closure is None:
            self._measure_gradients(s, params)
        if s.measured and tracker.opt_steps % self.update_norm_every == 0 and not s.opt_skipped:
            self._before_update = self._snapshot(params)  # before the closure too: the weights the step starts from
        if closure is None:
            return None
        # The gradients here are the last step's: this step's are made by the closure's first call (closures.py).
        return with_closure(args, kwargs, after_first_call(closure, lambda: self._measure_gradients(s, params)))

    def gradients_ready(self) -> None:
        """``late_gradients``: this step's gradients are complete (after backward, before any clipping). Called again
        in the step for a later optimizer (Lightning calls it before each), the gradients a backward of its own
        made since are checked too."""
        if self.tracker.off:
            return
        s = self.tracker.current()
        if self._marked is s:
            if self.checking:
                self._check_newer(s, range(len(self._stepping)))
            return
        self._measure_gradients(s, self.params())
        # The optimizer's own work starts now: its pre-hook ran before the closure that made the forward and the
        # backward, so the backward phase runs from the forward's return to here (DDP's gradient sync in it).
        s.opt_start = time.perf_counter()
        if s.device_start is not None:
            s.opt_start_mark = device_mark()

    def _gradient_norm(self, s: StepState, params: list[torch.Tensor]) -> Any:
        """The step's gradient norm: the one a clip gave, else measured now when the step is recorded or checked."""
        norm = s.grad_norm
        if norm is None and (s.measured or self.checking):
            flat = self._flat_norms and params is self._param_cache[1]
            norm = gradient_norm([p.grad for p in params if p.grad is not None], flat)
        return norm

    def _measure_gradients(self, s: StepState, params: list[torch.Tensor]) -> None:
        """The pre-clip norm (unless a clip gave it) and, for "stop"/"skip", the non-finite check before the update."""
        checking = self.checking
        norm = self._gradient_norm(s, params)
        if isinstance(norm, torch.Tensor):
            # "stop"/"skip" must know now: free on the CPU, the one documented sync per step on CUDA.
            norm = norm.item() if checking else defer(norm)
        s.grad_norm = norm
        if self._several and checking:
            self._marks, self._marked = [_gradient_mark(o) for o in self._stepping], s
        if checking and type(norm) is float and not math.isfinite(norm):
            self.failures.nonfinite_gradients(s, params)

    def _check_newer(self, s: StepState, which: Iterable[int]) -> None:
        """Several optimizers, "stop"/"skip": the optimizers among ``which`` whose gradients a backward made since
        the step's check (a GAN's other half: its own loss, its own backward) are checked before they step. The same
        gradients (Muon beside AdamW, one backward) are not read twice."""
        for i in which:
            optimizer = self._stepping[i]
            if _unchanged(self._marks[i], optimizer):
                continue
            self._marks[i] = _gradient_mark(optimizer)
            params, norm = _own_gradient_norm(optimizer, read=True)
            if norm is not None and not math.isfinite(norm):
                s.grad_norm = norm
                self.failures.nonfinite_gradients(s, params)

    def after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._depth > 1:
            self._depth -= 1  # the parent's step() inside a subclass's returned: the update goes on
            return
        self.stepping_in, self._depth = None, 0
        tracker = self.tracker
        s = tracker.cur
        if tracker.off or s is None:
            return
        _stepped(s, optimizer.param_groups)
        if s.opt_skipped:
            return
        if s.opt_step is not None and not self._said_twice:
            self._stepped_twice(s)
        tracker.updated(s)
        if not s.measured:
            return
        if (tracker.opt_steps - 1) % self.param_norm_every == 0:
            params = self.params()
            s.param_norm = defer_tensor(total_norm(params, self._flat_norms))
        before = self._before_update
        if before is not None:
            self._before_update = None
            s.update_norm = defer_tensor(self._update_norm(before))

    def _stepped_twice(self, s: StepState) -> None:
        """The optimizer stepped again in the step it had stepped in (a loop that updates on each half of its batch;
        PPO's epochs of minibatches in a step marked per rollout): said once, as its fields mix the updates."""
        self._said_twice = True
        print(
            f"tuiwatch: {self.name}: the optimizer stepped more than once in step {s.step}: a step's gradient and "
            "update norms are its first update's, its loss the last one logged; give each update a step of its own "
            "(watch.step() before it)",
            file=sys.stderr,
            flush=True,
        )

    def before_any_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """Several optimizers: the step's first one measures the gradients, checks them and takes the snapshot, for
        the whole model; the others step on the same gradients (or on none, after a "skip"). Optimizers that step
        inside the backward each see only their own gradients (:meth:`_add_gradients`)."""
        s = self.tracker.cur
        if s is not None and s.opt_start is not None:
            if self._in_backward is s:
                self._add_gradients(s, optimizer)
            elif self._marked is s and self.checking and not self.late_gradients:
                self._check_newer(s, [self._stepping.index(optimizer)])
            return None
        self._before_update = None  # an earlier step's, whose optimizers did not all step: not this step's start
        self._in_backward = None
        out = self.before_optimizer_step(optimizer, args, kwargs)
        s = self.tracker.cur
        if s is not None and s.grad_norm is not None and not self.late_gradients and in_backward():
            # An optimizer a parameter, stepped and zeroed by the parameter's post-accumulate-grad hook as soon as its
            # gradient is made (PyTorch's "optimizer step in backward" recipe, torchtune's optimizer_in_bwd): the
            # model's gradients are never all there at once, and the norm read here was one parameter's (0.16 of a
            # model's 0.41). The step's norm is summed from each optimizer's own, read before it steps.
            self._in_backward, self._backward_squares = s, None
            self._add_gradients(s, optimizer)
        return out

    def _add_gradients(self, s: StepState, optimizer: Any) -> None:
        """Optimizers stepping inside the backward: ``optimizer``'s own gradients into the step's norm, checked
        before it steps ("stop"/"skip"). On CUDA without a check, the root of the sum is read at the step's end."""
        if not (s.measured or self.checking):
            return
        params, norm = _own_gradient_norm(optimizer, read=self.checking)
        if norm is None:
            return
        squares = norm * norm if self._backward_squares is None else self._backward_squares + norm * norm
        self._backward_squares = squares
        if type(squares) is float:
            s.grad_norm = math.sqrt(squares)
        if self.checking and type(norm) is float and not math.isfinite(norm):
            self.failures.nonfinite_gradients(s, params)

    def after_each_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Several optimizers: the step's optimizer phase ends with the last of them, its lr lists the groups of
        them all in the order they were given, and the step counts once as an optimizer step."""
        tracker = self.tracker
        s = tracker.cur
        if tracker.off or s is None:
            return
        _stepped(s, [g for o in self._stepping for g in o.param_groups])
        if s.opt_skipped or s.opt_step is not None:
            return
        tracker.updated(s)

    def after_all_optimizer_steps(self, s: StepState) -> None:
        """Several optimizers, at the step's end: every optimizer of the step has stepped, so the parameter and update
        norms are the whole model's (read at the first post-hook, they missed the others' updates)."""
        before, self._before_update = self._before_update, None
        if self._in_backward is s:
            self._in_backward = None
            if isinstance(self._backward_squares, torch.Tensor):  # (CUDA, no check: summed on the device)
                s.grad_norm = defer(torch.sqrt(self._backward_squares))
        if s.opt_step is None or not s.measured:
            return
        if (s.opt_step - 1) % self.param_norm_every == 0:
            s.param_norm = defer_tensor(total_norm(self.params()))
        if before is not None:
            s.update_norm = defer_tensor(self._update_norm(before))

    def _watch_outside(self) -> None:
        """Until the first update, keep the version counters of the model's trainable parameters that no watched
        optimizer holds: one that moves then was stepped by another optimizer, which the Watch was not given.

        Only one with a gradient: at the first optimizer step's pre-hook (one backward before both optimizers, Muon
        beside AdamW; a loop that zeroes them to None after stepping) or when the step ends. A target network
        synced with ``load_state_dict`` inside the model (Lightning's DQN example) moves too, and has none."""
        held = {id(p) for o in self._stepping for g in o.param_groups for p in g["params"]}
        outside: list[torch.Tensor] = [p for p in self.model.parameters() if p.requires_grad and id(p) not in held]
        if not outside:
            return
        self._outside = outside
        versions = [p._version for p in outside]
        after = self.tracker.on_end  # several optimizers' norms, read first

        def at_first_update(s: StepState) -> None:
            if after is not None:
                after(s)
            if s.opt_step is None:
                return  # no update yet (accumulation): the next step's end asks again
            self.tracker.on_end = after
            had = self._outside_grads or [False] * len(outside)
            moved = sum(
                p._version != v and (g or p.grad is not None) for p, v, g in zip(outside, versions, had, strict=True)
            )
            self._outside = []
            if moved:
                print(
                    f"tuiwatch: {self.name}: {moved} of the model's parameters that the optimizer does not hold were "
                    f"updated in step {s.step} (another optimizer?): its lr, update norm and checkpoints leave them "
                    "out; give the Watch every optimizer, Watch(model, [muon, adamw])",
                    file=sys.stderr,
                    flush=True,
                )

        self.tracker.on_end = at_first_update

    def _early_step(self, done: int) -> None:
        """The pre-hook of the first two optimizer steps (``done`` of them before): the gradients of the parameters
        no watched optimizer holds, at the first (_watch_outside); whether the model's forward was seen, at the
        second (forward_seen)."""
        if done == 0:
            if self._outside:
                self._outside_grads = [p.grad is not None for p in self._outside]
        else:
            self.forward_seen()

    def at_step_open(self, s: StepState) -> None:
        """No optimizer: keep the weights the update norm compares with, on the steps that sample it, and the
        gradients as they are (a step that ends with the same ones ran no backward)."""
        tracker = self.tracker
        params = self.params()
        self._grads_at_open = _first_gradient_mark(params)
        if params and s.measured and tracker.opt_steps % self.update_norm_every == 0:
            self._before_update = self._snapshot(params)

    def at_step_end(self, s: StepState) -> None:
        """No optimizer: a step that ends with gradients was an update; its norms are read from the model now."""
        before, self._before_update = self._before_update, None
        params = self.params()
        tracker = self.tracker
        if s.opt_step is None:  # (an unmarked loop's update was told where its backward ended: _backward_ended)
            grads = [p.grad for p in params if p.grad is not None]
            if not grads or _same_mark(self._grads_at_open, _first_gradient_mark(params)):
                # No backward in this step (or the loop zeroed the gradients to None before the boundary). The same
                # gradients as at its open: the last step's, left there (a loop that zeroes them at its top, and the
                # step its last watch.step() opened, ended by close()).
                return
            self._update_without_optimizer(s, grads)
        if not s.measured:
            return
        if (tracker.opt_steps - 1) % self.param_norm_every == 0:
            s.param_norm = defer_tensor(total_norm(params))
        if before is not None:
            s.update_norm = defer_tensor(self._update_norm(before))

    def _update_without_optimizer(self, s: StepState, grads: list[torch.Tensor]) -> None:
        """No optimizer: ``s`` updated the model with ``grads`` (by hand, after them)."""
        tracker = self.tracker
        if tracker.opt_steps == 1:
            self.forward_seen()
        tracker.updated(s)
        if s.measured and s.grad_norm is None:  # watch.clip_grad_norm_ gives the pre-clip norm: after any clip
            s.grad_norm = total_norm(grads)

    def _hook_backward(self, output: Any) -> None:
        """No optimizer and no marks: a training forward's output tells when a backward through it begins."""
        self._backward_queued = False  # (a backward that raised never ran its callback)
        try:
            out = output if type(output) is torch.Tensor else output_tensor(output)
            if out is None or not out.requires_grad:  # a model that returns its loss alone: the backward is through it
                out = next((t for t in tensors(output) if t.requires_grad), None)
            if out is not None:
                out.register_hook(self._backward_began_weakly)  # type: ignore[no-untyped-call]  # (untyped in torch)
        except Exception:  # noqa: S110 - an output that takes no hook: its backward is not told
            pass

    def _backward_began(self, grad: Any) -> None:
        # The gradients are complete only when the whole backward has run: told then, once a backward.
        if not self._backward_queued:
            self._backward_queued = True
            self._grads_at_backward = _first_gradient_mark(self.params())
            torch.autograd.Variable._execution_engine.queue_callback(self._after_the_backward_s_callbacks)

    def _after_the_backward_s_callbacks(self) -> None:
        # Queued again, to run after the callbacks queued during the backward: DistributedDataParallel's, which
        # waits for the gradients' all-reduce, is queued at the first gradient, after this one was.
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)

    def _backward_ended(self) -> None:
        """No optimizer and no marks: a backward through the model's output has ended. The loop updates the weights
        by hand after it (word_language_model's ``p.data.add_(p.grad, alpha=-lr)``), and may zero the gradients to
        None before the next forward: the update, and its pre-clip gradient norm, are told now. The next training
        forward opens the next step (watch.py)."""
        self._backward_queued = False
        tracker = self.tracker
        try:
            if tracker.off or tracker.marked:
                return
            s = tracker.current()
            if s.opt_step is not None:
                return  # a second backward before the next forward: the same update
            params = self.params()
            if _same_mark(self._grads_at_backward, _first_gradient_mark(params)):
                return  # no gradient of the model's made (torch.autograd.grad through the output, a MAML inner step)
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                self._update_without_optimizer(s, grads)
        except Exception:  # noqa: S110 - never the backward's failure: this update is not told
            pass

    def after_forward(self, module: Any, args: Any, output: Any) -> None:
        if module is not self.model:
            return  # a shallow copy of the model shares its hook table: its forwards are not this run's
        s = self._forward_ran(module, output)
        if s is None:
            return
        # The step's phases (forward, then backward up to the optimizer): host clock, no sync.
        s.forwards += 1
        if s.forwards == 1:
            s.forward_end = time.perf_counter()
            if s.device_start is not None:
                s.forward_mark = device_mark()
        if not s.measured:
            return
        if s.outputs_probed:
            self._probe_output(s, output)  # another forward in the step: a micro-batch (accumulation)
            return
        try:
            out = output if type(output) is torch.Tensor else output_tensor(output)
            if out is not None:
                dtype = out.dtype  # read once for the test and the probe: each call into torch is a cold one here
                if dtype.is_floating_point:
                    probe = s.output_sum = finiteness_probe(out, dtype)
                    s.outputs_probed = 1
                    s.forward_probe = defer(probe)
            if not self._classes_decided:
                self._decide_classes(s, output)
        except Exception:  # noqa: S110 - an output torch cannot sum (a nested tensor of ragged parts): not checked
            pass

    def _probe_output(self, s: StepState, output: Any) -> None:
        """One more output into the step's ``finite.forward``: the sum of the probes of all its forwards' outputs
        (on the device, one number whatever the count), up to ``OUTPUT_PROBES``; past them, not checked rather than
        checked in part. A non-finite output of any micro-batch or part is the model's."""
        if s.outputs_probed > OUTPUT_PROBES:
            return
        s.outputs_probed += 1
        if s.outputs_probed > OUTPUT_PROBES:
            s.forward_probe = s.output_sum = None
            return
        try:
            out = output if type(output) is torch.Tensor else output_tensor(output)
            if out is None or not out.dtype.is_floating_point:
                return
            probe = finiteness_probe(out)
            total = s.output_sum
            if total is not None:
                if total.device != probe.device:  # a model split over devices
                    probe = probe.to(total.device, non_blocking=True)
                probe = total + probe
            s.output_sum = probe
            s.forward_probe = defer(probe)
        except Exception:  # noqa: S110 - an output torch cannot sum (a nested tensor of ragged parts): not checked
            pass

    def after_part_forward(self, module: Any, args: Any, output: Any) -> None:
        """A part's forward (parts.py), as the model's with two differences. Every call's output is checked, the
        step's ``finite.forward`` false if any was not: the last part's output is what the loss reads, and a NaN
        an earlier part made is the model's all the same. The forward phase ends with the last part called
        before the optimizer's step, and the first part called in a step counts the model's forwards."""
        parts = self.parts
        if parts is None or parts.get(id(module)) is not module:
            return  # a shallow copy of a part shares its hook table: its forwards are not this run's
        s = self._forward_ran(module, output)
        if s is None:
            return
        if s.first_part is None:
            s.first_part = module
        if module is s.first_part:
            s.forwards += 1
        if s.opt_start is None or self.late_gradients:  # (Lightning: the parts run after the optimizer's pre-hook)
            s.forward_end = time.perf_counter()
            if s.device_start is not None:
                s.forward_mark = device_mark()
        if not s.measured or s.outputs_probed > OUTPUT_PROBES:
            return
        self._probe_output(s, output)
        if s.outputs_probed > OUTPUT_PROBES:
            return
        if not self._classes_decided or self._classes_step == s.step:
            # The step's last part decides: the head, not the backbone (an output torch cannot read: not looked at).
            with contextlib.suppress(Exception):
                self._decide_classes(s, output)

    def _forward_ran(self, module: Any, output: Any) -> StepState | None:
        """A watched forward returned (or raised: ``output`` is None) in ``module``'s mode: the step it ran in, or
        None when it raised, ran in a validation block, or outside any step."""
        if output is None:
            failure = sys.exc_info()[1]  # always_call: the forward is raising
            if failure is not None and process.is_oom(failure):
                self.failures.record_oom(failure)
            s = self.tracker.cur
            if s is not None:
                s.forward_raised = True  # the step the run fails in, though its forward never returned (batches())
            return None
        tracker = self.tracker
        training = module.training
        tracker.forward_training = training
        tracker.training_forwards += training
        evaluation = tracker.eval
        if evaluation is not None:
            # The mode the model evaluates in, not the one it is left in when the block logs.
            evaluation.forwards += 1
            evaluation.training = bool(evaluation.training) or training
            return None
        if self.updates_at_backward and tracker.trains(module) and not tracker.marked:
            self._hook_backward(output)
        return tracker.cur
