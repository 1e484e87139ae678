"""One emulated network link: a user-space TCP proxy with delay, jitter, bandwidth and loss.

This kernel has no ``netem`` qdisc, so tierlink puts a :class:`Link` in front of every declared
link of a fleet: a node reaches its upstream by connecting to the link's listen port instead of
the upstream's own port, and every byte it sends or receives goes through the link model below.

The model, per direction (forward = client to target, reverse = target to client), per chunk of
up to :data:`CHUNK_BYTES` read from one side:

    departure = max(now, wire_free) + bytes * 8 / bandwidth     (wire_free = departure)
    arrival   = departure + max(0, delay + U(-jitter, +jitter)) [+ rto if the chunk is "lost"]
    delivery  = max(previous delivery in this direction of this connection, arrival)

* ``wire_free`` is one serialisation clock per direction *per link*, shared by all of the
  link's connections: they share its bandwidth like flows on one bottleneck.
* Delivery times never decrease within a connection, so jitter never reorders bytes (TCP would
  not either).
* A TCP proxy cannot drop bytes. A "lost" chunk is instead delivered after one extra
  retransmission timeout, ``rto = max(200 ms, 2 * RTT)`` with ``RTT = 2 * delay`` (200 ms is
  Linux's minimum RTO), and the chunks behind it wait for it (head-of-line blocking), which is
  what a real loss costs a TCP connection.
* Opening a connection costs one extra RTT, as TCP's handshake does: the first bytes reach the
  target no earlier than ``3 * delay`` after the connection was accepted.
* Backpressure: a pump reads its next chunk only when the previous one is about to leave the
  wire (:data:`READ_AHEAD_S` before), and at most :data:`QUEUE_CHUNKS` chunks are in flight per
  direction of a connection, so a fast sender is slowed by TCP flow control instead of filling
  the proxy's memory.
* Granularity: a chunk is delivered whole at its delivery time, so at 10 Mbit/s a 64 KiB read
  arrives as one 52 ms burst. Completion times of messages are exact; progress inside one
  chunk is not modelled. Loss is per chunk, so it depends on how the sender's writes coalesce.
* Timers: deliveries use :class:`DeliveryTimer`, which corrects for the event loop's wake-up
  lateness, so one-way delays are unbiased rather than ~0.5 ms long on a loaded machine.

Runtime changes (:meth:`Link.update`) apply to chunks read after the call; chunks already in
flight keep their delivery times. Cutting a link (``up=False``) resets its connections with a TCP
RST and resets every new connection at once until it is brought back up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
import struct
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Self

from tierlink.errors import LinkEmulationError

__all__ = [
    "CHUNK_BYTES",
    "QUEUE_CHUNKS",
    "RUNTIME_FIELDS",
    "ChunkTiming",
    "DeliveryTimer",
    "Link",
    "LinkCounters",
    "LinkSpec",
    "retransmission_timeout_s",
    "schedule_chunk",
]

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024  # largest chunk one read takes from a socket
QUEUE_CHUNKS = 64  # chunks in flight per direction of one connection (bounds memory)
MIN_RTO_S = 0.2  # Linux's minimum retransmission timeout
READ_AHEAD_S = 0.010  # a pump reads its next chunk this long before the wire is free
RUNTIME_FIELDS = frozenset({"delay_ms", "jitter_ms", "bandwidth_mbit", "loss", "up"})

_HINT = "check the link definitions in the fleet file"


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """One emulated link, validated on construction (errors name the field).

    ``delay_ms`` is the ONE-WAY delay, applied in each direction (RTT = 2 x delay).
    ``jitter_ms`` adds a uniform ±jitter to each chunk's delay without reordering bytes.
    ``bandwidth_mbit`` applies per direction and is shared by all connections of the link
    (``None`` = unlimited). ``loss`` is the probability per chunk of paying one retransmission
    timeout (see the module docstring). ``listen_port=0`` takes an ephemeral port.
    """

    name: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    target_host: str
    target_port: int
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    bandwidth_mbit: float | None = None
    loss: float = 0.0
    up: bool = True

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_text("listen_host", self.listen_host)
        _check_text("target_host", self.target_host)
        _check_port("listen_port", self.listen_port, allow_zero=True)
        _check_port("target_port", self.target_port, allow_zero=False)
        _check_number("delay_ms", self.delay_ms, low=0.0)
        _check_number("jitter_ms", self.jitter_ms, low=0.0)
        if self.bandwidth_mbit is not None:
            _check_number("bandwidth_mbit", self.bandwidth_mbit, low=0.0, low_open=True)
        _check_number("loss", self.loss, low=0.0, high=1.0)
        if not isinstance(self.up, bool):
            raise _invalid("up", self.up, "must be true or false")

    @property
    def rtt_ms(self) -> float:
        """The declared round-trip time without jitter: twice the one-way delay."""
        return 2.0 * self.delay_ms

    @classmethod
    def from_dict(cls, raw: Any, where: str = "link") -> LinkSpec:
        """Build a spec from a JSON-like mapping; unknown keys are errors, not ignored."""
        if not isinstance(raw, dict):
            raise LinkEmulationError(f"{where}: a link must be a mapping, got {raw!r}", hint=_HINT)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise LinkEmulationError(
                f"{where}: unknown field(s) {unknown}; known fields are {sorted(known)}",
                hint=_HINT)
        missing = sorted(k for k in ("name", "target_host", "target_port") if k not in raw)
        if missing:
            raise LinkEmulationError(f"{where}: missing field(s) {missing}", hint=_HINT)
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def updated(self, **changes: Any) -> LinkSpec:
        """A copy with runtime fields changed (``RUNTIME_FIELDS``); others are errors."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise LinkEmulationError(
                f"link {self.name!r}: unknown field(s) {unknown}; "
                f"the runtime fields are {sorted(RUNTIME_FIELDS)}", hint=_HINT)
        fixed = sorted(set(changes) - RUNTIME_FIELDS)
        if fixed:
            raise LinkEmulationError(
                f"link {self.name!r}: field(s) {fixed} cannot change at runtime; "
                f"only {sorted(RUNTIME_FIELDS)} can", hint="restart the link emulator instead")
        return replace(self, **changes)


