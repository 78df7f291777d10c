"""The ranks of a multi-rank job as the viewer knows them. Pure: no Textual, no I/O.

Each rank's records arrive on a connection of their own, in that rank's
order; nothing orders them across ranks but the step numbers they carry
(hosts' clocks differ). :class:`RanksState` folds every rank's records into a
small summary per rank (the ranks pane), runs the rules that need all ranks
at once (``straggler``), and says which records the run's main
:class:`~tuiwatch.viewer.state.RunState` takes: the lead rank's (the lowest:
its loss, lr and charts are the job's, as ``report`` of a job directory does),
every rank's alerts, and one combined reply per command sent to all ranks.

A sharded job's ranks (FSDP: the run record's ``sharded``) each measure their
shard's norms. Where the viewer has every rank of the job, the lead's step
records wait until every rank's record of the same step has come, and go on
with the model's norms: the root of the sum of the ranks' squares
(``norms: "job"``); a step a rank will not send (its relay thinned it, it
ended, or its connection went away) goes on with no norm rather than with a
shard's.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tuiwatch.ledger.fields import integer, num
from tuiwatch.ledger.records import Record
from tuiwatch.rules.resources import Straggler
from tuiwatch.viewer.render.series import Series
from tuiwatch.viewer.state import end_status

# A rank that sent nothing for this long (or three of its steps, if longer) is stale: a live run sends a
# system record every second, every third second while it waits, whatever its step time.
STALE_S = 5.0
WINDOW = 20  # steps per rank the pane's medians are taken over
# How far ahead of the furthest rank the viewer sets a command's step: longer than records take to reach it (a
# few tens of ms here, more through ssh or on a loaded host), short enough to feel immediate.
LEAD_S = 1.0
MAX_KEPT_ALERTS = 50  # per rank, to show again when the lead rank's connection starts over
# A sharded job's lead records held for the other ranks' norms at most: past it the oldest goes on without them.
MAX_HELD = 256
NORMS = ("grad_norm", "param_norm", "update_norm")
MAX_NORM_STEPS = 20_000  # steps of shard norms waiting for the lead's record of their step


@dataclass
class RankState:
    rank: int
    host: str | None = None
    pid: int | None = None
    step: int | None = None
    connected: bool = False
    end_reason: str | None = None
    paused: bool = False
    last_seen: float | None = None  # the viewer's clock when the rank's last record came
    step_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    data_wait_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    backward_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    memory: float | None = None  # bytes: the device's allocated memory, else the process's RSS
    alerts: deque[Record] = field(default_factory=lambda: deque(maxlen=MAX_KEPT_ALERTS))
    # Over steps, for the ranks pane's charts: what differs between ranks (the step time does not under DDP).
    wait_series: Series = field(default_factory=Series)
    memory_series: Series = field(default_factory=Series)
    uses_rss: bool = False  # its memory is the RSS of its system records
    thinned: int = 0  # step records its host's relay left out (a rank faster than a viewer needs)

    def status(self, now: float) -> str:
        if self.end_reason is not None:
            return end_status(self.end_reason)
        if not self.connected:
            return "gone" if self.last_seen is not None else "connecting"
        if self.paused:
            return "paused"
        step = self.median("step_s") or 0.0
        if self.last_seen is not None and now - self.last_seen > max(STALE_S, 3 * step):
            return "stale"
        return "live"

    def median(self, name: str) -> float | None:
        values: deque[float] = getattr(self, name)
        return statistics.median(values) if values else None


@dataclass
class _Sent:
    cmd: str
    waiting: set[int]
    replies: dict[int, Record] = field(default_factory=dict)


class RanksState:
    def __init__(self, ranks: Iterable[int], world_size: int):
        self.world_size = world_size
        self.ranks = {r: RankState(r) for r in sorted(ranks)}
        self.lead = min(self.ranks)
        self.straggler = Straggler()
        self.waited_for: int | None = None  # the rank the straggler rule names, until it clears
        self._sent: dict[int, _Sent] = {}
        # The last step of each rank the straggler rule has seen, and of which process: a reconnected rank's
        # stream starts again at its history, which the rule must not take for new steps.
        self._judged: dict[int, tuple[int | None, int]] = {}
        self._settled: deque[int] = deque(maxlen=64)  # this viewer's commands already answered by every rank
        # A sharded job seen whole: the lead's records held for the model's norms, and each rank's shard norms by step.
        self.combining = False
        self._held: deque[Record] = deque()
        self._norms: dict[int, dict[int, tuple[float | None, ...]]] = {}

    # --- records in ----------------------------------------------------------------

    def apply(self, rank: int, records: Iterable[Record], now: float) -> list[Record]:
        """Fold one rank's records; the records the run's main state takes, in order."""
        state = self.ranks[rank]
        state.last_seen = now
        out: list[Record] = []
        lead = rank == self.lead
        for r in records:
            kind = r.get("kind")
            if kind == "step":
                self._step(state, r)
                if self._new_to_the_rule(rank, state):
                    out += self._judge(rank, r)
                if self.combining:
                    self._shard_norms(rank, r)
                if lead:
                    self._to_main(r, out)
                if self.combining:
                    out += self._release()
            elif kind == "alert":
                tagged = {**r, "rank": rank}
                state.alerts.append(tagged)
                out.append(tagged)
            elif kind == "action":
                combined = self._answer(rank, r)
                if combined is not None:
                    out.append(combined)
            else:
                if kind == "run":
                    state.host = str(r.get("host") or "") or None
                    state.pid = integer(r.get("pid"))
                    state.end_reason = None
                    # Any rank's run record tells (a job's ranks are sharded alike): one may come before the lead's.
                    if r.get("sharded") is True and len(self.ranks) == self.world_size:
                        self.combining = True
                    # Off CUDA there is no device memory in its steps: the process's RSS stands for it.
                    state.uses_rss = not str(r.get("device") or "").startswith("cuda")
                elif kind == "end":
                    state.end_reason = str(r.get("reason", "finished"))
                    state.paused = False
                elif kind == "relay":
                    state.thinned += integer(r.get("thinned")) or 0
                elif kind == "system" and state.uses_rss:
                    rss = num(r.get("rss"))
                    if rss is not None:
                        state.memory = rss
                        if state.step is not None:
                            state.memory_series.add(state.step, rss)
                if lead:
                    self._to_main(r, out)
                if self.combining and kind == "end":
                    out += self._release()  # a step the ended rank never sent goes on without the model's norms
        return out

    def _to_main(self, r: Record, out: list[Record]) -> None:
        """The lead's record for the main state: behind any held step (the order is the lead's), else now."""
        if self._held or (self.combining and r.get("kind") == "step"):
            self._held.append(r)
        else:
            out.append(r)

    def _shard_norms(self, rank: int, r: Record) -> None:
        step = integer(r.get("step"))
        # Bounded: a rank read far ahead of the lead (a replay) keeps the steps the lead needs first.
        if step is not None and (step in self._norms or len(self._norms) < MAX_NORM_STEPS):
            self._norms.setdefault(step, {})[rank] = tuple(num(r.get(name)) for name in NORMS)

    def _release(self) -> list[Record]:
        """The held lead records whose step every rank has sent (with the model's norms), or never will."""
        out: list[Record] = []
        while self._held:
            r = self._held[0]
            if r.get("kind") != "step":
                out.append(self._held.popleft())
                continue
            step = integer(r.get("step"))
            shards = self._norms.get(step, {}) if step is not None else {}
            if len(shards) < self.world_size and not self._never(step, shards) and len(self._held) <= MAX_HELD:
                break
            self._held.popleft()
            out.append({**r, **_model_norms(shards, self.world_size), "norms": "job"})
            if step is not None:
                self._norms.pop(step, None)
                # Steps the lead never sent (thinned): the oldest first, as they came in.
                while self._norms and (first := next(iter(self._norms))) < step:
                    del self._norms[first]
        return out

    def _never(self, step: int | None, shards: dict[int, Any]) -> bool:
        """Whether a rank missing from ``shards`` will not send ``step`` now: it went past it, ended, or its
        connection went away (the lead's records do not wait for its return)."""
        for rank, state in self.ranks.items():
            if rank in shards:
                continue
            if step is None or state.end_reason is not None or (state.step is not None and state.step > step):
                return True
            if not state.connected and state.last_seen is not None:
                return True
        return False

    def _step(self, state: RankState, r: Record) -> None:
        state.step = integer(r.get("step"))
        wait, compute = num(r.get("data_wait_s")), num(r.get("compute_s"))
        if compute is not None:
            state.step_s.append((wait or 0.0) + compute)
        if wait is not None:
            state.data_wait_s.append(wait)
            if state.step is not None:
                state.wait_series.add(state.step, wait)
        backward = num(r.get("backward_s"))
        if backward is not None:
            state.backward_s.append(backward)
        mem = num(r.get("mem_allocated"))
        if mem is not None and not state.uses_rss:
            state.memory = mem
            if state.step is not None:
                state.memory_series.add(state.step, mem)

    def _new_to_the_rule(self, rank: int, state: RankState) -> bool:
        pid, judged = self._judged.get(rank, (None, -1))
        if state.step is None:
            return True
        if state.pid != pid:  # another process for this rank (a restart): its steps count again from 0
            judged = -1
        if state.step <= judged:
            return False
        self._judged[rank] = (state.pid, state.step)
        return True

    def _judge(self, rank: int, r: Record) -> list[Record]:
        alert = self.straggler.observe({**r, "rank": rank})
        if alert is None:
            return []
        if alert["severity"] == "info":
            self.waited_for = None
        else:
            evidence = alert.get("evidence") or {}
            self.waited_for = integer(evidence.get("rank")) if isinstance(evidence, dict) else None
        return [{**alert, "rank": self.waited_for if self.waited_for is not None else rank}]

    def connected(self, rank: int) -> None:
        """A (re)connection of ``rank``: its stream starts again at its run record."""
        old = self.ranks[rank]
        self.ranks[rank] = RankState(rank, host=old.host, pid=old.pid, connected=True, last_seen=old.last_seen)
        if rank == self.lead:
            self._held.clear()  # the main state starts over with the lead's history, which comes again

    def disconnected(self, rank: int) -> list[Record]:
        """``rank`` went away; the combined replies this settles (commands it will never answer)."""
        self.ranks[rank].connected = False
        out = []
        for cmd_id, sent in list(self._sent.items()):
            if rank in sent.waiting:
                sent.waiting.discard(rank)
                gone = "the rank went away before it answered"
                sent.replies[rank] = {"kind": "action", "id": cmd_id, "action": sent.cmd, "ok": False, "error": gone}
                out += self._settle(cmd_id)
        if self.combining:
            out += self._release()  # the lead's steps do not wait for it
        return out

    def kept_alerts(self) -> list[Record]:
        """Every rank's alerts but the lead's: what a fresh main state is given again."""
        return [a for r, s in self.ranks.items() if r != self.lead for a in s.alerts]

    # --- commands to every rank --------------------------------------------------------

    def sent(self, cmd_id: int, cmd: str, ranks: Iterable[int]) -> None:
        self._sent[cmd_id] = _Sent(cmd, set(ranks))

    def _answer(self, rank: int, r: Record) -> Record | None:
        cmd_id = integer(r.get("id"))
        sent = self._sent.get(cmd_id) if cmd_id is not None else None
        if cmd_id is None or sent is None or rank not in sent.waiting:
            # Another viewer's command (or a reply already settled): shown once, as the lead rank answered it.
            return r if rank == self.lead and (sent is None and cmd_id not in self._settled) else None
        sent.waiting.discard(rank)
        sent.replies[rank] = r
        if r.get("ok") is True and sent.cmd in ("pause", "resume"):
            self.ranks[rank].paused = sent.cmd == "pause"
        settled = self._settle(cmd_id)
        return settled[0] if settled else None

    def _settle(self, cmd_id: int) -> list[Record]:
        sent = self._sent[cmd_id]
        if sent.waiting:
            return []
        del self._sent[cmd_id]
        self._settled.append(cmd_id)
        return [combine_replies(cmd_id, sent.cmd, sent.replies)]

    # --- derived ------------------------------------------------------------------------

    def furthest_step(self) -> int | None:
        steps = [s.step for s in self.ranks.values() if s.step is not None]
        return max(steps) if steps else None

    def command_step(self, lead_s: float = LEAD_S) -> int | None:
        """The step count every rank runs a command at: just ahead of the furthest rank, by the records still
        on their way (``lead_s`` of steps, at least two)."""
        furthest = self.furthest_step()
        if furthest is None:
            return None
        steps = [m for s in self.ranks.values() if (m := s.median("step_s"))]
        ahead = max(2, math.ceil(lead_s / min(steps))) if steps else 2
        return furthest + 1 + ahead

    def live_ranks(self) -> list[int]:
        return [r for r, s in self.ranks.items() if s.connected and s.end_reason is None]


def _model_norms(shards: dict[int, tuple[float | None, ...]], world_size: int) -> dict[str, float | None]:
    """Each norm of the model from its ranks' shards: the root of the sum of their squares, where every rank gave
    one; none otherwise (a shard's alone is not the model's)."""
    norms: dict[str, float | None] = {}
    for i, name in enumerate(NORMS):
        values = [v[i] for v in shards.values()]
        complete = len(values) == world_size and all(v is not None for v in values)
        norms[name] = math.sqrt(sum(v * v for v in values if v is not None)) if complete else None
    norms["grad_norm_clipped"] = None
    return norms


def combine_replies(cmd_id: int, cmd: str, replies: dict[int, Record]) -> Record:
    """One ``action`` record for a command every rank answered: ok only if every rank's was, with the step
    each acted at, and the first failure named by its rank."""
    failed = sorted(r for r, reply in replies.items() if reply.get("ok") is not True)
    steps = {r: integer(reply.get("step")) for r, reply in replies.items()}
    lead = min(replies)
    combined: dict[str, Any] = {**replies[lead], "id": cmd_id, "action": cmd, "ranks": sorted(replies)}
    combined["ok"] = not failed
    combined["rank_steps"] = {str(r): s for r, s in sorted(steps.items())}
    # Ranks of a DDP job that paused or stopped apart: the one ahead waits in a collective for the others.
    combined["apart"] = len(set(steps.values())) > 1
    if failed:
        first = failed[0]
        combined["error"] = f"failed on rank {first}: {replies[first].get('error') or 'no reason given'}" + (
            f" (and on {len(failed) - 1} more)" if len(failed) > 1 else ""
        )
    return combined
