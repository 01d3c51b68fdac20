"""Ownership in the daemon: the lease keeper for the gateway's vehicles, its events, log lines and metrics.

`DaemonOwnership` is what `Gateway` (gateway/daemon.py) holds when ownership
is on: it builds the `LeaseKeeper` over TWIN_LEASES through the gateway's one
NATS connection, wires each twin and its link to `may_act` (the twin then
publishes and the link sends only while the gateway owns the vehicle), and
turns the keeper's changes into what people see:

- `owner_acquired` (created, or taken over from a stale owner, naming it) and
  `owner_released` events, with the fencing token. A gateway that lost a
  vehicle publishes nothing about it any more: its successor's
  `owner_acquired` names it as `previous`;
- one log line when a vehicle turns out to be served by another gateway (this
  one is its standby), and a warning when this one is fenced or loses it;
- `/metrics`: owner or standby per vehicle, takeovers, renew latency, frames
  refused for want of the lease;
- a presence record per vehicle it stands by for (gateway/ownership/presence.py),
  so `mavjet twin` and `mavjet fleet` show standbys too.

It also listens on each lease's subject, so a standby hears a release at once
and takes over in a round trip instead of at its next read (the handover of a
rolling update, docs/ownership.md).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from mavjet.contract.events import EventType
from mavjet.contract.subjects import lease_key, lease_kv_subject
from mavjet.gateway.ownership.keeper import GatewayIdentity, LeaseKeeper
from mavjet.gateway.ownership.lease import ChangeKind, LeaseState, OwnershipChange
from mavjet.gateway.ownership.presence import PRESENCE_EVERY_S, LinkView, PresenceWriter
from mavjet.gateway.ownership.store import JetStreamLeaseStore
from mavjet.gateway.publish.publisher import Publisher
from mavjet.gateway.runtime.metrics import GatewayMetrics, OwnershipStatus
from mavjet.gateway.twin.vehicle import VehicleTwin

__all__ = ["DaemonOwnership"]

log = structlog.get_logger("mavjet.ownership")

_DELETED = ("DEL", "PURGE")


class DaemonOwnership:
    """The keeper and everything the daemon does with it (module docstring)."""

    def __init__(self, *, instance: str, env: str, twins: Mapping[str, VehicleTwin], publisher: Publisher,
                 metrics: GatewayMetrics, presence_every_s: float = PRESENCE_EVERY_S) -> None:
        self.identity = GatewayIdentity.of_this_process(instance)
        self.env = env
        self.twins = twins
        self.publisher = publisher
        self.store = JetStreamLeaseStore(lambda: publisher.js)
        # The commands' rows (gateway/commands/shared.py): a longer bound than a renew's.
        self.command_store = JetStreamLeaseStore(lambda: publisher.js, timeout_s=2.0)
        self.keeper = LeaseKeeper(self.store, env=env, vids=list(twins), identity=self.identity, listener=self)
        # A standby shows itself: its presence records beside the leases (gateway/ownership/presence.py).
        self.presence = PresenceWriter(self.store, env=env, identity=self.identity, vids=list(twins),
                                       standby_for=self._standby_for, link=self._link_view, every_s=presence_every_s)
        self._standby_logged: set[str] = set()
        self._announced: set[str] = set()
        for vid, twin in twins.items():
            twin.acting = self._gate(vid)
            twin.recording = self._recording(vid)
            twin.link.gate = twin.acting
            twin.lease_info = self._lease_info(vid)
            twin.announce_on_start = False
        metrics.watch_ownership(self.status)

    def _gate(self, vid: str) -> Any:
        may_act = self.keeper.may_act

        def acting() -> bool:
            return may_act(vid)

        return acting

    def _recording(self, vid: str) -> Any:
        may_record = self.keeper.may_record

        def recording() -> bool:
            return may_record(vid)

        return recording

    def _lease_info(self, vid: str) -> Any:
        keeper, holder = self.keeper, self.identity.holder

        def info() -> dict[str, Any]:
            # Only the owner publishes this record; a fenced owner cut from NATS spools nothing of it.
            return {"owner": holder, "token": keeper.token(vid)}

        return info

    @property
    def holder(self) -> str:
        return self.identity.holder

    def _standby_for(self, vid: str) -> str | None:
        """The owner this gateway stands by for, None when it owns `vid` (or may) or nobody does yet."""
        k = self.keeper
        holder = k.holder(vid)
        if holder is None or holder == self.identity.holder or k.state(vid) is not LeaseState.STANDBY:
            return None
        return holder

    def _link_view(self, vid: str) -> LinkView:
        twin = self.twins[vid]
        dual = twin.dual
        return LinkView(state=twin.session.health().state.value, active_link=str(dual.active) if dual else None)

    # -- the keeper's changes (OwnershipListener) ------------------------------------------------
    def ownership_changed(self, change: OwnershipChange) -> None:
        twin = self.twins.get(change.vid)
        if twin is None:
            return
        self.presence.kick(change.vid)  # became a standby (record now) or the owner (record deleted)
        me = self.identity.holder
        if change.kind in (ChangeKind.ACQUIRED, ChangeKind.TAKEN_OVER):
            self._standby_logged.discard(change.vid)
            if change.vid not in self._announced:  # this process serves the vehicle from now on
                self._announced.add(change.vid)
                twin.announce_started()
            twin.emit(EventType.OWNER_ACQUIRED, gateway=self.identity.instance, holder=me, previous=change.previous,
                      token=change.token, takeover=change.kind is ChangeKind.TAKEN_OVER)
        elif change.kind is ChangeKind.OWNER_SEEN and change.holder is not None and change.holder != me:
            if change.vid not in self._standby_logged:
                self._standby_logged.add(change.vid)
                log.warning("vehicle_served_elsewhere_standby", vehicle=change.vid, owner=change.holder,
                            note="another gateway owns this vehicle: this one keeps the link open, sends and "
                                 "publishes nothing that acts, and takes over if the owner goes")
        elif change.kind is ChangeKind.LOST:
            self._announced.discard(change.vid)

    # -- the daemon's calls ----------------------------------------------------------------------
    def owned(self) -> list[str]:
        return [vid for vid in self.twins if self.keeper.may_act(vid)]

    def before_release(self, reason: str) -> None:
        """Say, while still the owner, that this gateway steps down (published before the lease goes)."""
        for vid in self.owned():
            self.twins[vid].emit(EventType.OWNER_RELEASED, gateway=self.identity.instance, holder=self.holder,
                                 token=self.keeper.token(vid), reason=reason)

    async def settle(self) -> None:
        """Return once every vehicle's owner is known (this gateway or another): the first read and create.

        Startup waits for it (bounded), so READY means each vehicle is served or stood by, not undecided.
        """
        keeper = self.keeper
        while any(keeper.holder(vid) is None for vid in self.twins):
            with anyio.move_on_after(keeper.timing.renew_every_s):
                await keeper.changed()

    async def release(self, *, timeout_s: float) -> None:
        """Delete the leases held and this gateway's presence records, side by side, within `timeout_s`."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(self.presence.remove_all, timeout_s=timeout_s))
            await self.keeper.release(timeout_s=timeout_s)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.keeper.run, name="gateway.ownership.lease_keeper")
            await tg.start(self.presence.run, name="gateway.ownership.presence")
            tg.start_soon(self._hear_releases, name="gateway.ownership.release_watch")
            task_status.started()

    async def _hear_releases(self) -> None:
        """Each lease's subject on core NATS: a delete wakes this gateway's standby for that vehicle at once."""
        subjects = {lease_kv_subject(lease_key(self.env, vid)): vid for vid in self.twins}
        while True:
            await self.publisher.connected.wait()
            for vid in self.twins:  # (re)connected: a standby reads now, not at its next period
                self.keeper.heard_release(vid)
            nc = self.publisher.nc
            if nc is None or not nc.is_connected:
                await anyio.sleep(0.2)
                continue
            subs = []
            try:
                for subject, vid in subjects.items():
                    subs.append(await nc.subscribe(subject, cb=self._on_lease_msg(vid)))
                # nats-py re-subscribes after a reconnect; a client closed for good ends this and is retried.
                # nats-py tells "closed" only to the `closed_cb` given at connect, which the publisher owns
                # (gateway/publish/publisher.py); with reconnects unbounded it closes only at shutdown, so
                # this check of a flag once a second is all it costs.
                while not nc.is_closed:  # noqa: ASYNC110 - no event to wait on without the publisher's callback
                    await anyio.sleep(1.0)
            except Exception as exc:  # a permission error or a closed client: the periodic reads still work
                log.info("lease_release_watch_failed", error=f"{type(exc).__name__}: {exc}")
                await anyio.sleep(5.0)
            finally:
                with anyio.CancelScope(shield=True):
                    for sub in subs:
                        try:
                            await sub.unsubscribe()
                        except Exception:  # the connection may be gone
                            pass

    def _on_lease_msg(self, vid: str) -> Any:
        keeper = self.keeper

        async def on_msg(msg: Any) -> None:
            if (msg.headers or {}).get("KV-Operation") in _DELETED:
                keeper.heard_release(vid)

        return on_msg

    # -- metrics ---------------------------------------------------------------------------------
    def status(self) -> OwnershipStatus:
        k = self.keeper
        states: dict[str, str] = {}
        for vid in self.twins:
            st = k.state(vid)
            states[vid] = "owner" if st is LeaseState.OWNER else str(st)
        return OwnershipStatus(
            states=states, holders={vid: k.holder(vid) for vid in self.twins}, takeovers=k.takeovers,
            renew_latency_s=k.renew_latency_s,
            refused={vid: t.link.stats.refused_not_owner for vid, t in self.twins.items()},
            presence_writes=self.presence.writes + self.presence.deletes, presence_failures=self.presence.failures,
        )
