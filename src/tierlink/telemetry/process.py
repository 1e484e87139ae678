"""A node process's own resources — CPU seconds, resident memory, open files — as
Prometheus's standard ``process_*`` series on the node's ``/metrics`` and as the
``process`` section of its heartbeat (the fleet view shows it per node).

One source for both: prometheus_client's :class:`~prometheus_client.ProcessCollector`
(Linux's ``/proc``). Where there is no ``/proc`` the series are absent and the heartbeat
carries no section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

_FIELDS = {"process_cpu_seconds_total": "cpu_seconds",
           "process_resident_memory_bytes": "resident_bytes",
           "process_open_fds": "open_fds"}


class ProcessState:
    """This process's ``process_*`` series, registered in ``registry``; :meth:`snapshot`
    for the heartbeat."""

    def __init__(self, registry: CollectorRegistry, proc: str = "/proc") -> None:
        from prometheus_client import ProcessCollector

        self._collector = ProcessCollector(registry=registry, proc=proc)

    def snapshot(self) -> dict[str, Any] | None:
        """``{cpu_seconds, resident_bytes, open_fds}`` now; None without ``/proc``."""
        values = {s.name: s.value for family in self._collector.collect()
                  for s in family.samples if s.name in _FIELDS}
        if len(values) < len(_FIELDS):
            return None
        return {"cpu_seconds": round(values["process_cpu_seconds_total"], 3),
                "resident_bytes": int(values["process_resident_memory_bytes"]),
                "open_fds": int(values["process_open_fds"])}
