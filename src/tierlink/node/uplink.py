"""A node's store-and-forward side: everything it must deliver upstream goes through a durable
outbox and is delivered, in order, with backoff, until the receiver acknowledges it.

:class:`Uplink` owns an :class:`~tierlink.outbox.Outbox` at ``<state_dir>/outbox.db``
(SQLite, WAL: an accepted item survives kill -9) and a
:class:`~tierlink.outbox.Deliverer` with one loop per destination:

* ``parent`` — this node's first upstream (a device's edge, an edge's cloud), at
  ``<upstream url>/tierlink/v1/inbox``; the parent stores each item in its own outbox before
  acknowledging it (:mod:`tierlink.node.inbox_routes`), so nothing is lost between hops.
  When the parent fails (unreachable, times out, answers an error) the next attempt goes to
  the node's next upstream, round the list (``fallback_urls``), and stays with whichever
  answers: one line, in order; the keys are global, so an item that reached two parents
  is still applied once at the control plane;
* ``control`` — the control plane's ``/v1/results`` (with the node's ``Authorization``).

Items are JSON values with a kind (``result`` for asynchronous requests, ``hard_example``,
``telemetry``, ...) and an idempotency key; the wire format is :mod:`tierlink.outbox.wire`.
The receivers dedupe by key, so delivery (at least once) has an exactly-once effect.

When the outbox is full (``max_items`` / ``max_bytes``) the policy is per kind
(:data:`DEFAULT_FULL_POLICY`): ``result`` and unknown kinds are **refused** — never evicted;
the producer gets :class:`~tierlink.errors.OutboxError` (503) and the item was not accepted
(an asynchronous request is then answered 503, not 202); ``hard_example`` and ``telemetry``
are expendable: the oldest of them are evicted to make room (``tierlink_outbox_dropped_total
{reason="full"}``). Items older than ``ttl_s`` (default one day) are dropped as ``expired``.

Uplink state (:meth:`Uplink.state`): ``down`` while the last delivery attempt to the
destination failed and items are waiting, ``up`` otherwise. A node restarted during an
outage starts ``down`` when its head item had already failed (persisted attempts), so the
answers it gives right after a restart say so too.

Threads: :meth:`Uplink.enqueue` may be called from any thread (it fsyncs: call it off the
event loop); :meth:`Uplink.put`, :meth:`Uplink.kick`, :meth:`Uplink.start` and
:meth:`Uplink.stop` run on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tierlink.errors import (
    ConfigError,
    OutboxError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from tierlink.outbox import Ack, AckStatus, Backoff, Deliverer, FullPolicy, Item, Outbox, wire
from tierlink.outbox.delivery import Sleep
from tierlink.outbox.observer import DROP_REASONS
from tierlink.outbox.store import DEFAULT_TTL_S

if TYPE_CHECKING:
    import httpx
    from prometheus_client import CollectorRegistry

    from tierlink.node.spec import NodeSpec

log = logging.getLogger("tierlink.node.uplink")

PARENT, CONTROL = "parent", "control"
DESTINATIONS = (PARENT, CONTROL)
INBOX_PATH = "/tierlink/v1/inbox"  # a node's receiving end (node/inbox_routes.py)
RESULTS_PATH = "/v1/results"  # the control plane's (control/results.py)
OUTBOX_FILE = "outbox.db"
DEFAULT_FULL_POLICY: Mapping[str, FullPolicy] = {
    "*": "refuse", "hard_example": "drop_oldest", "telemetry": "drop_oldest"}

UplinkStateName = Literal["up", "down"]


@dataclass(frozen=True, slots=True)
class UplinkConfig:
    """Bounds and timing of a node's outbox and its delivery (see the module doc)."""

    max_items: int = 100_000
    max_bytes: int = 256 * 2**20  # payload bytes
    full_policy: Mapping[str, FullPolicy] = field(
        default_factory=lambda: dict(DEFAULT_FULL_POLICY))
    ttl_s: float = DEFAULT_TTL_S
    batch: int = 32  # items per request
    # Retries of a dead parent: 0.2 s, 0.4 s, ... at most 5 s apart, so a link that comes
    # back is used again within about 5 s.
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=0.2, max_s=5.0))
    timeout_s: float = 10.0  # per request: a hung send holds its destination's line


