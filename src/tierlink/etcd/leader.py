"""One leader among control-plane replicas, by an etcd lease: who steps the rollouts.

The leader holds ``key`` on a lease of ``ttl_s`` and renews it each time it asks
:meth:`Leadership.holds` (the rollout tick, about once a second). A replica that dies stops
renewing; its lease runs out and the next replica to ask takes the key. Two replicas never
both hold it: taking it is a transaction on the key being absent.
"""

from __future__ import annotations

import logging
import threading

from tierlink.errors import ControlPlaneError
from tierlink.etcd.client import Compare, Etcd, Op

log = logging.getLogger(__name__)


class Leadership:
    """Campaign for ``key`` as ``name`` (e.g. the replica's URL)."""

    def __init__(self, etcd: Etcd, key: str, name: str, ttl_s: float = 3.0) -> None:
        self.etcd, self.key, self.name, self.ttl_s = etcd, key, name, ttl_s
        self._lease = 0
        self._lock = threading.Lock()

    def holds(self) -> bool:
        """Renew the lease when this replica leads, else try to take the key; whether this
        replica leads now. An etcd that cannot be reached means "no" (never two leaders)."""
        with self._lock:
            try:
                if self._lease and self.etcd.keepalive(self._lease) > 0:
                    return True
                if self._lease:
                    log.warning("%s lost the lead (%s): its lease ran out", self.name, self.key)
                self._lease = 0
                return self._campaign()
            except ControlPlaneError as exc:
                log.warning("%s cannot reach etcd to lead: %s", self.name, exc)
                return False

    def resign(self) -> None:
        """Give the lead up at once (on shutdown), so another replica takes it now."""
        with self._lock:
            if self._lease:
                try:
                    self.etcd.revoke(self._lease)
                except ControlPlaneError:
                    pass  # it runs out by itself
                self._lease = 0

    def _campaign(self) -> bool:
        lease = self.etcd.grant(self.ttl_s)
        held, _ = self.etcd.txn([Compare(self.key, "version", 0)],
                                [Op("put", self.key, self.name.encode(), lease)])
        if not held:
            self.etcd.revoke(lease)
            return False
        self._lease = lease
        log.info("%s leads %s", self.name, self.key)
        return True
