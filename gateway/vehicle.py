"""One vehicle's twin inside the gateway: link + telemetry model + publishing.

The link calls `on_messages` synchronously for every batch it decodes; that
is the hot path (model update, event hand-off). State publishing happens on
the daemon's shared ticker via `publish_due`, decimated to the configured rate
per channel (PERFORMANCE.md: never forward every MAVLink message).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from drivers.mavlink.link import LinkState, MavlinkLink
from gateway import envelope
from gateway.config import GatewayConfig, VehicleConfig
from gateway.metrics import GatewayMetrics
from gateway.publisher import Publisher
from gateway.subjects import event_subject, state_subject
from gateway.telemetry import Event, VehicleModel

log = structlog.get_logger("mavjet.vehicle")


class VehicleTwin:
    def __init__(self, vcfg: VehicleConfig, cfg: GatewayConfig, publisher: Publisher, metrics: GatewayMetrics) -> None:
        self.vid = vcfg.vid
        self.cfg = cfg
        self.publisher = publisher
        self.metrics = metrics
        self.model = VehicleModel(vid=vcfg.vid)
        self.link = MavlinkLink(
            name=vcfg.vid, endpoint=vcfg.endpoint, config=cfg.link,
            on_messages=self.on_messages, on_state=self.on_link_state,
        )
        self.recv_ns: dict[str, int] = {}
        self._interval_ns = {ch: int(1e9 / hz) for ch, hz in cfg.rates_hz.items()}
        self._last_pub_ns: dict[str, int] = {}
        self._subjects = {ch: state_subject(cfg.env, vcfg.vid, ch) for ch in cfg.rates_hz}
        self._lost_at_mono: float | None = None
        self._was_up = False
        self._last_msgs = 0
        self._last_link_pub_mono = time.monotonic()
        self.on_event_hooks: list[Any] = []
        self.closing = False  # set at shutdown: our own disconnect is not a lost link

    # -- hot path ----------------------------------------------------------
    def on_messages(self, msgs: list[Any], recv_ns: int) -> None:
        model = self.model
        update = model.update
        try:
            for m in msgs:
                update(m, recv_ns)
        except Exception:  # one bad message must never take the vehicle down
            self.metrics.errors.labels(where="telemetry").inc()
            log.exception("telemetry_update_failed", vehicle=self.vid)
        if model.updated:
            for ch in model.updated:
                self.recv_ns[ch] = recv_ns
            model.updated.clear()
        if model.events:
            self._publish_events(model.drain_events())

    def _publish_events(self, events: list[Event]) -> None:
        for ev in events:
            self.metrics.events.labels(type=ev.type).inc()
            payload = envelope.pack(self.vid, ev.time_ns, ev.data)
            self.publisher.enqueue_event(event_subject(self.cfg.env, self.vid, ev.type), ev.msg_id, payload)
            for hook in self.on_event_hooks:
                hook(ev)

    def emit(self, etype: str, **data: Any) -> None:
        """Emit a gateway-side event (link, command results, shadow) with the vehicle snapshot."""
        self.model.emit(etype, time.time_ns(), **data)
        self._publish_events(self.model.drain_events())

    def on_link_state(self, old: LinkState, new: LinkState) -> None:
        if self.closing:
            return
        now = time.monotonic()
        if new is LinkState.UP:
            if self._was_up and self._lost_at_mono is not None:
                # The outage runs from the last heartbeat before the loss, not from
                # when the timeout noticed it.
                self.emit("link_restored", outage_s=round(now - self._lost_at_mono, 2))
            self._was_up = True
            self._lost_at_mono = None
        elif old is LinkState.UP:
            self._lost_at_mono = self.link.last_heartbeat_mono or now
            age = now - self.link.last_heartbeat_mono if self.link.last_heartbeat_mono else None
            self.emit("link_lost", heartbeat_age_s=None if age is None else round(age, 2))

    # -- ticker ------------------------------------------------------------
    def link_channel(self) -> dict[str, Any]:
        now = time.monotonic()
        st = self.link.codec.stats
        dt = max(1e-3, now - self._last_link_pub_mono)
        rate = (st.messages_in - self._last_msgs) / dt
        self._last_msgs, self._last_link_pub_mono = st.messages_in, now
        hb = self.link.last_heartbeat_mono
        return {
            "state": self.link.state.value,
            "endpoint": str(self.link.endpoint),
            "heartbeat_age_s": round(now - hb, 3) if hb else None,
            "msgs_per_s": round(rate, 1),
            "messages": st.messages_in,
            "crc_errors": st.crc_errors,
            "bad_data": st.bad_data + st.unknown,
            "seq_gaps": st.seq_gaps,
            "connects": self.link.stats.connects,
            "gateway": self.cfg.instance,
        }

    async def publish_due(self, now_ns: int) -> None:
        pub = self.publisher
        last = self._last_pub_ns
        for ch, interval in self._interval_ns.items():
            if now_ns - last.get(ch, 0) < interval:
                continue
            if ch == "link":
                last[ch] = now_ns
                await pub.publish_state(self._subjects[ch], envelope.pack(self.vid, now_ns, self.link_channel()), now_ns)
                continue
            recv = self.recv_ns.get(ch)
            if recv is None or recv <= last.get(ch, 0):
                continue  # nothing new since the last publish
            last[ch] = now_ns
            payload = envelope.pack(self.vid, self.model.sample_ns[ch], self.model.channels[ch])
            await pub.publish_state(self._subjects[ch], payload, recv)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.emit("gateway_started", gateway=self.cfg.instance, version=_version())
        await self.link.run(task_status=task_status)


def _version() -> str:
    from gateway import __version__

    return __version__