@dataclass(frozen=True, slots=True)
class UplinkState:
    """Whether items for ``destination`` get through now (see the module doc)."""

    destination: str
    state: UplinkStateName
    since: float  # epoch s of the last change between a failed and a working attempt
    waiting: int  # items waiting for the destination
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"destination": self.destination, "state": self.state, "since": self.since,
                "waiting": self.waiting, "last_error": self.last_error}


@dataclass(slots=True)
class _Health:
    failing: bool
    since: float
    last_error: str | None = None


class UplinkMetrics:
    """The outbox's Prometheus series; also the outbox's observer (pass it to one Uplink).

    ``registry``: the node's (``NodeMetrics.registry``), so the series appear on its
    ``/metrics``; ``prometheus_client.REGISTRY`` for the process default; None: a registry
    of its own. Every series carries ``tier`` like :class:`~tierlink.telemetry.metrics.
    NodeMetrics`."""

    def __init__(self, tier: str, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.tier = tier
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.items = Gauge("tierlink_outbox_items", "Items waiting in the outbox",
                           ["tier", "destination"], registry=r)
        self.oldest = Gauge("tierlink_outbox_oldest_age_seconds",
                            "Age of the oldest item waiting in the outbox (0 when empty)",
                            ["tier"], registry=r)
        self.delivered = Counter("tierlink_outbox_delivered_total",
                                 "Outbox items acknowledged by their receiver (ok or duplicate)",
                                 ["tier", "destination", "kind"], registry=r)
        self.dropped = Counter(
            "tierlink_outbox_dropped_total",
            "Outbox items that left undelivered, or were never accepted: full (evicted by "
            "drop_oldest), expired (TTL), rejected (by the receiver), refused (put on a full "
            "outbox)", ["tier", "reason"], registry=r)
        self.retries = Counter("tierlink_outbox_retries_total",
                               "Failed delivery attempts (the head item waits for backoff)",
                               ["tier", "destination"], registry=r)
        self.down = Gauge("tierlink_uplink_down",
                          "1 while delivery to the destination fails and items wait",
                          ["tier", "destination"], registry=r)
        self.received = Counter("tierlink_inbox_items_total",
                                "Items received from downstream nodes, by ack: ok, duplicate, "
                                "rejected, retry", ["tier", "status"], registry=r)
        for reason in DROP_REASONS:  # present from the start: "0 dropped" is a reading
            self.dropped.labels(tier, reason)

    # -- OutboxObserver ----------------------------------------------------------------------

    def on_delivered(self, destination: str, kind: str, n: int) -> None:
        self.delivered.labels(self.tier, destination, kind).inc(n)

    def on_dropped(self, reason: str, n: int) -> None:
        self.dropped.labels(self.tier, reason).inc(n)

    def on_retry(self, destination: str) -> None:
        self.retries.labels(self.tier, destination).inc()

    def on_received(self, status: str, n: int = 1) -> None:
        """Acks a node's inbox answered downstream (node/inbox_routes.py)."""
        self.received.labels(self.tier, status).inc(n)

    def bind(self, uplink: Uplink) -> None:
        """Read the gauges from ``uplink`` at scrape time (they cannot drift)."""
        for destination in uplink.destinations:
            self.items.labels(self.tier, destination).set_function(
                _reading(partial(_waiting, uplink, destination)))
            self.down.labels(self.tier, destination).set_function(
                _reading(partial(_is_down, uplink, destination)))
        self.oldest.labels(self.tier).set_function(
            _reading(lambda: uplink.outbox.stats().oldest_age_s or 0.0))


def _waiting(uplink: Uplink, destination: str) -> float:
    return float(uplink.outbox.pending(destination))


def _is_down(uplink: Uplink, destination: str) -> float:
    return 1.0 if uplink.state(destination).state == "down" else 0.0


def _reading(read: Callable[[], float]) -> Callable[[], float]:
    """A gauge function that reads NaN instead of failing the scrape when the outbox cannot
    be read (a failing disk, or after :meth:`Uplink.stop` closed it)."""

    def value() -> float:
        try:
            return read()
        except OutboxError:
            return float("nan")

    return value


class Uplink:
    """See the module doc. Create, :meth:`start` on the event loop, :meth:`put`,
    :meth:`stop`. ``headers``: extra HTTP headers per destination (the node's
    ``Authorization`` for ``control``). ``clock`` is wall time (persisted timestamps);
    ``sleep``, ``rng`` and ``transport`` (an ``httpx`` transport) are for tests."""

    def __init__(self, node_id: str, state_dir: str | Path, *, parent_url: str | None = None,
                 control_url: str | None = None,
                 headers: Mapping[str, Mapping[str, str]] | None = None,
                 config: UplinkConfig | None = None, metrics: UplinkMetrics | None = None,
                 clock: Callable[[], float] = time.time, sleep: Sleep = asyncio.sleep,
                 rng: random.Random | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 fallback_urls: Sequence[str] = ()) -> None:
        self.node_id = node_id
        self.config = config or UplinkConfig()
        self._urls = _urls(parent_url, control_url)
        # The parent line's receivers: the first upstream, then the others in turn.
        self._parents = [self._urls[PARENT], *(u.rstrip("/") + INBOX_PATH
                                               for u in fallback_urls)] \
            if PARENT in self._urls else []
        # The control line's receivers: every control-plane replica, in turn.
        self._controls = [u.strip().rstrip("/") + RESULTS_PATH
                          for u in (control_url or "").split(",") if u.strip()]
        if not self._urls:
            raise ConfigError(f"node {node_id} has no upstream and no control plane: its "
                              "outbox could deliver nowhere",
                              hint="give the node an upstream or a control_url")
        self._headers = {d: dict(h) for d, h in (headers or {}).items()}
        self._clock = clock
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self.tls: ssl.SSLContext | None = None  # HTTPS destinations: the node's context
        self.metrics = metrics
        c = self.config
        self.outbox = Outbox(Path(state_dir) / OUTBOX_FILE, max_items=c.max_items,
                             max_bytes=c.max_bytes, full_policy=dict(c.full_policy),
                             clock=clock, default_ttl_s=c.ttl_s, observer=metrics)
        self._deliverer = Deliverer(self.outbox, self._send, clock=clock, sleep=sleep, rng=rng,
                                    backoff=c.backoff, batch=c.batch, observer=metrics)
        now = clock()
        self._health = {d: _Health(False, now) for d in self._urls}
        if metrics is not None:
            metrics.bind(self)

    @property
    def destinations(self) -> tuple[str, ...]:
        """The destinations this node can deliver to (``parent`` first)."""
        return tuple(d for d in DESTINATIONS if d in self._urls)

    @property
    def upstream(self) -> str:
        """Where this node's own items go: ``parent``, or ``control`` without an upstream."""
        return self.destinations[0]

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start delivering (on the running loop): whatever waits on disk goes first."""
        import httpx

        self._client = httpx.AsyncClient(trust_env=False, transport=self._transport,
                                         timeout=httpx.Timeout(self.config.timeout_s),
                                         verify=self.tls if self.tls is not None else True)
        self._resume_health()
        self._deliverer.start()

    async def stop(self) -> None:
        """Stop delivering and close the database. Nothing is flushed and nothing is lost:
        waiting items (and a batch in flight) stay on disk for the next start."""
        await self._deliverer.stop()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self.outbox.close()

    def kick(self, destination: str | None = None) -> None:
        """Wake ``destination``'s delivery loop (all when None); on the event loop."""
        self._deliverer.kick(destination)

    # ---- producers ---------------------------------------------------------------------------

    async def put(self, kind: str, key: str | None, payload: Any,
                  destination: str | None = None, *, ttl_s: float | None = None) -> Item:
        """Accept ``payload`` (a JSON value) for ``destination`` (default: :attr:`upstream`)
        and wake its loop. Durable when this returns; raises :class:`OutboxError` when the
        outbox refuses it (full, see the module doc) — then it was **not** accepted. A
        ``key`` that is still waiting is not stored again (an idempotent retry)."""
        item = await asyncio.to_thread(self.enqueue, kind, key, payload, destination,
                                       ttl_s=ttl_s)
        self.kick(item.destination)
        return item

    def enqueue(self, kind: str, key: str | None, payload: Any, destination: str | None = None,
                *, chain: Sequence[str] = (), created_at: float | None = None,
                ttl_s: float | None = None) -> Item:
        """:meth:`put` without the wake-up, from any thread (it fsyncs: not on the event
        loop). ``chain``/``created_at``: for items relayed from downstream nodes (the nodes
        they passed through, their origin's time); the caller kicks the loop afterwards."""
        destination = destination or self.upstream
        if destination not in self._urls:
            raise ConfigError(f"node {self.node_id} has no {destination!r} to deliver to "
                              f"(it has: {', '.join(self.destinations)})",
                              hint="put items for one of the node's destinations")
        body = wire.pack(payload, self._clock() if created_at is None else created_at, chain)
        return self.outbox.put(destination, kind, body, key, ttl_s=ttl_s)

    # ---- state -------------------------------------------------------------------------------

    def state(self, destination: str | None = None) -> UplinkState:
        """``down`` while the last attempt to ``destination`` (default :attr:`upstream`)
        failed and items wait for it; ``up`` otherwise."""
        destination = destination or self.upstream
        health = self._health.get(destination) or _Health(False, self._clock())
        waiting = self.outbox.pending(destination)
        down = health.failing and waiting > 0
        return UplinkState(destination, "down" if down else "up", health.since, waiting,
                           health.last_error if down else None)

    def is_down(self, destination: str | None = None) -> bool:
        """What :meth:`state` says, for every routed answer: reads the outbox only while the
        last attempt failed (a healthy uplink costs no query on the request path)."""
        health = self._health.get(destination or self.upstream)
        if health is None or not health.failing:
            return False
        return self.outbox.pending(destination or self.upstream) > 0

    @property
    def parent_url(self) -> str | None:
        """The inbox the parent line delivers to now (None without a parent)."""
        return self._urls.get(PARENT)

    def status(self) -> dict[str, Any]:
        """For ``/tierlink/v1/status``: the state per destination and what waits."""
        stats = self.outbox.stats()
        return {"state": {d: self.state(d).to_dict() for d in self.destinations},
                "parent_url": self.parent_url, "parents": list(self._parents),
                "outbox": {"items": stats.items, "bytes": stats.bytes,
                           "by_destination": {d: c.items for d, c in stats.by_destination.items()},
                           "by_kind": {k: c.items for k, c in stats.by_kind.items()},
                           "oldest_age_s": stats.oldest_age_s, "dropped": stats.dropped}}

    def _next_receiver(self, destination: str) -> None:
        """A failed parent (or control-plane replica) hands its line to the next one."""
        line = self._parents if destination == PARENT else self._controls
        if len(line) < 2:
            return
        failed = self._urls[destination]
        self._urls[destination] = line[(line.index(failed) + 1) % len(line)]
        log.info("%s: %s %s failed; the next attempt goes to %s", self.node_id, destination,
                 failed, self._urls[destination])

    def _resume_health(self) -> None:
        """After a restart, a head item that already failed means the outage goes on."""
        now = self._clock()
        for destination in self._urls:
            head = self.outbox.head(destination, now)
            if head is not None and head.attempts > 0:
                self._health[destination] = _Health(True, now, head.last_error)

    def _note(self, destination: str, ok: bool, error: str | None = None) -> None:
        health = self._health[destination]
        if health.failing == (not ok):
            health.last_error = error if not ok else None
            return
        self._health[destination] = _Health(not ok, self._clock(), error)

    # ---- sending -----------------------------------------------------------------------------

    async def _send(self, destination: str, items: Sequence[Item]) -> Sequence[Ack]:
        """The deliverer's sender: post the batch, note whether the line moved; a failed
        parent hands the line to the next one for the next attempt."""
        try:
            acks = await self._post(destination, items)
        except Exception as exc:  # every failure is transient to the deliverer
            self._note(destination, ok=False, error=f"{type(exc).__name__}: {exc}")
            self._next_receiver(destination)
            raise
        head = next((a for a in acks if a.key == items[0].key), None)
        if head is None or head.status is AckStatus.RETRY:
            self._note(destination, ok=False,
                       error=head.detail if head is not None else "no ack for the head item")
        else:
            self._note(destination, ok=True)
        return acks

    async def _post(self, destination: str, items: Sequence[Item]) -> list[Ack]:
        """One HTTP request. Any answer but 200 + acks is a transient failure (raised):
        a receiver that is older, newer or misconfigured is fixed by an operator, and its
        items wait (at most their TTL) rather than being dropped."""
        import httpx

        url = self._urls.get(destination)
        if url is None or self._client is None:
            raise OutboxError(f"{self.node_id} cannot send to {destination!r} "
                              f"({'not started' if url else 'no address for it'})")
        headers = {"content-type": "application/json", **self._headers.get(destination, {})}
        try:
            response = await self._client.post(url, content=wire.encode_batch(self.node_id, items,
                                                                         self._clock()),
                                               headers=headers)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"{destination} ({url}) did not answer in "
                                  f"{self.config.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"{destination} ({url}) unreachable: "
                                      f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise UpstreamError(f"{destination} ({url}) answered HTTP {response.status_code}: "
                                f"{response.text[:300]}")
        return wire.decode_acks(response.content, f"{destination} ({url})")


def _urls(parent_url: str | None, control_url: str | None) -> dict[str, str]:
    urls = {}
    if parent_url:
        urls[PARENT] = parent_url.rstrip("/") + INBOX_PATH
    if control_url:  # the first of the control plane's replicas
        urls[CONTROL] = control_url.split(",")[0].strip().rstrip("/") + RESULTS_PATH
    return urls


def uplink_for_spec(spec: NodeSpec, *, authorization: str | None = None,
                    config: UplinkConfig | None = None,
                    metrics: UplinkMetrics | None = None,
                    tls: ssl.SSLContext | None = None) -> Uplink | None:
    """The uplink of a node process: parent = the spec's first upstream, control = its
    ``control_url``, ``authorization`` (the node identity's header) sent to the control
    plane. None when the node keeps no ``state_dir`` (nowhere durable to queue) or has
    neither an upstream nor a control plane. The other upstreams are the parent's
    fallbacks."""
    if spec.state_dir is None or not (spec.upstreams or spec.control_url):
        return None
    headers = {CONTROL: {"authorization": authorization}} if authorization else {}
    uplink = Uplink(spec.node_id, spec.state_dir,
                  parent_url=spec.upstreams[0].url if spec.upstreams else None,
                  control_url=spec.control_url, headers=headers, config=config,
                  metrics=metrics, fallback_urls=[u.url for u in spec.upstreams[1:]])
    uplink.tls = tls  # the node's client context: the parent's inbox knows who delivers
    return uplink


__all__ = ["CONTROL", "DEFAULT_FULL_POLICY", "INBOX_PATH", "PARENT", "RESULTS_PATH", "Uplink",
           "UplinkConfig", "UplinkMetrics", "UplinkState", "uplink_for_spec"]
