"""What a node uses to talk to the control plane: a client, a cached view, a heartbeat loop.

- :class:`ControlClient`: async HTTP calls (the registry, the hard-example store that
  nodes post to and ``tierlink hard-examples`` reads, and the model repository a node
  installs versions from); every failure (refused connection, timeout, error status,
  unreadable answer) becomes one :class:`~tierlink.errors.ControlPlaneError` naming the URL
  -- except the repository's "no such version" (404) and "rejected" (422) answers, which
  keep their own classes (:class:`~tierlink.errors.RepositoryError`,
  :class:`~tierlink.errors.ArtifactRejected`): retrying cannot help those.
- :class:`RegistryCache`: the last cluster view fetched successfully. The control plane is
  not on the request path, so a failed refresh keeps the old view (and counts the failure);
  readers judge it by :meth:`RegistryCache.stale_s`.
- :class:`HeartbeatLoop`: heartbeats and refreshes the cache every interval, and hands
  each answer (what the control plane wants of the node) to ``on_answer``; it never dies
  on an error and logs once per outage, not once per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self

import httpx

from tierlink.core.types import (
    CascadePoint,
    LanguageModelView,
    LinkView,
    ModelView,
    NodeView,
    SplitPoint,
    Tier,
)
from tierlink.errors import ControlPlaneError, InvalidRequest, TierlinkError
from tierlink.security.names import CONTROL_HOST

if TYPE_CHECKING:
    from tierlink.repo.manifest import SignedManifest

log = logging.getLogger(__name__)

FAILBACK_S = 30.0  # how often a node moved off its own replica tries it again

Clock = Callable[[], float]
AnswerHook = Callable[[dict[str, Any]], Awaitable[None]]


class ControlClient:
    """Async client of the control plane's ``/v1/nodes`` API at ``base_url``.

    ``base_url`` may list several replicas, comma-separated (a control plane over etcd): a
    call that cannot reach one (refused, reset, timed out) is sent to the next, which is
    then asked first; every call the replicas answer is idempotent or refused as a repeat.
    ``home`` (a node's id) spreads nodes over the replicas: each starts at the replica its
    id hashes to, and, moved away by a failure, tries its own again every ``FAILBACK_S`` —
    so a replica that restarts gets its nodes back instead of one replica keeping them all.

    ``timeout_s`` bounds each call as a whole (connect, send, answer). Proxy variables in
    the environment are ignored: fleet traffic stays on the fleet's own network.
    ``transport`` lets tests plug in ``httpx.MockTransport`` or ``httpx.ASGITransport``.
    Artifact downloads (:meth:`download_version`) use a second client whose every read may
    take ``download_timeout_s`` (a model file is not a heartbeat); with ``partial_dir`` they
    resume where a cut link or a killed process left them (range requests).
    """

    def __init__(self, base_url: str, timeout_s: float = 1.0, *,
                 transport: httpx.AsyncBaseTransport | None = None,
                 authorization: str | None = None, download_timeout_s: float = 30.0,
                 tls: ssl.SSLContext | None = None, home: str = "",
                 clock: Clock = time.monotonic, partial_dir: Path | None = None) -> None:
        self.replicas = tuple(u.strip().rstrip("/") for u in base_url.split(",") if u.strip())
        if not self.replicas:
            raise ControlPlaneError("no control plane URL given",
                                    hint="pass --control http://HOST:PORT[,http://HOST:PORT]")
        self.home = self.replicas[zlib.crc32(home.encode()) % len(self.replicas)] if home \
            else self.replicas[0]
        self.base_url = self.home
        self._clock, self._left_home_at = clock, 0.0
        self.timeout_s = timeout_s
        self.download_timeout_s = download_timeout_s
        self.partial_dir = partial_dir
        self._transport = transport
        # HTTPS replicas are verified against the fleet CA (the node's client context), and
        # must prove they are the control plane: its identity name, not just the address
        self._verify: ssl.SSLContext | bool = tls if tls is not None else True
        self._hooks = {"request": [_expect_control]} if tls is not None else {}
        self._http = httpx.AsyncClient(timeout=timeout_s, transport=transport, trust_env=False,
                                       verify=self._verify, event_hooks=self._hooks)
        self._downloads: httpx.AsyncClient | None = None  # made at the first download
        self.failovers = 0  # calls moved to another replica
        if authorization:
            self.authorize(authorization)

    def authorize(self, authorization: str) -> None:
        """Send ``Authorization: <authorization>`` from now on (see control/identity.py)."""
        self._http.headers["authorization"] = authorization
        if self._downloads is not None:
            self._downloads.headers["authorization"] = authorization

    async def enroll(self, token: str, node_id: str, tier: str) -> str:
        """Enroll this node with an operator's token; returns its secret (keep it safe)."""
        response = await self._call("POST", "/v1/enroll", "an enrollment",
                                    json={"token": token, "node_id": node_id, "tier": tier})
        secret = _json_object(response, self._url("/v1/enroll")).get("secret")
        if not isinstance(secret, str) or not secret:
            raise ControlPlaneError(f"control plane at {self.base_url} enrolled {node_id} "
                                    "without a secret", hint="is it a tierlink control plane?")
        return secret

    async def certificate(self, csr: bytes) -> dict[str, Any]:
        """A certificate for this (enrolled) node over ``csr``: ``{certificate, ca, serial,
        not_after}`` (see control/certificates.py)."""
        response = await self._call("POST", "/v1/certificate", "a certificate",
                                    json={"csr": csr.decode()})
        answer = _json_object(response, self._url("/v1/certificate"))
        if not isinstance(answer.get("certificate"), str):
            raise ControlPlaneError(f"control plane at {self.base_url} issued no certificate",
                                    hint="does it run with --tls-ca holding the CA's key?")
        return answer

    async def heartbeat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Send one heartbeat (a :class:`~tierlink.control.schemas.Heartbeat` as a dict);
        returns the control plane's answer (generation, and what it wants of the node)."""
        node_id = body.get("node_id")
        if not isinstance(node_id, str) or not node_id:
            raise InvalidRequest("heartbeat body has no 'node_id'",
                                 hint="build the body with the node's stable id")
        response = await self._call("POST", f"/v1/nodes/{node_id}/heartbeat", "a heartbeat",
                                    json=body)
        return _json_object(response, self._url(f"/v1/nodes/{node_id}/heartbeat"))

    async def nodes(self, *, digests: bool = False) -> list[dict[str, Any]]:
        """The alive nodes, as ``NodeRecord`` dicts sorted by node id. ``digests``: each
        model's ``splits`` comes as ``splits_digest`` (:meth:`split_profile` has it), from
        a control plane that knows the option (an older one sends ``splits`` as before)."""
        response = await self._call("GET", "/v1/nodes", "the node list",
                                    params={"splits": "digest"} if digests else None)
        payload = _json(response, self._url("/v1/nodes"))
        nodes = payload.get("nodes") if isinstance(payload, dict) else None
        if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
            raise ControlPlaneError(
                f"control plane at {self._url('/v1/nodes')} answered without a 'nodes' list",
                hint="is the URL a tierlink control plane of a compatible version?",
            )
        return nodes

    async def nodes_since(self, since: str | None, wait_s: float = 0.0
                          ) -> tuple[list[dict[str, Any]] | None, str | None]:
        """Watch the view (split profiles by digest): ``(nodes, revision)`` once it has
        moved past ``since`` (None: now), ``(None, revision)`` when it is still there after
        ``wait_s`` seconds. A control plane that predates watches answers the full view at
        once, without a revision."""
        params: dict[str, str | float] = {"splits": "digest"}
        if since is not None:
            params.update(since=since, wait=wait_s)
        response = await self._call("GET", "/v1/nodes", "the node list", params=params,
                                    timeout_s=self.timeout_s + wait_s)
        payload = _json_object(response, self._url("/v1/nodes"))
        revision = payload.get("revision")
        revision = revision if isinstance(revision, str) else None
        if payload.get("unchanged") is True:
            return None, revision
        nodes = payload.get("nodes")
        if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
            raise ControlPlaneError(
                f"control plane at {self._url('/v1/nodes')} answered without a 'nodes' list",
                hint="is the URL a tierlink control plane of a compatible version?")
        return nodes, revision

    async def split_profile(self, digest: str) -> list[dict[str, Any]]:
        """The split profile (a model's ``splits`` list) with this digest."""
        path = f"/v1/splits/{digest}"
        payload = _json_object(await self._call("GET", path, "a split profile"), self._url(path))
        splits = payload.get("splits")
        if not isinstance(splits, list) or not all(isinstance(p, dict) for p in splits):
            raise ControlPlaneError(f"control plane at {self._url(path)} answered without a "
                                    "'splits' list", hint="is it a tierlink control plane?")
        return splits

    async def deregister(self, node_id: str) -> bool:
        """Remove this node from the registry; False if it was not registered (fine)."""
        response = await self._call("DELETE", f"/v1/nodes/{node_id}", "a deregistration",
                                    allow={404})
        return response.status_code != 404

    async def post_hard_examples(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Send a batch of hard examples (``HardExampleIn`` dicts); returns the store's
        answer ``{"stored", "duplicates", "evicted"}``."""
        response = await self._call("POST", "/v1/hard-examples", "a hard-example batch",
                                    json={"examples": list(examples)})
        return _json_object(response, self._url("/v1/hard-examples"))

    async def hard_examples(self, *, model: str | None = None, node: str | None = None,
                            after_id: int = 0, limit: int = 100) -> dict[str, Any]:
        """One page of stored hard examples' metadata (no tensors), oldest first:
        ``{"examples": [HardExampleRecord dicts], "next_after_id": int | None}``."""
        params = _query(model=model, node=node, after_id=after_id, limit=limit)
        response = await self._call("GET", "/v1/hard-examples", "the hard-example list",
                                    params=params)
        return _json_object(response, self._url("/v1/hard-examples"))

    async def export_hard_examples(self, *, model: str | None = None,
                                   node: str | None = None) -> bytes:
        """The stored hard examples as an ``.npz`` file's bytes (see the control app)."""
        response = await self._call("GET", "/v1/hard-examples/export", "a hard-example export",
                                    params=_query(model=model, node=node))
        return response.content

    async def version_manifest(self, name: str, version: str) -> SignedManifest:
        """The signed manifest of a published version (``GET /v1/models/{name}/versions/
        {version}``). :class:`~tierlink.errors.RepositoryError` when the repository has no
        such version, :class:`~tierlink.errors.ArtifactRejected` when its entry is
        malformed, :class:`ControlPlaneError` when the control plane cannot be asked."""
        from tierlink.repo.manifest import SignedManifest

        path = f"/v1/models/{name}/versions/{version}"
        response = await self._call("GET", path, f"{name} version {version}",
                                    allow={404, 422})
        if response.status_code in (404, 422):
            raise _repository_error(response, self._url(path), f"{name} version {version}")
        return SignedManifest.from_dict(_json_object(response, self._url(path)).get("signed"))

    async def download_version(self, signed: SignedManifest, dest_dir: Path) -> None:
        """Download the version's ``model.onnx`` and ``card.json`` into ``dest_dir``, each
        checked against the manifest's size and sha256 as it arrives, resumed from
        ``partial_dir`` when given (see :func:`tierlink.repo.client.fetch_artifact`); the
        signature is the caller's to check."""
        from tierlink.repo.client import fetch_artifact

        await fetch_artifact(self.base_url, signed, dest_dir, self._download_client(),
                             self.partial_dir)

    def _download_client(self) -> httpx.AsyncClient:
        if self._downloads is None:
            self._downloads = httpx.AsyncClient(
                timeout=self.download_timeout_s,
                transport=self._transport, trust_env=False, headers=self._http.headers,
                verify=self._verify, event_hooks=self._hooks)
        return self._downloads

    async def close(self) -> None:
        await self._http.aclose()
        if self._downloads is not None:
            await self._downloads.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def _url(self, path: str) -> str:
        return self.base_url + path

    async def _call(self, method: str, path: str, what: str, *,
                    json: Mapping[str, Any] | None = None,
                    params: Mapping[str, str | int | float] | None = None,
                    allow: frozenset[int] | set[int] = frozenset(),
                    timeout_s: float | None = None) -> httpx.Response:
        """One request, with every httpx failure and error status mapped here, once; a
        replica that cannot be reached hands the call to the next."""
        if self.base_url != self.home and self._clock() - self._left_home_at >= FAILBACK_S:
            self.base_url, self._left_home_at = self.home, self._clock()  # back, if it is
        for attempt in range(len(self.replicas)):
            url = self._url(path)
            try:
                response = await self._http.request(
                    method, url, json=json, params=params,
                    timeout=self.timeout_s if timeout_s is None else timeout_s)
            except httpx.HTTPError as exc:
                if attempt + 1 < len(self.replicas):
                    self._next_replica(url, exc)
                    continue
                raise _unreachable(exc, url, what, self.timeout_s) from exc
            if response.status_code >= 400 and response.status_code not in allow:
                raise _refused(response, url, what)
            return response
        raise AssertionError("unreachable")  # the loop returns or raises

    def _next_replica(self, url: str, exc: Exception) -> None:
        if self.base_url == self.home:
            self._left_home_at = self._clock()
        i = self.replicas.index(self.base_url)
        self.base_url = self.replicas[(i + 1) % len(self.replicas)]
        self.failovers += 1
        log.warning("control plane replica at %s failed (%s); using %s", url,
                    type(exc).__name__, self.base_url)


async def _expect_control(request: httpx.Request) -> None:
    """TLS checks the server's certificate for the control plane's identity name
    (``security/names.py``): a certificate the fleet CA issued to a node is refused."""
    request.extensions["sni_hostname"] = CONTROL_HOST


def _unreachable(exc: httpx.HTTPError, url: str, what: str,
                 timeout_s: float) -> ControlPlaneError:
    if isinstance(exc, httpx.TimeoutException):
        return ControlPlaneError(
            f"control plane at {url} did not answer {what} within {timeout_s:g} s")
    return ControlPlaneError(f"cannot reach the control plane at {url} for {what}: "
                             f"{type(exc).__name__}: {exc or 'no detail'}")


def _refused(response: httpx.Response, url: str, what: str) -> ControlPlaneError:
    """The control plane answered with an error status: keep its message and hint."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    detail = body.get("error") or response.text[:200] or response.reason_phrase
    hint = body.get("hint") if isinstance(body.get("hint"), str) else None
    return ControlPlaneError(
        f"control plane at {url} refused {what}: HTTP {response.status_code}: {detail}",
        hint=hint, status=response.status_code, code=body.get("code", ""),
    )


def _repository_error(response: httpx.Response, url: str, what: str) -> TierlinkError:
    """A 404 / 422 of the repository as its own error class (see the module docstring)."""
    from tierlink.repo.client import error_of

    return error_of(response, url, what)


def _query(**values: str | int | None) -> dict[str, str | int]:
    return {k: v for k, v in values.items() if v is not None}


def _json_object(response: httpx.Response, url: str) -> dict[str, Any]:
    payload = _json(response, url)
    if not isinstance(payload, dict):
        raise ControlPlaneError(f"control plane at {url} answered with a JSON "
                                f"{type(payload).__name__}, not an object",
                                hint="is the URL a tierlink control plane of a compatible version?")
    return payload


def _json(response: httpx.Response, url: str) -> Any:
    import orjson  # 3-4x the stdlib's speed on the registry view every node reads each second

    try:
        return orjson.loads(response.content)
    except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
        raise ControlPlaneError(f"control plane at {url} answered with invalid JSON: {exc}",
                                hint="is the URL a tierlink control plane?") from exc


class NodeSource(Protocol):
    """Where a :class:`RegistryCache` fetches from (a :class:`ControlClient`, or a fake).
    ``split_profile`` is only called for records that carry a ``splits_digest``."""

    async def nodes(self, *, digests: bool = False) -> list[dict[str, Any]]: ...

    async def split_profile(self, digest: str) -> list[dict[str, Any]]: ...


class RegistryCache:
    """The last successfully fetched cluster view, kept through control plane outages.

    ``nodes`` is the list of ``NodeRecord`` dicts (treat as read-only; it is replaced, not
    mutated, on refresh). ``revision`` grows on each successful refresh, so a reader can
    rebuild derived state (a ``ClusterView``) only when it changed.

    Split profiles (most of a record's bytes, and rarely changed) are fetched by digest,
    once each, and kept parsed: a model entry then holds ``split_points`` (a tuple of
    :class:`SplitPoint`) instead of ``splits``. A refresh whose profiles cannot all be
    fetched fails as a whole (the previous view stays).
    """

    def __init__(self, source: NodeSource, clock: Clock = time.time) -> None:
        self.source = source
        self.clock = clock
        self.nodes: list[dict[str, Any]] = []
        self.fetched_at: float | None = None
        self.revision = 0
        self.failures = 0  # failed refreshes, ever
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.view_revision: str | None = None  # the control plane's, for watching
        self._profiles: dict[str, tuple[SplitPoint, ...]] = {}  # digest -> parsed profile

    async def refresh(self, wait_s: float = 0.0) -> bool:
        """Fetch the view; on failure keep the previous one and count. True on success.
        A source that can watch (:meth:`ControlClient.nodes_since`) is asked for changes
        since the view this cache holds, waiting up to ``wait_s`` for one; an unchanged
        answer keeps the view and counts as fresh."""
        watching = hasattr(self.source, "nodes_since")
        try:
            if watching:
                nodes, view_revision = await self.source.nodes_since(  # type: ignore[attr-defined]
                    self.view_revision, wait_s)
            else:
                nodes, view_revision = await self.source.nodes(digests=True), None
            if nodes is not None:
                await self._resolve_profiles(nodes)
        except ControlPlaneError as exc:
            self.failures += 1
            self.consecutive_failures += 1
            self.last_error = str(exc)
            return False
        if nodes is not None:
            self.nodes = nodes
            self.revision += 1
        self.view_revision = view_revision
        self.fetched_at = self.clock()
        self.consecutive_failures = 0
        return True

    async def watch(self, min_interval_s: float = 1.0, wait_s: float = 10.0) -> None:
        """Keep the view current until cancelled: each answer comes as soon as the view
        changes (at most one fetch per ``min_interval_s`` while it keeps changing), or
        after ``wait_s`` of quiet; a failure is retried every ``min_interval_s``."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.refresh(wait_s=wait_s)
            await asyncio.sleep(max(0.0, min_interval_s - (loop.time() - started)))

    async def _resolve_profiles(self, nodes: list[dict[str, Any]]) -> None:
        """Put each model's parsed profile in place of its digest (fetching the new ones);
        profiles no record names any more are forgotten."""
        kept: dict[str, tuple[SplitPoint, ...]] = {}
        for node in nodes:
            for model in node.get("models") or ():
                digest = model.get("splits_digest") if isinstance(model, dict) else None
                if not isinstance(digest, str):
                    continue
                if digest not in kept:
                    known = self._profiles.get(digest)
                    kept[digest] = known if known is not None else _parse_profile(
                        await self.source.split_profile(digest), digest)
                model["split_points"] = kept[digest]
        self._profiles = kept

    def stale_s(self, now: float) -> float:
        """Seconds since the last successful fetch; ``inf`` before the first one."""
        return math.inf if self.fetched_at is None else max(0.0, now - self.fetched_at)

    def addresses(self) -> dict[str, str]:
        """``node_id -> address`` (base URL of the node's OIP endpoint)."""
        return {str(n["node_id"]): str(n["address"]) for n in self.nodes}

    def views(self, now: float) -> tuple[list[NodeView], list[LinkView]]:
        """The cached view as core types, for ``ClusterView.build``. Each node's ``age_s``
        is its age at the fetch plus the cache's own staleness."""
        stale = self.stale_s(now)
        return node_views(self.nodes, extra_age_s=0.0 if math.isinf(stale) else stale)


def node_views(records: list[dict[str, Any]], extra_age_s: float = 0.0
               ) -> tuple[list[NodeView], list[LinkView]]:
    """Convert ``NodeRecord`` dicts (as served by ``GET /v1/nodes``) to core views.

    A node lists one entry per version it serves; a model's standby entry (``"role":
    "standby"``, a canary) is folded into the active entry of the same name, so a policy
    sees one model per name, with every version it serves in ``ModelView.versions``."""
    nodes: list[NodeView] = []
    links: list[LinkView] = []
    for rec in records:
        models = fold_versions(rec.get("models", ()))
        nodes.append(NodeView(
            node_id=rec["node_id"], tier=Tier.parse(rec["tier"]), models=models,
            queue_depth=int(rec.get("queue_depth", 0)), inflight=int(rec.get("inflight", 0)),
            workers=int(rec.get("workers", 1)),
            age_s=float(rec.get("age_s", 0.0)) + extra_age_s,
            language_models=tuple(LanguageModelView.from_dict(lm)
                                  for lm in rec.get("language_models", ())),
        ))
        links.extend(
            LinkView(src=rec["node_id"], dst=link["dst"], rtt_ms=float(link["rtt_ms"]),
                     bandwidth_mbit=float(link["bandwidth_mbit"]),
                     loss=float(link.get("loss", 0.0)))
            for link in rec.get("links", ())
        )
    return nodes, links


def fold_versions(entries: Sequence[Mapping[str, Any]]) -> tuple[ModelView, ...]:
    """One :class:`ModelView` per model name, in the order names first appear: the figures
    of its active entry (the first one without ``"role": "standby"``; a standby entry when
    there is none), ``versions`` = the active version, then the standby ones."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(str(entry["name"]), []).append(entry)
    views = []
    for group in groups.values():
        active = [e for e in group if e.get("role", "active") != "standby"]
        ordered = active[:1] + [e for e in group if e.get("role") == "standby"]
        first = _model_view(ordered[0] if ordered else group[0])
        versions = tuple(dict.fromkeys(str(e["version"]) for e in ordered))
        views.append(first if versions in ((), (first.version,))
                     else replace(first, versions=versions))
    return tuple(views)


def _model_view(model: Mapping[str, Any]) -> ModelView:
    cascade = tuple(
        CascadePoint(float(p["threshold"]), float(p["answered_share"]),
                     float(p["answered_accuracy"]))
        for p in model.get("cascade", ())
    )
    parsed = model.get("split_points")  # resolved by a RegistryCache from a digest
    splits = parsed if parsed is not None else tuple(
        SplitPoint.from_dict(p) for p in model.get("splits", ()))
    return ModelView(
        name=model["name"], task=model["task"], version=str(model["version"]),
        accuracy=float(model["accuracy"]), latency_ms=float(model["latency_ms"]),
        output_bytes=int(model.get("output_bytes", 64)), cascade=cascade, splits=splits,
    )


def _parse_profile(raw: list[dict[str, Any]], digest: str) -> tuple[SplitPoint, ...]:
    try:
        return tuple(SplitPoint.from_dict(p) for p in raw)
    except (KeyError, ValueError, TypeError) as exc:
        raise ControlPlaneError(f"split profile {digest} is malformed: {exc!r}",
                                hint="is the control plane a compatible tierlink?") from exc


class HeartbeatLoop:
    """Heartbeat (and refresh ``cache``) every ``interval_s`` until stopped.

    Each beat calls ``get_body()`` for the node's current state, so load and models are
    fresh. Each accepted heartbeat's answer goes to ``on_answer`` (awaited on the loop, so
    it must return quickly: start long work in a task); an exception it raises is logged,
    and does not count as a failed beat. The loop survives every error: an outage is logged
    once when it starts and once when it ends, and counted in ``failures`` (failed beats)
    and ``outages``.
    """

    def __init__(self, client: ControlClient, cache: RegistryCache | None = None, *,
                 on_answer: AnswerHook | None = None) -> None:
        self.client = client
        self.cache = cache
        self.on_answer = on_answer
        self.sent = 0  # heartbeats accepted
        self.failures = 0  # beats that failed, ever
        self.outages = 0  # runs of consecutive failures
        self._failing_since: int | None = None  # self.failures when the outage began
        self._node_id: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, get_body: Callable[[], dict[str, Any]], interval_s: float = 1.0
              ) -> asyncio.Task[None]:
        """Start beating now, then every ``interval_s``. Call from a running event loop.
        ``get_body`` runs on the loop at every beat: it must be cheap (read counters)."""
        if self.running:
            raise RuntimeError("HeartbeatLoop is already running; stop() it first")
        self._task = asyncio.create_task(self._run(get_body, interval_s),
                                         name="tierlink-heartbeat")
        return self._task

    async def stop(self, *, deregister: bool = True) -> None:
        """Cancel the loop, then deregister best-effort (a failure is logged, not raised)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if deregister and self._node_id is not None:
            try:
                await self.client.deregister(self._node_id)
            except ControlPlaneError as exc:
                log.info("could not deregister %s on shutdown (it will expire): %s",
                         self._node_id, exc)

    async def beat(self, get_body: Callable[[], dict[str, Any]]) -> bool:
        """One heartbeat and one cache refresh; True when the heartbeat was accepted."""
        try:
            body = get_body()
            self._node_id = body.get("node_id", self._node_id)
            answer = await self.client.heartbeat(body)
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any failure
            self._failed(exc)
            ok = False
        else:
            self._succeeded()
            await self._answered(answer)
            ok = True
        if self.cache is not None:
            await self.cache.refresh()  # keeps the old view on failure
        return ok

    async def _answered(self, answer: dict[str, Any]) -> None:
        if self.on_answer is None:
            return
        try:
            await self.on_answer(answer)
        except Exception:
            log.exception("handling the control plane's heartbeat answer failed")

    async def _run(self, get_body: Callable[[], dict[str, Any]], interval_s: float) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.beat(get_body)
            # A fixed rate, not a fixed pause: slow beats do not stretch the period.
            next_at = max(next_at + interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self._failing_since is None:
            self._failing_since = self.failures - 1
            self.outages += 1
            log.warning("heartbeat to the control plane failed: %s; retrying every beat, "
                        "routing from the cached view (outage %d)", exc, self.outages)

    def _succeeded(self) -> None:
        self.sent += 1
        if self._failing_since is not None:
            missed = self.failures - self._failing_since
            log.info("control plane at %s reachable again after %d failed heartbeats",
                        self.client.base_url, missed)
            self._failing_since = None
