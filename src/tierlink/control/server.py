"""Run the control plane as a process: ``python -m tierlink.control.server --port P --db PATH``.

:func:`run_control` serves :func:`tierlink.control.app.create_app` over a
:class:`~tierlink.control.store.SqliteRegistryStore` with uvicorn, and returns when it
receives SIGTERM or SIGINT (after finishing in-flight requests and closing the store).

Readiness: with ``ready_file`` it writes ``{"port": <actual port>}`` there (atomically) once
the socket listens and the app has started, so a launcher binding port 0 learns the real
port; the file is removed again on a clean exit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tierlink.errors import ConfigError, TierlinkError

if TYPE_CHECKING:
    from tierlink.control.identity import Identity
    from tierlink.control.results import DeliveredResults
    from tierlink.control.rollouts import Rollouts
    from tierlink.control.routing_revisions import RoutingRevisions
    from tierlink.control.store import HardExampleStore, RegistryStore
    from tierlink.etcd.client import Etcd
    from tierlink.etcd.leader import Leadership
    from tierlink.repo.service import RepositoryService
    from tierlink.repo.store import VersionStore


class _Closeable(Protocol):
    def close(self) -> None: ...


_C = TypeVar("_C", bound=_Closeable)

# Named, not __name__: run with -m, this module is "__main__".
log = logging.getLogger("tierlink.control.server")


@dataclass(frozen=True, slots=True)
class ControlTls:
    """A replica's HTTPS: its certificate and key, the fleet CA's folder (``ca.pem``;
    with ``ca.key`` it signs node certificates) and how long those live."""

    cert: Path
    key: Path
    ca_dir: Path
    cert_ttl_s: float = 86_400.0

    @classmethod
    def from_args(cls, cert: Path | None, key: Path | None, ca_dir: Path | None,
                  cert_ttl_s: float) -> ControlTls | None:
        if cert is None and key is None and ca_dir is None:
            return None
        if cert is None or key is None or ca_dir is None:
            raise ConfigError("HTTPS needs --tls-cert, --tls-key and --tls-ca together",
                              hint="`tierlink pki init DIR` then `tierlink pki issue control "
                                   "NAME --ca DIR` make them")
        if cert_ttl_s < 10:
            raise ConfigError(f"--cert-ttl must be at least 10 s, not {cert_ttl_s}")
        return cls(cert, key, ca_dir, cert_ttl_s)

    def server_context(self) -> ssl.SSLContext:
        from tierlink.security.pki import CA_CERT
        from tierlink.security.tls import TlsFiles, server_context

        return server_context(TlsFiles(self.ca_dir / CA_CERT, self.cert, self.key))

    def app_options(self) -> dict[str, Any]:
        """``create_app``'s CA arguments: signing only where the CA's key is here."""
        from tierlink.security.pki import CA_KEY, Authority

        if not (self.ca_dir / CA_KEY).exists():
            return {}
        return {"authority": Authority.load(self.ca_dir), "cert_ttl_s": self.cert_ttl_s}


def run_control(
    host: str,
    port: int,
    db_path: str | Path,
    ttl_s: float = 5.0,
    ready_file: Path | None = None,
    hard_example_rows: int = 50_000,
    admin_token_file: Path | None = None,
    open_registry: bool = False,
    repo_dir: Path | None = None,
    trusted_publishers: tuple[str, ...] = (),
    result_rows: int = 200_000,
    etcd_endpoints: tuple[str, ...] = (),
    tls: ControlTls | None = None,
) -> None:
    """Serve the registry on ``host:port`` (0: any free port) until SIGTERM/SIGINT.

    Calls are authenticated (nodes enroll; operators use the admin token in
    ``admin_token_file``, default ``<db>.admin-token``, created mode 0600 when absent)
    unless ``open_registry`` (a trusted loopback without credentials).

    The model repository keeps its blobs under ``repo_dir`` (default ``<db>.blobs``) and its
    versions in the same SQLite file; with ``trusted_publishers`` (ed25519 public keys) only
    versions signed by one of them are accepted.

    With ``etcd_endpoints`` this is one **replica** of a control plane whose registry,
    credentials and published versions live in etcd (any number of replicas serve the same
    fleet; they share ``repo_dir`` and the admin token), and so do rollouts (one replica,
    the leader of an etcd lease, steps them), hard examples and delivered results: a
    replica keeps nothing of its own, and ``db_path`` only names its defaults.

    With ``tls`` it serves HTTPS with its own certificate, and (given the CA's folder)
    signs enrolled nodes' certificates (``POST /v1/certificate``).

    Raises :class:`~tierlink.errors.ConfigError` when the port cannot be bound and
    :class:`~tierlink.errors.ControlPlaneError` when the database cannot be opened.
    """
    from tierlink.control.app import create_app

    sock = _bind(host, port)
    actual_port = sock.getsockname()[1]
    try:
        token_file = None if open_registry else \
            (admin_token_file or Path(f"{db_path}.admin-token"))
        with _stores(db_path, etcd_endpoints, token_file, repo_dir,
                     tuple(trusted_publishers)) as (store, identity, repository, shared):
            app = create_app(store, ttl_s=ttl_s, hard_example_max_rows=hard_example_rows,
                             result_max_rows=result_rows, identity=identity,
                             repository=repository, local_db=str(db_path),
                             hard_examples=shared.hard_examples(
                                 hard_example_rows, repository.blobs.root),
                             results=shared.results(result_rows),
                             rollout_store=shared.rollouts, leader=shared.leader(
                                 f"{host}:{actual_port}"), routing_store=shared.routing,
                             **(tls.app_options() if tls else {}))
            _serve(app, sock, on_ready=lambda: _announce(ready_file, host, actual_port,
                                                         tls is not None),
                   ssl_context=tls.server_context() if tls else None)
    finally:
        sock.close()
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)


@contextmanager
def _stores(db_path: str | Path, etcd_endpoints: tuple[str, ...], token_file: Path | None,
            repo_dir: Path | None, trusted: tuple[str, ...]
            ) -> Iterator[tuple[RegistryStore, Identity | None, RepositoryService, _Shared]]:
    """The registry, identity and repository stores, on SQLite or etcd (and, on etcd, the
    rollouts and who steps them); closed after."""
    from tierlink.control.identity import IdentityStore, load_or_create_admin_token
    from tierlink.control.store import SqliteRegistryStore
    from tierlink.repo.blobs import BlobStore
    from tierlink.repo.service import RepositoryService
    from tierlink.repo.store import SqliteVersionStore

    with contextlib.ExitStack() as stack:
        admin = None if token_file is None else load_or_create_admin_token(token_file)
        if token_file is not None:
            log.info("admin token in %s; nodes must enroll", token_file)
        store: RegistryStore
        identity: Identity | None = None
        versions: VersionStore
        shared = _Shared()
        if etcd_endpoints:
            from tierlink.control.etcd_identity import EtcdIdentityStore
            from tierlink.control.etcd_store import EtcdRegistryStore
            from tierlink.etcd.client import Etcd
            from tierlink.repo.etcd_store import EtcdVersionStore

            etcd = stack.enter_context(Etcd(etcd_endpoints))
            store = stack.enter_context(_closing(EtcdRegistryStore(etcd).start()))
            versions = EtcdVersionStore(etcd)
            shared = _Shared(etcd)
            stack.callback(shared.resign)
            if admin is not None:
                identity = stack.enter_context(_closing(EtcdIdentityStore(etcd, admin).start()))
            log.info("registry, credentials and versions in etcd at %s", ",".join(etcd_endpoints))
        else:
            store = stack.enter_context(_closing(SqliteRegistryStore(db_path)))
            versions = stack.enter_context(_closing(SqliteVersionStore(db_path)))
            if admin is not None:
                identity = stack.enter_context(_closing(IdentityStore(db_path, admin)))
        repository = RepositoryService(versions, BlobStore(repo_dir or Path(f"{db_path}.blobs")),
                                       trusted_publishers=trusted)
        yield store, identity, repository, shared


class _Shared:
    """What replicas over etcd share besides the registry: the rollouts, the routing
    revisions, and the lead of whoever steps the rollouts (nothing without etcd: the app
    keeps both in its SQLite file)."""

    def __init__(self, etcd: Etcd | None = None) -> None:
        self.etcd = etcd
        self._leadership: Leadership | None = None
        self.rollouts: Rollouts | None = None
        self.routing: RoutingRevisions | None = None
        if etcd is not None:
            from tierlink.control.etcd_rollouts import EtcdRolloutStore
            from tierlink.control.routing_revisions import EtcdRoutingRevisions

            self.rollouts = EtcdRolloutStore(etcd)
            self.routing = EtcdRoutingRevisions(etcd)

    def hard_examples(self, max_rows: int, blob_root: Path) -> HardExampleStore | None:
        """On etcd, the hard examples every replica shares, their tensors in the shared
        blob folder (None: the app's SQLite file)."""
        if self.etcd is None:
            return None
        from tierlink.control.etcd_hard_examples import EtcdHardExampleStore
        from tierlink.repo.blobs import BlobStore

        return EtcdHardExampleStore(self.etcd, BlobStore(blob_root / "hard-examples"),
                                    max_rows=max_rows)

    def results(self, max_rows: int) -> DeliveredResults | None:
        """On etcd, the delivered items every replica shares (None: the app's SQLite file)."""
        if self.etcd is None:
            return None
        from tierlink.control.etcd_results import EtcdResultStore

        return EtcdResultStore(self.etcd, max_rows=max_rows)

    def leader(self, name: str) -> Callable[[], bool] | None:
        if self.etcd is None:
            return None
        from tierlink.etcd.leader import Leadership

        self._leadership = Leadership(self.etcd, "/tierlink/leader/rollouts", name)
        return self._leadership.holds

    def resign(self) -> None:
        if self._leadership is not None:
            self._leadership.resign()


@contextmanager
def _closing(thing: _C) -> Iterator[_C]:
    try:
        yield thing
    finally:
        thing.close()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket bound here, so port 0 resolves before uvicorn starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pick another --port (0 picks a free one) or stop what is using it",
        ) from exc


def _announce(ready_file: Path | None, host: str, port: int, tls: bool = False) -> None:
    log.info("tierlink control plane listening on %s://%s:%d", "https" if tls else "http",
             host, port)
    if ready_file is None:
        return
    # Write then rename: a launcher polling for the file never reads half of it.
    tmp = ready_file.with_name(ready_file.name + ".tmp")
    tmp.write_text(json.dumps({"port": port}))
    os.replace(tmp, ready_file)


def _serve(app: object, sock: socket.socket, on_ready: Callable[[], None],
           ssl_context: ssl.SSLContext | None = None) -> None:
    """Run uvicorn on ``sock`` until a signal stops it; ``on_ready`` once it accepts."""
    import uvicorn

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:  # False when the app's startup failed
                on_ready()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # Before uvicorn stops accepting and waits out open requests (long polls):
            # the app stops expiring nodes and answers its watchers (control/app.py).
            stopping = getattr(getattr(app, "state", None), "stopping", None)
            if stopping is not None:
                await stopping()
            await super().shutdown(sockets)

    tls_options: dict[str, Any] = {} if ssl_context is None else {
        "ssl_context_factory": lambda _config, _default: ssl_context}
    config = uvicorn.Config(app, log_level="warning", lifespan="on",  # type: ignore[arg-type]
                            timeout_graceful_shutdown=5, **tls_options)
    _tune_gc()
    with _quiet_after_shutdown():
        ReadyServer(config).run(sockets=[sock])


def _tune_gc() -> None:
    """Keep the cycle collector from stalling heartbeats. A registry of 10,000 nodes holds
    some 170,000 tracked objects, and a full collection of them and the imported modules
    stopped this process for 100-300 ms every few seconds under 10% changed heartbeats:
    the p99 of every heartbeat. What was loaded before serving is frozen (never scanned
    again), and full collections come a tenth as often. Heartbeat state is acyclic (freed
    by reference counting), so collecting it rarely costs no memory."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


@contextmanager
def _quiet_after_shutdown() -> Iterator[None]:
    """uvicorn re-raises the signal that stopped it once it has shut down, which would kill
    the process before the store is closed (SIGTERM) or raise KeyboardInterrupt (SIGINT).
    Handlers installed here receive that re-raise instead, so we exit with status 0."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals belong to the main thread; the embedding program handles them
        return

    def note(sig: int, _frame: FrameType | None) -> None:
        log.info("received %s; shutting down", signal.Signals(sig).name)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tierlink.control.server``: parse flags, serve, exit 0 on SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tierlink.control.server",
                                     description="tierlink control plane (fleet registry)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--db", required=True, type=Path, help="SQLite file (created if absent)")
    parser.add_argument("--ttl", type=float, default=5.0,
                        help="seconds without a heartbeat before a node expires (default 5)")
    parser.add_argument("--ready-file", type=Path, default=None,
                        help='write {"port": N} here once listening')
    parser.add_argument("--hard-example-rows", type=int, default=50_000,
                        help="keep at most this many hard examples (oldest evicted)")
    parser.add_argument("--result-rows", type=int, default=200_000,
                        help="keep at most this many delivered results (oldest evicted; "
                             "each is kept at most seven days)")
    parser.add_argument("--admin-token-file", type=Path, default=None,
                        help="the operators' token (created 0600 if absent; default "
                             "<db>.admin-token)")
    parser.add_argument("--open", action="store_true",
                        help="no credentials: any caller may heartbeat, publish and read "
                             "(a trusted loopback only)")
    parser.add_argument("--repo-dir", type=Path, default=None,
                        help="where the model repository keeps its blobs (default <db>.blobs)")
    parser.add_argument("--etcd", default="", metavar="URL[,URL...]",
                        help="keep the registry, credentials and published versions in the "
                             "etcd cluster at these client URLs: this process is then one "
                             "replica of the control plane")
    parser.add_argument("--trusted-key", action="append", default=[], metavar="PUBLIC_KEY",
                        help="accept model versions signed by this ed25519 key only "
                             "(repeatable; default: any key whose signature verifies)")
    parser.add_argument("--tls-cert", type=Path, default=None,
                        help="serve HTTPS with this certificate (PEM; `tierlink pki issue`)")
    parser.add_argument("--tls-key", type=Path, default=None, help="...and its key")
    parser.add_argument("--tls-ca", type=Path, default=None,
                        help="the fleet CA's folder (ca.pem; with ca.key, this replica "
                             "signs enrolled nodes' certificates)")
    parser.add_argument("--cert-ttl", type=float, default=86_400.0,
                        help="seconds a node certificate is valid (default a day)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Our own lines are rare (start, registrations, expiries), not one per heartbeat.
    logging.getLogger("tierlink").setLevel(logging.INFO)
    try:
        run_control(args.host, args.port, args.db, args.ttl, args.ready_file,
                    args.hard_example_rows, args.admin_token_file, args.open,
                    args.repo_dir, tuple(args.trusted_key), args.result_rows,
                    tuple(u for u in args.etcd.split(",") if u),
                    ControlTls.from_args(args.tls_cert, args.tls_key, args.tls_ca,
                                         args.cert_ttl))
    except TierlinkError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
