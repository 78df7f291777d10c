"""``overfit_one_batch``: does data → model → loss → gradients → optimizer → parameters work at all?

A model that cannot drive the loss of one fixed batch towards zero will not
learn a dataset; the way it fails names the broken link. Everything runs on a
deep copy: the caller's model and optimizer are not touched.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

LossFn = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

FIT_FACTOR = 10.0  # the loss must fall at least this many times
FLAT_FACTOR = 0.9  # a final loss above this share of the first is flat
# Without an optimizer of the user's, Adam at these lrs in turn, until one fits: 1e-3 is slow on small models.
SEARCH_LRS = (1e-3, 1e-2, 1e-1)


@dataclass
class OverfitResult:
    """The verdict, its evidence, and the curves (one value per step)."""

    passed: bool
    # "fits", "zero-gradients", "no-parameter-change", "loss-flat-with-changing-parameters", "nonfinite" or
    # "slow-progress" (docs/microscope.md)
    reason: str
    explanation: str
    losses: list[float] = field(default_factory=list)
    accuracies: list[float | None] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    param_deltas: list[float] = field(default_factory=list)
    optimizer: str = ""  # the optimizer class and lr the verdict was reached with, e.g. "Adam(lr=0.01)"
    tried: list[str] = field(default_factory=list)  # the lr search's earlier attempts: "Adam(lr=0.001): slow-progress"

    def __str__(self) -> str:
        lines = [f"{'step':>5}  {'loss':>10}  {'accuracy':>8}  {'grad norm':>10}  {'param delta':>11}"]
        n = len(self.losses)
        shown = sorted({*range(0, n, max(1, n // 10)), n - 1}) if n else []
        for i in shown:
            acc = self.accuracies[i] if i < len(self.accuracies) else None
            grad = self.grad_norms[i] if i < len(self.grad_norms) else math.nan
            delta = self.param_deltas[i] if i < len(self.param_deltas) else math.nan
            lines.append(
                f"{i:>5}  {self.losses[i]:>10.4g}  {'-' if acc is None else f'{acc:.0%}':>8}  "
                f"{grad:>10.3g}  {delta:>11.3g}"
            )
        lines.append(f"{'PASSED' if self.passed else 'FAILED'}: {self.reason}. {self.explanation}")
        lines.append(f"optimizer: {self.optimizer}" + (f" (before it: {'; '.join(self.tried)})" if self.tried else ""))
        return "\n".join(lines)


def _split(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, list | tuple) and len(batch) >= 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping) and "labels" in batch:
        return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]
    raise TypeError("overfit_one_batch needs the batch as (inputs, targets) or a dict with 'labels'")


def _call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, Mapping) else model(inputs)


def _logits(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


def _accuracy(output: Any, targets: Any) -> float | None:
    logits = _logits(output)
    if logits is None or not isinstance(targets, torch.Tensor) or targets.is_floating_point():
        return None
    if logits.dim() != targets.dim() + 1 or logits.shape[:-1] != targets.shape:
        return None
    return float((logits.argmax(-1) == targets).float().mean())


def _no_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0


def overfit_one_batch(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    optimizer_factory: OptimizerFactory | None = None,
    steps: int = 200,
    lr: float | None = None,
    publish: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
) -> OverfitResult:
    """Train a copy of ``model`` on ``batch`` alone for ``steps`` steps; say whether and how it fails to fit.

    The optimizer: ``optimizer`` (the user's: its class and first group's
    settings, on the copy), else ``optimizer_factory(params)``, else Adam at
    1e-3, 1e-2 and 1e-1 in turn until one fits (the result says which, and
    what the others gave). ``lr`` overrides every group's lr; weight decay is
    set to 0 and dropout to p=0. With ``publish=True`` the steps stream to the
    viewer as a run named ``overfit-<Model>``.
    """
    if optimizer is not None and optimizer_factory is not None:
        raise ValueError("overfit_one_batch takes optimizer= or optimizer_factory=, not both")
    inputs, targets = _split(batch)
    if optimizer is not None:
        factory: OptimizerFactory = _like(optimizer)
    elif optimizer_factory is not None:
        factory = optimizer_factory
    else:
        tried: list[str] = []
        for i, search_lr in enumerate((lr,) if lr is not None else SEARCH_LRS):
            result = _attempt(model, inputs, targets, loss_fn, _adam(search_lr), steps, None, publish)
            last = i == len(SEARCH_LRS) - 1 or lr is not None
            # Only a loss that falls too slowly or not at all can be an lr matter; the other verdicts are not.
            if result.passed or last or result.reason not in ("slow-progress", "loss-flat-with-changing-parameters"):
                result.tried = tried
                return result
            tried.append(f"{result.optimizer}: {result.reason}")
        raise AssertionError("unreachable")
    return _attempt(model, inputs, targets, loss_fn, factory, steps, lr, publish)


def _adam(lr: float) -> OptimizerFactory:
    return lambda params: torch.optim.Adam(params, lr=lr)


def _like(optimizer: torch.optim.Optimizer) -> OptimizerFactory:
    """The user's optimizer class with its first group's settings, for the copy's parameters."""
    group = optimizer.param_groups[0]
    settings = {k: group[k] for k in optimizer.defaults if k in group}
    return lambda params: type(optimizer)(params, **settings)