def _invalid(field_name: str, value: Any, why: str) -> LinkEmulationError:
    return LinkEmulationError(f"link field {field_name!r} = {value!r} {why}", hint=_HINT,
                              field=field_name)


def _check_name(name: Any) -> None:
    _check_text("name", name)
    if "/" in name or any(c.isspace() for c in name):
        raise _invalid("name", name, "must not contain '/' or whitespace")


def _check_text(field_name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise _invalid(field_name, value, "must be a non-empty string")


def _check_port(field_name: str, value: Any, *, allow_zero: bool) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 65535:
        raise _invalid(field_name, value, f"must be an integer port in [{low}, 65535]")


def _check_number(field_name: str, value: Any, *, low: float, high: float | None = None,
                  low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _invalid(field_name, value, "must be a finite number")
    if value < low or (low_open and value == low):
        raise _invalid(field_name, value, f"must be {'>' if low_open else '>='} {low:g}")
    if high is not None and value >= high:
        raise _invalid(field_name, value, f"must be < {high:g}")


# --- the pure model ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkTiming:
    """When one chunk leaves the wire and when it is handed to the receiver (loop seconds)."""

    departure: float
    delivery: float
    lost: bool


def retransmission_timeout_s(spec: LinkSpec) -> float:
    """The extra delay a "lost" chunk pays: max(200 ms, 2 x RTT)."""
    return max(MIN_RTO_S, 2.0 * spec.rtt_ms / 1000.0)


def schedule_chunk(spec: LinkSpec, nbytes: int, now: float, wire_free: float,
                   previous_delivery: float, rng: random.Random) -> ChunkTiming:
    """Schedule one chunk of ``nbytes`` read at ``now`` (pure; see the module docstring).

    Draws exactly two numbers from ``rng`` per chunk (jitter, then loss) whatever the
    parameters, so a seeded run replays the same draws after a runtime update.
    The caller stores ``departure`` as the direction's new ``wire_free`` and ``delivery`` as the
    connection's new ``previous_delivery``.
    """
    jitter_draw, loss_draw = rng.random(), rng.random()
    departure = now
    if spec.bandwidth_mbit is not None:
        departure = max(now, wire_free) + nbytes * 8 / (spec.bandwidth_mbit * 1e6)
    one_way_ms = max(0.0, spec.delay_ms + (2.0 * jitter_draw - 1.0) * spec.jitter_ms)
    lost = loss_draw < spec.loss
    arrival = departure + one_way_ms / 1000.0
    if lost:
        arrival += retransmission_timeout_s(spec)
    return ChunkTiming(departure=departure, delivery=max(previous_delivery, arrival), lost=lost)


# --- the live link -------------------------------------------------------------------------

FORWARD, REVERSE = "forward", "reverse"


class DeliveryTimer:
    """Sleeps until a loop time, aiming early by an estimate of how late wake-ups are.

    A timer wakes a loaded machine's event loop some 0.3-1 ms late (epoll's millisecond
    timeouts, scheduling), which would add that much to every emulated one-way delay. This
    timer tracks the median lateness with a sign-step estimator (each wake-up moves the aim by
    ``STEP_S`` toward being on time), so delivery times are unbiased: as many chunks arrive a
    little early as a little late.
    """

    STEP_S = 0.00002
    MAX_EARLY_S = 0.002

    def __init__(self, early_s: float = 0.0005) -> None:
        self.early_s = early_s

    async def sleep_until(self, when: float) -> None:
        loop = asyncio.get_running_loop()
        wait = when - loop.time() - self.early_s
        if wait <= 0:
            return  # due already (or within the aim): deliver now, learn nothing
        await asyncio.sleep(wait)
        step = self.STEP_S if loop.time() > when else -self.STEP_S
        self.early_s = min(self.MAX_EARLY_S, max(0.0, self.early_s + step))


@dataclass(slots=True)
class LinkCounters:
    """What one link has carried since it started (bytes are counted when delivered)."""

    bytes_forward: int = 0  # client -> target
    bytes_reverse: int = 0  # target -> client
    chunks_forward: int = 0
    chunks_reverse: int = 0
    chunks_lost: int = 0  # chunks that paid a retransmission timeout
    connections: int = 0  # connections accepted and connected to the target
    active: int = 0  # connections open now
    refused: int = 0  # connections reset at once because the link was down
    connect_errors: int = 0  # connections reset because the target could not be reached
    resets: int = 0  # open connections reset by cutting the link

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Link:
    """An asyncio TCP proxy applying :class:`LinkSpec`'s model in both directions.

    Lifecycle: ``await link.start()`` (binds ``listen_port``), ``link.update(...)`` at any time
    from the loop's thread, ``await link.stop()`` (closes every socket and task). Also an async
    context manager. ``rng`` drives jitter and loss (seed it for reproducible runs).
    """

    def __init__(self, spec: LinkSpec, *, rng: random.Random | None = None,
                 connect_timeout_s: float = 5.0) -> None:
        self._spec = spec
        self._rng = rng if rng is not None else random.Random()
        self._connect_timeout_s = connect_timeout_s
        self._wire_free = {FORWARD: 0.0, REVERSE: 0.0}
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.counters = LinkCounters()
        self.timer = DeliveryTimer()

    @property
    def spec(self) -> LinkSpec:
        return self._spec

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def listen_port(self) -> int:
        """The port actually listened on (differs from ``spec.listen_port`` when that is 0)."""
        if self._server is None or not self._server.sockets:
            raise LinkEmulationError(f"link {self.name!r} is not started", hint="await start()")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        if self._server is not None:
            return
        try:
            self._server = await asyncio.start_server(
                self._handle, self._spec.listen_host, self._spec.listen_port)
        except OSError as exc:
            raise LinkEmulationError(
                f"link {self.name!r} cannot listen on "
                f"{self._spec.listen_host}:{self._spec.listen_port}: {exc}",
                hint="choose a free listen_port, or 0 for an ephemeral one") from exc
        log.info("link %s listening on %s:%d -> %s:%d", self.name, self._spec.listen_host,
                 self.listen_port, self._spec.target_host, self._spec.target_port)

    async def stop(self) -> None:
        """Stop listening, reset every connection and wait for every task to end."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self._connections):
            connection.abort()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def update(self, **changes: Any) -> LinkSpec:
        """Change runtime fields; new chunks use them at once. ``up=False`` resets connections."""
        new = self._spec.updated(**changes)
        self._spec = new
        if not new.up:
            self._cut()
        log.info("link %s updated: %s", self.name, changes)
        return new

    def snapshot(self) -> dict[str, Any]:
        """The spec (with the actual listen port once started) and the counters, for the API."""
        body = self._spec.to_dict()
        if self._server is not None:
            body["listen_port"] = self.listen_port
        body["counters"] = self.counters.as_dict()
        return body

    def _cut(self) -> None:
        for connection in list(self._connections):
            self.counters.resets += 1
            connection.abort()

    def schedule(self, direction: str, nbytes: int, previous_delivery: float) -> ChunkTiming:
        """Schedule a chunk on this link's wire clock for ``direction`` (called by the pumps)."""
        now = asyncio.get_running_loop().time()
        timing = schedule_chunk(self._spec, nbytes, now, self._wire_free[direction],
                                previous_delivery, self._rng)
        self._wire_free[direction] = timing.departure
        if timing.lost:
            self.counters.chunks_lost += 1
        return timing

    def delivered(self, direction: str, nbytes: int) -> None:
        if direction == FORWARD:
            self.counters.bytes_forward += nbytes
            self.counters.chunks_forward += 1
        else:
            self.counters.bytes_reverse += nbytes
            self.counters.chunks_reverse += 1

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # always true: asyncio runs each handler in its own task
            self._handlers.add(task)
        try:
            await self._serve_client(reader, writer)
        except asyncio.CancelledError:
            # Only stop() cancels a handler, and waits for it. Ending normally keeps asyncio's
            # server callback (which calls task.exception()) from logging a spurious error.
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _serve_client(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        if not self._spec.up:
            self.counters.refused += 1
            _reset(writer)
            return
        accepted_at = asyncio.get_running_loop().time()
        upstream = await self._connect_upstream()
        if upstream is None:
            self.counters.connect_errors += 1
            _reset(writer)
            return
        if not self._spec.up:  # cut while we were connecting
            self.counters.refused += 1
            _reset(upstream[1])
            _reset(writer)
            return
        connection = _Connection(self, (reader, writer), upstream, accepted_at)
        self._connections.add(connection)
        self.counters.connections += 1
        self.counters.active += 1
        try:
            await connection.run()
        finally:
            self.counters.active -= 1
            self._connections.discard(connection)

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        spec = self._spec
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(spec.target_host, spec.target_port),
                self._connect_timeout_s)
        except (TimeoutError, OSError) as exc:
            log.warning("link %s: cannot reach target %s:%d (%s); resetting the client",
                        self.name, spec.target_host, spec.target_port, exc or "timeout")
            return None


_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Connection:
    """One proxied connection: four tasks (read and write, each direction)."""

    def __init__(self, link: Link, client: _Stream, upstream: _Stream, accepted_at: float) -> None:
        self._link = link
        self._client = client
        self._upstream = upstream
        # TCP's handshake: the client could send its first bytes only one RTT after connecting.
        handshake_floor = accepted_at + 3.0 * link.spec.delay_ms / 1000.0
        self._forward = _Pipe(link, FORWARD, client[0], upstream[1], handshake_floor)
        self._reverse = _Pipe(link, REVERSE, upstream[0], client[1], 0.0)
        self._tasks: list[asyncio.Task[None]] = []
        self._aborted = False

    async def run(self) -> None:
        self._tasks = [asyncio.create_task(coro) for coro in (
            self._forward.read_loop(), self._forward.write_loop(),
            self._reverse.read_loop(), self._reverse.write_loop())]
        try:
            await asyncio.gather(*self._tasks)
        except OSError as exc:  # a reset or broken pipe on either side ends both
            log.debug("link %s: connection ended by %r", self._link.name, exc)
            self.abort()
        except asyncio.CancelledError:
            if not self._aborted or _cancelling():
                raise  # we are being cancelled (shutdown), not merely aborted by a cut
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._client[1].close()
            self._upstream[1].close()

    def abort(self) -> None:
        """Reset both sides with a TCP RST and stop the pumps (synchronous: safe from update)."""
        self._aborted = True
        _reset(self._client[1])
        _reset(self._upstream[1])
        for task in self._tasks:
            task.cancel()


class _Pipe:
    """One direction of a connection: a reader scheduling chunks, a writer delivering them."""

    def __init__(self, link: Link, direction: str, source: asyncio.StreamReader,
                 sink: asyncio.StreamWriter, first_delivery: float) -> None:
        self._link = link
        self._direction = direction
        self._source = source
        self._sink = sink
        self._last_delivery = first_delivery
        self._queue: asyncio.Queue[tuple[bytes, float] | None] = asyncio.Queue(QUEUE_CHUNKS)

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await self._source.read(CHUNK_BYTES)
            if not data:
                await self._queue.put(None)
                return
            timing = self._link.schedule(self._direction, len(data), self._last_delivery)
            self._last_delivery = timing.delivery
            await self._queue.put((data, timing.delivery))
            # Read the next chunk only when this one has (nearly) left the wire: the sender's
            # surplus waits in the kernel's socket buffers, i.e. TCP flow control slows it
            # down. Waking a little early keeps the wire busy although timers fire late.
            wait = timing.departure - loop.time() - READ_AHEAD_S
            if wait > 0:
                await asyncio.sleep(wait)

    async def write_loop(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                if self._sink.can_write_eof():
                    self._sink.write_eof()  # half-close, as the sender did
                return
            data, delivery = item
            await self._link.timer.sleep_until(delivery)
            self._sink.write(data)
            await self._sink.drain()
            self._link.delivered(self._direction, len(data))


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST (SO_LINGER 0) instead of a graceful FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed: nothing left to reset
    writer.transport.abort()
