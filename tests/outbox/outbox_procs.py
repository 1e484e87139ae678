"""The two processes of the kill -9 test (run as a script, not collected by pytest).

``receiver DB``: an HTTP server on 127.0.0.1 (port printed as ``PORT n``) that applies each
delivered item exactly once: the inbox key and the effect (a row in ``effects``) commit in one
SQLite transaction. ``POST /stall`` arms it: the next ``/deliver`` applies its batch, then
holds its answer until ``POST /release`` (``GET /stalled`` waits until that happened), so a
test can kill the sender between the receiver applying and the sender acking.

``sender DB URL COUNT [--drain]``: an outbox on DB delivering to URL; enqueues COUNT items
(printing ``TRY key`` before and ``ACCEPTED key`` after each ``put``) alternately for two
destinations while delivering; with ``--drain`` waits until the outbox is empty, prints
``DRAINED`` and exits, otherwise runs until killed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import sys
import threading
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tierlink.outbox import Ack, AckStatus, Backoff, Deliverer, Inbox, Item, Outbox

DESTINATIONS = ("edge-1", "edge-2")


class Receiver:
    def __init__(self, path: str) -> None:
        self.inbox = Inbox(path)
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY "
                          "AUTOINCREMENT, destination TEXT NOT NULL, key TEXT NOT NULL)")
        self.conn.execute("CREATE TABLE IF NOT EXISTS duplicates (key TEXT NOT NULL)")
        self.conn.commit()
        self.lock = threading.Lock()
        self.armed, self.stalled, self.release = (threading.Event() for _ in range(3))

    def deliver(self, body: dict[str, Any]) -> dict[str, Any]:
        acks = [self._apply(body["destination"], item["key"]) for item in body["items"]]
        if self.armed.is_set():
            self.armed.clear()
            self.stalled.set()
            self.release.wait(30)
        return {"acks": acks}

    def _apply(self, destination: str, key: str) -> dict[str, str]:
        with self.lock, self.conn:  # the key and the effect: one transaction
            if self.inbox.record(key, self.conn, result=b"ok"):
                self.conn.execute("INSERT INTO effects (destination, key) VALUES (?, ?)",
                                  (destination, key))
                return {"key": key, "status": "ok"}
            self.conn.execute("INSERT INTO duplicates (key) VALUES (?)", (key,))
            return {"key": key, "status": "duplicate"}


def serve(path: str) -> None:
    receiver = Receiver(path)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path == "/deliver":
                length = int(self.headers["Content-Length"])
                self._answer(receiver.deliver(json.loads(self.rfile.read(length))))
            elif self.path == "/stall":
                receiver.armed.set()
                self._answer({})
            elif self.path == "/release":
                receiver.release.set()
                self._answer({})

        def do_GET(self) -> None:
            self._answer({"stalled": receiver.stalled.wait(20)})

        def _answer(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the sender was killed while we held its answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


async def send_run(path: str, url: str, count: int, drain: bool) -> None:
    import httpx

    outbox = Outbox(path)
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:

        async def send(destination: str, items: Sequence[Item]) -> Sequence[Ack]:
            body = {"destination": destination, "items": [
                {"key": i.key, "kind": i.kind, "payload": base64.b64encode(i.payload).decode()}
                for i in items]}
            response = await client.post("/deliver", json=body)
            response.raise_for_status()
            return [Ack(a["key"], AckStatus(a["status"])) for a in response.json()["acks"]]

        deliverer = Deliverer(outbox, send, backoff=Backoff(base_s=0.02, max_s=0.2), batch=16)
        deliverer.start()
        for i in range(count):
            destination, key = DESTINATIONS[i % 2], uuid.uuid4().hex
            print(f"TRY {destination} {key}", flush=True)
            outbox.put(destination, "result", f"item {i}".encode(), key=key)
            print(f"ACCEPTED {destination} {key}", flush=True)
            deliverer.kick(destination)
            await asyncio.sleep(0.002)
        while drain and outbox.pending():
            await asyncio.sleep(0.01)
        if drain:
            await deliverer.stop()
            print("DRAINED", flush=True)
            return
        await asyncio.Event().wait()  # until killed


def main(argv: list[str]) -> None:
    if argv[0] == "receiver":
        serve(argv[1])
    else:
        asyncio.run(send_run(argv[1], argv[2], int(argv[3]), "--drain" in argv))


if __name__ == "__main__":
    main(sys.argv[1:])