def _attempt(
    model: nn.Module,
    inputs: Any,
    targets: Any,
    loss_fn: LossFn,
    factory: OptimizerFactory,
    steps: int,
    lr: float | None,
    publish: bool,
) -> OverfitResult:
    net = copy.deepcopy(model)
    net.train()
    _no_dropout(net)
    optimizer = factory(list(net.parameters()))
    for group in optimizer.param_groups:
        if "weight_decay" in group:
            group["weight_decay"] = 0.0
        if lr is not None:
            group["lr"] = lr
    lrs = sorted({g.get("lr") for g in optimizer.param_groups}, key=str)
    result = OverfitResult(
        passed=False, reason="", explanation="", optimizer=f"{type(optimizer).__name__}(lr={', '.join(map(str, lrs))})"
    )
    watch = None
    if publish:
        from tuiwatch.publisher.watch import Watch

        watch = Watch(net, optimizer, name=f"overfit-{type(model).__name__}")
    try:
        verdict = _train(net, optimizer, inputs, targets, loss_fn, steps, result, watch)
    finally:
        if watch is not None:
            watch.close()
    result.reason, result.explanation = verdict
    result.passed = result.reason == "fits"
    return result


def _train(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: Any,
    targets: Any,
    loss_fn: LossFn,
    steps: int,
    result: OverfitResult,
    watch: Any,
) -> tuple[str, str]:
    named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    for step in range(steps):
        if watch is not None:
            watch.step()
        optimizer.zero_grad(set_to_none=True)
        output = _call(net, inputs)
        loss = loss_fn(output, targets)
        value = float(loss.detach())
        result.losses.append(value)
        result.accuracies.append(_accuracy(output, targets))
        if watch is not None:
            acc = result.accuracies[-1]
            watch.log(loss=value, **({} if acc is None else {"accuracy": acc}))
        if not math.isfinite(value):
            return "nonfinite", (
                f"the loss is {value} at step {step}. Check the loss for log(0), division by zero or an overflowing "
                "exp, and the batch for NaN/inf (tuiwatch.first_nonfinite_module(model, batch) names the first layer "
                "whose output is non-finite)."
            )
        loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad for _, p in named if p.grad is not None]
        grad_norm = _norm(grads)
        result.grad_norms.append(grad_norm)
        if not math.isfinite(grad_norm):
            return (
                "nonfinite",
                f"the gradient norm is {grad_norm} at step {step} while the loss is {value:.4g}: "
                "a backward through log/sqrt/division at 0, or an overflow.",
            )
        if grad_norm == 0.0:
            return "zero-gradients", _zero_gradients(named, step)
        before = [p.detach().clone() for _, p in named]
        optimizer.step()
        delta = _norm([p.detach() - b for (_, p), b in zip(named, before, strict=True)])
        result.param_deltas.append(delta)
        if delta == 0.0 and step >= 2 and not any(result.param_deltas):
            return "no-parameter-change", _no_change(net, optimizer, grad_norm)
    return _judge(result)


