"""A local etcd cluster as real processes: what ``tierlink up`` starts for a fleet whose
control plane keeps its state in etcd, and what tests and benchmarks run against.

Each member is one ``etcd`` process (Debian's ``etcd-server``) on loopback ports picked
before it starts, with a data directory of its own under ``base_dir``. :meth:`EtcdCluster.stop`
ends exactly the processes this object started, by pid; :meth:`EtcdCluster.kill` ends one
member at once (``kill -9``), as a crash would.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from tierlink.errors import ConfigError, ControlPlaneError
from tierlink.netports import pick_port

INSTALL_HINT = "install it: apt-get install -y etcd-server (./scripts/setup.sh does)"


@dataclass
class Member:
    name: str
    client_url: str
    peer_url: str
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EtcdCluster:
    """``size`` etcd members on loopback; :meth:`start` them, :attr:`endpoints` to connect."""

    base_dir: Path
    size: int = 3
    host: str = "127.0.0.1"
    token: str = "tierlink"
    history: str = "1m"  # revisions kept before compaction (etcd's periodic retention)
    snapshot_count: int = 2_000  # raft entries between snapshots (etcd 3.4 default: 100,000)
    members: list[Member] = field(default_factory=list)

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def start(self, timeout_s: float = 20.0) -> Self:
        """Start every member and wait until the cluster has a leader and takes writes."""
        binary = shutil.which("etcd")
        if binary is None:
            raise ConfigError("etcd is not installed", hint=INSTALL_HINT)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.members = [self._member(i) for i in range(self.size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        try:
            for member in self.members:
                self._launch(binary, member, initial)
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _member(self, i: int) -> Member:
        name = f"etcd{i}"
        return Member(name=name,
                      client_url=f"http://{self.host}:{pick_port(self.host)}",
                      peer_url=f"http://{self.host}:{pick_port(self.host)}",
                      data_dir=self.base_dir / name)

    def _launch(self, binary: str, member: Member, initial: str) -> None:
        log = (self.base_dir / f"{member.name}.log").open("ab")
        member.process = subprocess.Popen(
            [binary, "--name", member.name, "--data-dir", str(member.data_dir),
             "--listen-client-urls", member.client_url,
             "--advertise-client-urls", member.client_url,
             "--listen-peer-urls", member.peer_url,
             "--initial-advertise-peer-urls", member.peer_url,
             "--initial-cluster", initial, "--initial-cluster-token", self.token,
             "--initial-cluster-state", "new",
             # Quick elections on loopback: a killed leader is replaced in about a second.
             "--heartbeat-interval", "100", "--election-timeout", "1000",
             # A bounded history: etcd keeps every revision of every key until compacted
             # and its raft log in memory until a snapshot, so a fleet's heartbeats would
             # grow it without end (and fill its quota). Watchers that fall behind the
             # compaction read the keys again (Etcd.watch's on_compacted).
             "--auto-compaction-mode", "periodic",
             "--auto-compaction-retention", self.history,
             "--snapshot-count", str(self.snapshot_count),
             "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def wait_ready(self, timeout_s: float = 20.0, crashed_ok: bool = False) -> None:
        """Return once a member answers a write; :class:`ControlPlaneError` after
        ``timeout_s`` or when a member exits (unless ``crashed_ok``: members killed on
        purpose)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=1.0, trust_env=False) as http:
            while time.monotonic() < deadline:
                for member in self.members:
                    if crashed_ok:
                        break
                    if member.process is not None and member.process.poll() is not None:
                        raise ControlPlaneError(
                            f"etcd member {member.name} exited with {member.process.returncode}",
                            hint=f"see {self.base_dir / (member.name + '.log')}")
                if self._writable(http):
                    return
                time.sleep(0.1)
        raise ControlPlaneError(f"etcd cluster in {self.base_dir} not ready in {timeout_s:g} s",
                                hint=f"see the members' logs in {self.base_dir}")

    def _writable(self, http: httpx.Client) -> bool:
        for member in self.members:
            if not member.running:
                continue
            try:
                r = http.post(f"{member.client_url}/v3/kv/put",
                              json={"key": "X190aWVybGluay9yZWFkeQ==", "value": ""})
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                return True
        return False

    def kill(self, index: int) -> Member:
        """``kill -9`` one member (a crash); the others carry on with a quorum."""
        member = self.members[index]
        if member.process is not None and member.process.poll() is None:
            member.process.kill()
            member.process.wait(timeout=10)
        return member

    def restart(self, index: int, timeout_s: float = 20.0) -> Member:
        """Start a killed member again on its ports and data directory (it rejoins the
        cluster it left); returns once the cluster takes writes."""
        member = self.members[index]
        if member.running:
            return member
        binary = shutil.which("etcd")
        if binary is None:
            raise ConfigError("etcd is not installed", hint=INSTALL_HINT)
        self._launch(binary, member, ",".join(f"{m.name}={m.peer_url}" for m in self.members))
        self.wait_ready(timeout_s, crashed_ok=True)
        return member

    def stop(self) -> None:
        """End every member this cluster started (SIGTERM, then SIGKILL after 5 s)."""
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.terminate()
        for member in self.members:
            if member.process is None:
                continue
            try:
                member.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait(timeout=5)

    def __enter__(self) -> Self:
        return self.start() if not self.members else self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
