"""`mavjet rollout`'s rules, without IO: targets, waves, each vehicle's progress, the failure threshold.

A rollout is one `Rollout` document (stored as JSON in TWIN_ROLLOUTS, so a
killed operator process resumes it). The operator loop (ops/rollout_run.py)
observes the fleet, hands the observations to `advance`, performs the writes
it asks for, reports them back with `written` / `write_failed`, and stores the
result. Everything that decides something is here and unit tested
(tests/ops/test_rollout_plan.py):

- ops/rollout_targets.py: the target set from ids or tags, the waves (a
  canary count, then cumulative percentages), the threshold, the change;
- `new_rollout`: the document, each target in its wave;
- `advance`: per vehicle PENDING -> WAITING (until disarmed with the link up,
  or the disarm deadline) -> WRITTEN (until the gateway reports the changed
  fields converged, or rejected, or the convergence deadline) -> CONVERGED
  or FAILED; a wave starts only when the previous one has no vehicle still
  in progress, and the rollout halts when its failures exceed the threshold.

Convergence is not diffed here a second time: the gateway's reconciler
already compares desired with what it read back from the vehicle
(gateway/shadow/diff.py) and publishes the result in `reported`
(`desired_revision`, `delta` by field path). `field_progress` only reads that
verdict for the paths the rollout changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from mavjet.contract.errors import MavjetError


class RolloutError(MavjetError):
    """Bad input for a rollout (a selector, a wave list, a threshold): one line, exit 2."""


class RolloutStatus(StrEnum):
    RUNNING = "running"  # waves in progress (an operator process drives it; `resume` after a kill)
    HALTED = "halted"  # failures exceeded the threshold: nothing new is written; `rollback` or `resume --max-failures`
    ABORTED = "aborted"  # an operator stopped it
    DONE = "done"  # every wave finished within the threshold
    ROLLED_BACK = "rolled_back"  # each written vehicle's previous desired was restored


TERMINAL_STATUSES = frozenset({RolloutStatus.DONE, RolloutStatus.ABORTED, RolloutStatus.ROLLED_BACK})


class Step(StrEnum):
    PENDING = "pending"  # its wave has not started
    WAITING = "waiting"  # waiting for it to be disarmed with its link up
    WRITTEN = "written"  # desired written; waiting for reported to show the changed fields converged
    CONVERGED = "converged"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"  # its previous desired was restored
    SKIPPED = "skipped"  # never written (aborted or halted before its turn)


FINISHED_STEPS = frozenset({Step.CONVERGED, Step.FAILED, Step.ROLLED_BACK, Step.SKIPPED})


class Failure(StrEnum):
    ARMED = "armed"  # still armed at the disarm deadline
    LINK = "link"  # link down (or no gateway reporting) at a deadline
    TIMEOUT = "timeout"  # written, not converged by the convergence deadline
    REJECTED = "rejected"  # the gateway kept failing to apply a changed field (reported.delta attempts)
    INVALID = "invalid"  # the merged desired document does not validate for this vehicle
    CONFLICT = "conflict"  # desired kept changing under the rollout's write


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How patient a rollout is, and when it stops. Stored with it: `resume` uses the same."""

    disarm_timeout_s: float = 300.0
    converge_timeout_s: float = 120.0
    reject_attempts: int = 3  # a changed field's delta with this many attempts counts as refused
    max_failures: int = 0  # more failures than this halts the rollout

    def to_json(self) -> dict[str, Any]:
        return {"disarm_timeout_s": self.disarm_timeout_s, "converge_timeout_s": self.converge_timeout_s,
                "reject_attempts": self.reject_attempts, "max_failures": self.max_failures}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Settings:
        return cls(disarm_timeout_s=float(raw["disarm_timeout_s"]), converge_timeout_s=float(raw["converge_timeout_s"]),
                   reject_attempts=int(raw["reject_attempts"]), max_failures=int(raw["max_failures"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class VehicleRun:
    """One target vehicle's progress (times are wall-clock seconds: they must survive a resume elsewhere)."""

    vid: str
    wave: int
    step: Step = Step.PENDING
    failure: Failure | None = None
    detail: str = ""
    since_s: float = 0.0  # when it entered its current step
    revision: int = 0  # the desired revision the rollout wrote (0: not written)
    previous_revision: int = 0  # desired's revision before (0: there was none)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"wave": self.wave, "step": self.step.value, "since_s": round(self.since_s, 3)}
        if self.failure is not None:
            out["failure"] = self.failure.value
        if self.detail:
            out["detail"] = self.detail
        if self.revision:
            out["revision"] = self.revision
            out["previous_revision"] = self.previous_revision
        return out

    @classmethod
    def from_json(cls, vid: str, raw: Mapping[str, Any]) -> VehicleRun:
        failure = raw.get("failure")
        return cls(vid=vid, wave=int(raw["wave"]), step=Step(raw["step"]),
                   failure=None if failure is None else Failure(failure), detail=str(raw.get("detail", "")),
                   since_s=float(raw.get("since_s", 0.0)), revision=int(raw.get("revision", 0)),
                   previous_revision=int(raw.get("previous_revision", 0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Rollout:
    id: str
    env: str
    change: dict[str, Any]  # path -> value (None removes), applied to each vehicle's desired
    waves: tuple[int, ...]  # cumulative vehicle counts: the end of each wave in `targets`' order
    settings: Settings
    vehicles: dict[str, VehicleRun]  # in target order
    status: RolloutStatus = RolloutStatus.RUNNING
    wave: int = 0  # the wave in progress (== len(waves) when every wave is done)
    reason: str = ""  # why it halted, was aborted or rolled back
    created_s: float = 0.0
    updated_s: float = 0.0
    selector: str = ""  # as given (ids or tags): for people reading status

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self.change)

    def failures(self) -> int:
        return sum(1 for v in self.vehicles.values() if v.step is Step.FAILED)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Step}
        for v in self.vehicles.values():
            out[v.step.value] += 1
        return out

    def in_wave(self, wave: int) -> list[VehicleRun]:
        return [v for v in self.vehicles.values() if v.wave == wave]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "env": self.env, "change": self.change, "waves": list(self.waves),
            "settings": self.settings.to_json(), "status": self.status.value, "wave": self.wave,
            "reason": self.reason, "created_s": round(self.created_s, 3), "updated_s": round(self.updated_s, 3),
            "selector": self.selector, "vehicles": {vid: v.to_json() for vid, v in self.vehicles.items()},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Rollout:
        try:
            return cls(
                id=str(raw["id"]), env=str(raw["env"]), change=dict(raw["change"]),
                waves=tuple(int(w) for w in raw["waves"]), settings=Settings.from_json(raw["settings"]),
                vehicles={vid: VehicleRun.from_json(vid, v) for vid, v in raw["vehicles"].items()},
                status=RolloutStatus(raw["status"]), wave=int(raw["wave"]), reason=str(raw.get("reason", "")),
                created_s=float(raw.get("created_s", 0.0)), updated_s=float(raw.get("updated_s", 0.0)),
                selector=str(raw.get("selector", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RolloutError(f"stored rollout document is not readable ({type(exc).__name__}: {exc})") from None


def new_rollout(*, rollout_id: str, env: str, change: Mapping[str, Any], targets: Sequence[str],
                waves: Sequence[int], settings: Settings, now_s: float, selector: str = "") -> Rollout:
    if not change:
        raise RolloutError("nothing to change: give FIELD=VALUE assignments, e.g. params.RTL_ALT=2000")
    if len(set(targets)) != len(targets):
        raise RolloutError("a vehicle is named twice in the targets")
    if not waves or waves[-1] != len(targets):
        raise RolloutError("the waves must end with every target")
    vehicles: dict[str, VehicleRun] = {}
    wave = 0
    for i, vid in enumerate(targets):
        while i >= waves[wave]:
            wave += 1
        vehicles[vid] = VehicleRun(vid=vid, wave=wave)
    return Rollout(id=rollout_id, env=env, change=dict(change), waves=tuple(waves), settings=settings,
                   vehicles=vehicles, created_s=now_s, updated_s=now_s, selector=selector)


# -- reading the gateway's verdict ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What the stores say about one vehicle now (the operator loop reads it; None: not known)."""

    armed: bool | None = None  # TWIN_STATE status channel
    link_up: bool = False  # reported.link is "up" and its state is fresh
    reported: Mapping[str, Any] | None = None


class Progress(StrEnum):
    PENDING = "pending"  # not yet applied (revision not reached, or a changed field still in the delta)
    CONVERGED = "converged"
    REJECTED = "rejected"


def _under(path: str, changed: str) -> bool:
    return path == changed or path.startswith(changed + ".") or path.startswith(changed + "[") or (
        changed.startswith(path + "."))  # `params` in the delta covers `params.RTL_ALT`; `$` below


def field_progress(reported: Mapping[str, Any] | None, revision: int, paths: Iterable[str], *,
                   reject_attempts: int) -> tuple[Progress, str]:
    """The gateway's verdict on the rollout's changed `paths` at desired `revision` (or later), with a reason."""
    if reported is None:
        return Progress.PENDING, "no reported document"
    seen = reported.get("desired_revision")
    if not isinstance(seen, int) or seen < revision:
        return Progress.PENDING, f"gateway at desired revision {seen}, not {revision} yet"
    delta = reported.get("delta") or {}
    if not isinstance(delta, Mapping):
        return Progress.PENDING, "reported.delta is not a map"
    for changed in paths:
        for path, entry in delta.items():
            if path == "$" or _under(str(path), changed):
                d = entry if isinstance(entry, Mapping) else {}
                reason = f"{path}: {d.get('reason', '?')}"
                if int(d.get("attempts") or 0) >= reject_attempts or path == "$":
                    return Progress.REJECTED, reason
                return Progress.PENDING, reason
    return Progress.CONVERGED, ""


# -- the state machine ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Advance:
    rollout: Rollout
    write: tuple[str, ...] = ()  # vehicles to write desired for now (disarmed, link up)
    finished: tuple[VehicleRun, ...] = ()  # vehicles that reached CONVERGED or FAILED in this step
    waves_done: tuple[int, ...] = ()  # waves that ended in this step
    halted: bool = False  # the threshold was exceeded in this step


def _fail(v: VehicleRun, failure: Failure, detail: str, now_s: float) -> VehicleRun:
    return replace(v, step=Step.FAILED, failure=failure, detail=detail, since_s=now_s)


def advance(r: Rollout, obs: Mapping[str, Observation], now_s: float) -> Advance:
    """One step of a running rollout: start the current wave, judge its vehicles, close it, halt or go on."""
    if r.status is not RolloutStatus.RUNNING:
        return Advance(rollout=r)
    s = r.settings
    vehicles = dict(r.vehicles)
    write: list[str] = []
    finished: list[VehicleRun] = []
    waves_done: list[int] = []
    wave = r.wave
    while wave < len(r.waves):
        for v in [v for v in vehicles.values() if v.wave == wave]:
            o = obs.get(v.vid, Observation())
            new = v
            if v.step is Step.PENDING:
                new = replace(v, step=Step.WAITING, since_s=now_s)
            if new.step is Step.WAITING:
                if o.armed is False and o.link_up:
                    write.append(v.vid)
                elif now_s - new.since_s >= s.disarm_timeout_s:
                    new = (_fail(new, Failure.LINK, "link down or no gateway reporting", now_s) if not o.link_up
                           else _fail(new, Failure.ARMED, "still armed at the disarm deadline", now_s)
                           if o.armed else _fail(new, Failure.LINK, "no state for it", now_s))
            elif new.step is Step.WRITTEN:
                prog, why = field_progress(o.reported, new.revision, r.paths, reject_attempts=s.reject_attempts)
                if prog is Progress.CONVERGED:
                    new = replace(new, step=Step.CONVERGED, detail="", since_s=now_s)
                elif prog is Progress.REJECTED:
                    new = _fail(new, Failure.REJECTED, why, now_s)
                elif now_s - new.since_s >= s.converge_timeout_s:
                    new = _fail(new, Failure.LINK if not o.link_up else Failure.TIMEOUT, why, now_s)
            if new is not v:
                vehicles[v.vid] = new
                if new.step in (Step.CONVERGED, Step.FAILED):
                    finished.append(new)
        failures = sum(1 for v in vehicles.values() if v.step is Step.FAILED)
        if failures > s.max_failures:
            # Stop writing: vehicles of this wave not written yet go back to pending (a resume with a
            # higher threshold takes them up again); written ones keep their record for rollback.
            for v in list(vehicles.values()):
                if v.step is Step.WAITING:
                    vehicles[v.vid] = replace(v, step=Step.PENDING, since_s=now_s)
            reason = f"{failures} failures exceed --max-failures {s.max_failures} (wave {wave + 1} of {len(r.waves)})"
            out = replace(r, vehicles=vehicles, wave=wave, status=RolloutStatus.HALTED, reason=reason, updated_s=now_s)
            return Advance(rollout=out, finished=tuple(finished), waves_done=tuple(waves_done), halted=True)
        if write or any(v.step not in FINISHED_STEPS for v in vehicles.values() if v.wave == wave):
            break
        waves_done.append(wave)
        wave += 1
    status = RolloutStatus.DONE if wave >= len(r.waves) else RolloutStatus.RUNNING
    out = replace(r, vehicles=vehicles, wave=wave, status=status, updated_s=now_s)
    return Advance(rollout=out, write=tuple(write), finished=tuple(finished), waves_done=tuple(waves_done))


def written(r: Rollout, vid: str, *, revision: int, previous_revision: int, now_s: float) -> Rollout:
    v = replace(r.vehicles[vid], step=Step.WRITTEN, revision=revision, previous_revision=previous_revision,
                since_s=now_s, detail="")
    return replace(r, vehicles={**r.vehicles, vid: v}, updated_s=now_s)


def write_failed(r: Rollout, vid: str, failure: Failure, detail: str, now_s: float) -> Rollout:
    return replace(r, vehicles={**r.vehicles, vid: _fail(r.vehicles[vid], failure, detail, now_s)}, updated_s=now_s)


def stop(r: Rollout, status: RolloutStatus, reason: str, now_s: float) -> Rollout:
    """Abort (or finish a rollback): vehicles never written are SKIPPED; the rest keep their record."""
    vehicles = {vid: (replace(v, step=Step.SKIPPED, since_s=now_s) if v.step in (Step.PENDING, Step.WAITING) else v)
                for vid, v in r.vehicles.items()}
    return replace(r, vehicles=vehicles, status=status, reason=reason, updated_s=now_s)


def resume_halted(r: Rollout, max_failures: int | None, now_s: float) -> Rollout:
    """A halted rollout runs on (with a new threshold, if given): `resume` after the operator looked."""
    if r.status is not RolloutStatus.HALTED:
        return r
    settings = r.settings if max_failures is None else replace(r.settings, max_failures=max_failures)
    return replace(r, settings=settings, status=RolloutStatus.RUNNING, reason="", updated_s=now_s)


def to_roll_back(r: Rollout) -> list[VehicleRun]:
    """The vehicles whose desired the rollout wrote (and has not restored yet)."""
    return [v for v in r.vehicles.values() if v.revision and v.step is not Step.ROLLED_BACK]


def rolled_back(r: Rollout, vid: str, detail: str, now_s: float) -> Rollout:
    v = replace(r.vehicles[vid], step=Step.ROLLED_BACK, detail=detail, since_s=now_s)
    return replace(r, vehicles={**r.vehicles, vid: v}, updated_s=now_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """For the progress bar and `status`: the counts people read."""

    total: int
    finished: int
    converged: int
    failed: int
    wave: int
    waves: int
    by_failure: dict[str, int] = field(default_factory=dict)


def summary(r: Rollout) -> Summary:
    by: dict[str, int] = {}
    for v in r.vehicles.values():
        if v.failure is not None and v.step is Step.FAILED:
            by[v.failure.value] = by.get(v.failure.value, 0) + 1
    c = r.counts()
    return Summary(total=len(r.vehicles), finished=sum(c[s.value] for s in FINISHED_STEPS),
                   converged=c[Step.CONVERGED.value], failed=c[Step.FAILED.value],
                   wave=min(r.wave + 1, len(r.waves)), waves=len(r.waves), by_failure=by)
