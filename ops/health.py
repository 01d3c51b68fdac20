"""Stream health of the twin's JetStream resources, read from the JetStream API.

Seed 000's "Stream Health" table is the spec: consumer lag > 10,000 messages,
stream bytes > 80% of max, any replica behind, ack pending > 1,000 per
consumer. Collecting (`collect_health`) is the only part that talks to the
server; judging (`evaluate`) is a pure function over the snapshot, so the same
thresholds drive `mavjet monitor --once`, the Prometheus exporter and the tests.
`deploy/prometheus/rules.yml` repeats the numbers for Prometheus; a test keeps
the two in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js import api as jsapi

# Streams that belong to the twin: TWIN_STATE/EVENTS/CMD, KV_TWIN_SHADOW, OBJ_TWIN_BLOBS.
TWIN_PREFIXES = ("TWIN_", "KV_TWIN_", "OBJ_TWIN_")


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """Alert thresholds (seed 000, Operational Considerations)."""

    consumer_lag_msgs: int = 10_000
    bytes_ratio: float = 0.8
    ack_pending_msgs: int = 1_000

    def __post_init__(self) -> None:
        if self.consumer_lag_msgs < 0 or self.ack_pending_msgs < 0:
            raise ValueError("thresholds must be >= 0")
        if not 0.0 < self.bytes_ratio <= 1.0:
            raise ValueError("bytes_ratio must be in (0, 1]")


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamHealth:
    stream: str
    messages: int
    bytes: int
    max_bytes: int  # -1: unlimited
    replicas: int  # configured
    leader: str | None  # None on a single server, or while a cluster elects one
    clustered: bool

    @property
    def bytes_ratio(self) -> float | None:
        """bytes / max_bytes, or None when the stream has no byte limit."""
        if self.max_bytes <= 0:
            return None
        return self.bytes / self.max_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerHealth:
    stream: str
    consumer: str
    num_pending: int  # the consumer's lag: messages not yet delivered
    num_ack_pending: int  # delivered, not yet acknowledged
    num_redelivered: int
    num_waiting: int  # pull requests waiting


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaHealth:
    """A follower of a stream's RAFT group as the leader sees it."""

    stream: str
    peer: str
    current: bool
    offline: bool
    lag: int  # operations behind the leader

    @property
    def behind(self) -> bool:
        return self.offline or not self.current or self.lag > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    streams: tuple[StreamHealth, ...] = ()
    consumers: tuple[ConsumerHealth, ...] = ()
    replicas: tuple[ReplicaHealth, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One threshold crossed; `kind` matches the alert name in rules.yml."""

    kind: str  # consumer_lag | stream_bytes | replica_behind | ack_pending | no_leader
    subject: str  # stream, stream/consumer or stream/peer
    value: float
    threshold: float
    detail: str = field(default="")

    def describe(self) -> str:
        return f"{self.kind:15} {self.subject}: {self.detail}"


def is_twin_stream(name: str) -> bool:
    return name.startswith(TWIN_PREFIXES)


def stream_health(info: jsapi.StreamInfo) -> tuple[StreamHealth, list[ReplicaHealth]]:
    """Pure: one StreamInfo -> its health and its followers."""
    cfg, state = info.config, info.state
    name = cfg.name or "?"
    cluster = info.cluster
    clustered = bool(cluster is not None and (cluster.replicas or (cfg.num_replicas or 1) > 1))
    sh = StreamHealth(
        stream=name,
        messages=int(state.messages or 0),
        bytes=int(state.bytes or 0),
        max_bytes=int(cfg.max_bytes) if cfg.max_bytes not in (None, 0) else -1,
        replicas=int(cfg.num_replicas or 1),
        leader=(cluster.leader or None) if cluster is not None else None,
        clustered=clustered,
    )
    reps = [
        ReplicaHealth(
            stream=name,
            peer=p.name or "?",
            current=bool(p.current),
            offline=bool(p.offline),
            lag=int(p.lag or 0),
        )
        for p in ((cluster.replicas or []) if cluster is not None else [])
    ]
    return sh, reps


def consumer_health(info: jsapi.ConsumerInfo) -> ConsumerHealth:
    return ConsumerHealth(
        stream=info.stream_name,
        consumer=info.name,
        num_pending=int(info.num_pending or 0),
        num_ack_pending=int(info.num_ack_pending or 0),
        num_redelivered=int(info.num_redelivered or 0),
        num_waiting=int(info.num_waiting or 0),
    )


async def _all_streams(js: JetStreamContext) -> list[jsapi.StreamInfo]:
    out: list[jsapi.StreamInfo] = []
    for _ in range(1000):  # pages of 256: far more streams than a hub holds
        page = await js.streams_info(offset=len(out))
        if not page:
            break
        out.extend(page)
    return out


async def _all_consumers(js: JetStreamContext, stream: str) -> list[jsapi.ConsumerInfo]:
    out: list[jsapi.ConsumerInfo] = []
    for _ in range(1000):  # TWIN_CMD has one consumer per vehicle: page through the fleet
        page = await js.consumers_info(stream, offset=len(out))
        if not page:
            break
        out.extend(page)
    return out


async def collect_health(js: JetStreamContext, *, streams: Sequence[str] | None = None) -> Health:
    """Read every twin stream (or the named ones), its consumers and replicas."""
    infos = [i for i in await _all_streams(js) if i.config.name is not None]
    if streams is not None:
        wanted = set(streams)
        infos = [i for i in infos if i.config.name in wanted]
    else:
        infos = [i for i in infos if is_twin_stream(i.config.name or "")]
    out_streams: list[StreamHealth] = []
    out_replicas: list[ReplicaHealth] = []
    out_consumers: list[ConsumerHealth] = []
    for info in sorted(infos, key=lambda i: i.config.name or ""):
        sh, reps = stream_health(info)
        out_streams.append(sh)
        out_replicas.extend(reps)
        out_consumers.extend(consumer_health(c) for c in await _all_consumers(js, sh.stream))
    return Health(streams=tuple(out_streams), consumers=tuple(out_consumers), replicas=tuple(out_replicas))


def evaluate(health: Health, thresholds: Thresholds | None = None) -> list[Problem]:
    """Pure: every threshold the snapshot crosses."""
    t = thresholds or Thresholds()
    problems: list[Problem] = []
    for s in health.streams:
        ratio = s.bytes_ratio
        if ratio is not None and ratio > t.bytes_ratio:
            problems.append(
                Problem(kind="stream_bytes", subject=s.stream, value=ratio, threshold=t.bytes_ratio,
                        detail=f"{s.bytes} of {s.max_bytes} bytes ({ratio:.0%} > {t.bytes_ratio:.0%})")
            )
        if s.clustered and s.replicas > 1 and not s.leader:
            problems.append(Problem(kind="no_leader", subject=s.stream, value=0, threshold=1,
                                    detail="no stream leader (election in progress or quorum lost)"))
    for c in health.consumers:
        name = f"{c.stream}/{c.consumer}"
        if c.num_pending > t.consumer_lag_msgs:
            problems.append(Problem(kind="consumer_lag", subject=name, value=c.num_pending,
                                    threshold=t.consumer_lag_msgs,
                                    detail=f"{c.num_pending} messages pending > {t.consumer_lag_msgs}"))
        if c.num_ack_pending > t.ack_pending_msgs:
            problems.append(Problem(kind="ack_pending", subject=name, value=c.num_ack_pending,
                                    threshold=t.ack_pending_msgs,
                                    detail=f"{c.num_ack_pending} unacknowledged > {t.ack_pending_msgs}"))
    for r in health.replicas:
        if r.behind:
            state = "offline" if r.offline else ("not current" if not r.current else "lagging")
            problems.append(Problem(kind="replica_behind", subject=f"{r.stream}/{r.peer}", value=r.lag,
                                    threshold=0, detail=f"{state}, lag {r.lag}"))
    return problems