def _zero_gradients(named: list[tuple[str, nn.Parameter]], step: int) -> str:
    missing = [n for n, p in named if p.grad is None]
    zero = [n for n, p in named if p.grad is not None and not bool(p.grad.any())]
    parts = []
    if missing:
        parts.append(f"no gradient reached {_names(missing)}")
    if zero:
        parts.append(f"the gradient is exactly 0 for {_names(zero)}")
    return (
        f"At step {step} {'; '.join(parts) or 'no parameter requires grad'}. The loss does not depend on the "
        "model's parameters through autograd: look for .detach(), .item() or a NumPy round-trip between the "
        "model and the loss, torch.no_grad(), or parameters with requires_grad=False."
    )


def _no_change(net: nn.Module, optimizer: torch.optim.Optimizer, grad_norm: float) -> str:
    own = {id(p) for p in net.parameters()}
    held = [p for g in optimizer.param_groups for p in g["params"]]
    holds = sum(id(p) in own for p in held)
    lrs = sorted({g.get("lr") for g in optimizer.param_groups}, key=str)
    text = (
        f"Gradients arrive (norm {grad_norm:.3g}) but no parameter changes. The optimizer holds {holds} of the "
        f"model's {len(own)} parameters and its lr is {', '.join(map(str, lrs))}."
    )
    if holds == 0:
        return text + " It was built on other parameters (a copy of the model?): build it on model.parameters()."
    if all(lr == 0 for lr in lrs):
        return text + " An lr of 0 never moves anything: check the value and the schedule."
    return text + " Check frozen parameters and an lr too small for float32 to register."


def _judge(result: OverfitResult) -> tuple[str, str]:
    first, last = result.losses[0], result.losses[-1]
    best = min(result.losses)
    acc = result.accuracies[-1]
    ratio = first / last if last > 0 else math.inf
    evidence = (
        f"The loss went from {first:.4g} to {last:.4g} (best {best:.4g})"
        + (f", accuracy {acc:.0%}" if acc is not None else "")
        + f" in {len(result.losses)} steps."
    )
    works = " The path data → model → loss → gradients → optimizer → parameters works."
    if ratio >= FIT_FACTOR and (acc is None or acc == 1.0):
        return "fits", evidence + works
    perfect = _perfect_since(result.accuracies)
    if perfect is not None and last <= 0.5 * first and last <= min(result.losses[: len(result.losses) // 2]):
        # Every example right, and the loss still falling: fitting, only not yet to a small loss.
        return "fits", evidence + f" Accuracy is 100% from step {perfect} and the loss is still falling." + works
    if last >= FLAT_FACTOR * first:
        return "loss-flat-with-changing-parameters", evidence + (
            " The parameters change but the loss does not follow: the loss and the output disagree (an extra "
            "softmax before CrossEntropyLoss, targets of the wrong kind or order), or the lr is far too small."
        )
    return "slow-progress", evidence + (
        f" It falls, but not {FIT_FACTOR:.0f}x and not to 100% accuracy: no link is broken, but one batch is not "
        "fitted yet: more steps or a larger lr; if it stalls, check the labels and the output/loss contract."
    )


def _perfect_since(accuracies: list[float | None]) -> int | None:
    """The step from which accuracy stayed at 100% to the end, if it did."""
    since = None
    for i, acc in enumerate(accuracies):
        since = (i if since is None else since) if acc == 1.0 else None
    return since


def _norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(math.fsum(float(t.norm()) ** 2 for t in tensors)) if tensors else 0.0


def _names(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
