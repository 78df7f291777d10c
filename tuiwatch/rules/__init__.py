"""Diagnosis: pure rules over the record stream, one module per family, and their registry.

The same :class:`Diagnosis` runs inside the training process (on the
publisher's thread, so alerts fire with nobody watching) and in ``report``.
No torch, no Textual.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tuiwatch.ledger.records import AlertRecord, Record
from tuiwatch.rules.base import Rule
from tuiwatch.rules.gradients import GradExplosion, GradZero
from tuiwatch.rules.loop import DataBound, EvalMode
from tuiwatch.rules.loss import LossChance, LossFrozen, LossSpike, Overfit
from tuiwatch.rules.optimizer import LrZero, NoUpdate
from tuiwatch.rules.resources import MemoryGrowth, Oom, Straggler
from tuiwatch.rules.values import NonFinite

# Rule id → factory. Ids are public (SPEC §6); each factory takes its thresholds as keywords.
# Listed in the order of the chain data → model → loss → gradients → optimizer → parameters, then the machine;
# within a link, a named cause (loss at chance) before a symptom (a jump in the loss) seen at the same record.
REGISTRY: dict[str, Callable[..., Rule]] = {
    "nonfinite": NonFinite,
    "data-bound": DataBound,
    "eval-mode": EvalMode,
    "loss-chance": LossChance,
    "loss-spike": LossSpike,
    "loss-frozen": LossFrozen,
    "grad-explosion": GradExplosion,
    "grad-zero": GradZero,
    "lr-zero": LrZero,
    "no-update": NoUpdate,
    "overfit": Overfit,
    "memory-growth": MemoryGrowth,
    "oom": Oom,
    "straggler": Straggler,
}

# What ``Watch(rules=...)`` and ``Diagnosis`` accept: ids to run with their
# defaults, or {id: thresholds | False} over all rules (False turns one off).
RulesConfig = Iterable[str] | Mapping[str, Mapping[str, Any] | bool | None]


def rules_as_data(config: RulesConfig | None) -> list[str] | dict[str, Any] | None:
    """``config`` as plain data (a list, or a dict of dicts and False), as a run record keeps it: an iterable
    is read once here, so the rules built from the result and the record are the same."""
    if config is None:
        return None
    _refuse_a_string(config)
    if isinstance(config, Mapping):
        return {
            str(k): {n: _plain(x) for n, x in v.items()} if isinstance(v, Mapping) else v for k, v in config.items()
        }
    return list(config)


# Off by default in a reinforcement-learning loop, where the config does not name them (docs/rules.md): a policy's
# loss and gradients are not a descent to a floor, and they jump with every new rollout (PPO, A2C) or
# target-network update (DQN), many times in a healthy run. Nor is its loss a classifier's: a Q-network's output
# (a value per action) beside a batch of integer actions reads as logits and labels, and a TD loss that rose past
# ln(actions) at a target update read as "back to chance".
NOT_FOR_REINFORCEMENT_LEARNING = ("loss-spike", "grad-explosion", "loss-chance")


def for_reinforcement_learning(
    config: list[str] | dict[str, Any] | None,
) -> tuple[list[str] | dict[str, Any] | None, list[str]]:
    """``config`` (as :func:`rules_as_data` gives it) for a reinforcement-learning loop, and the rules this turned
    off: those of :data:`NOT_FOR_REINFORCEMENT_LEARNING` it does not name. A list of ids is the user's whole
    choice, and stays."""
    if isinstance(config, list):
        return config, []
    given = config or {}
    off = [r for r in NOT_FOR_REINFORCEMENT_LEARNING if r not in given]
    return {**dict.fromkeys(off, False), **given}, off


def _plain(value: Any) -> Any:
    """A threshold as JSON writes it: a numpy scalar as the int or float it holds (others as they are)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _refuse_a_string(config: object) -> None:
    if isinstance(config, str):  # iterable, so it would read as one rule id a letter
        raise ValueError(f"rules= takes a list of rule ids, not the string {config!r}: write rules=[{config!r}]")


def thresholds(rule_id: str) -> dict[str, Any]:
    """A rule's thresholds and their defaults, as its factory declares them."""
    params = inspect.signature(REGISTRY[rule_id]).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def build_rules(config: RulesConfig | None = None) -> list[Rule]:
    """The rules ``config`` asks for; a one-line ValueError for an unknown id or threshold."""
    if config is None:
        wanted: dict[str, Mapping[str, Any]] = {r: {} for r in REGISTRY}
    elif isinstance(config, Mapping):
        for value in config.values():
            if not (value is None or isinstance(value, bool | Mapping)):
                raise ValueError(f"rules={{id: ...}} takes a dict of thresholds or False, got {value!r}")
        wanted = {r: {} for r in REGISTRY}
        wanted.update({r: v if isinstance(v, Mapping) else {} for r, v in config.items()})
        wanted = {r: v for r, v in wanted.items() if config.get(r) is not False}
    else:
        _refuse_a_string(config)
        wanted = {r: {} for r in config}
    unknown = set(wanted) - set(REGISTRY)
    if unknown:
        raise ValueError(f"unknown rule ids {sorted(unknown)}: known are {', '.join(REGISTRY)}")
    rules = []
    for rule_id, values in wanted.items():
        defaults = thresholds(rule_id)
        bad = set(values) - set(defaults)
        if bad:
            known = ", ".join(defaults) or "none"
            raise ValueError(f"rule {rule_id!r} has no threshold {sorted(bad)}: its thresholds are {known}")
        for name, value in values.items():
            # Every threshold is a number (a count, a ratio, a class count whose default None means "found"):
            # anything else would fail later, on the training process's publisher thread.
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not number and not (value is None and defaults[name] is None):
                raise ValueError(f"rule {rule_id!r}: threshold {name} takes a number, got {value!r}")
        rules.append(REGISTRY[rule_id](**values))
    return rules


class Diagnosis:
    """Feeds records to every rule; returns the alert records they raise."""

    def __init__(self, rules: RulesConfig | None = None):
        self.rules = build_rules(rules)
        # The rules of each record kind, in registry order: one lookup a record instead of a test per rule. With
        # each, its bound check() if it keeps the base class's observe(): then its usual case (no episode active)
        # is a call of its check() from here, one Python call a rule instead of two (this runs for every step
        # record).
        self._by_kind: dict[object, list[tuple[Rule, Callable[[Record], AlertRecord | None] | None]]] = {}
        for rule in self.rules:
            check = rule.check if type(rule).observe is Rule.observe else None
            for kind in rule.kinds:
                self._by_kind.setdefault(kind, []).append((rule, check))

    def feed(self, record: Record) -> list[AlertRecord]:
        out = []
        for rule, check in self._by_kind.get(record.get("kind"), ()):
            if check is not None and not rule.active:
                found = check(record)  # Rule.observe, inlined
                if found is not None:
                    rule.active = True
                    out.append(found)
                continue
            found = rule.observe(record)
            if found is not None:
                out.append(found)
        return out

    def run(self, records: Iterable[Record]) -> list[AlertRecord]:
        return [a for r in records if r.get("kind") != "alert" for a in self.feed(r)]


__all__ = ["REGISTRY", "Diagnosis", "Rule", "RulesConfig", "build_rules", "thresholds"]
