"""A small OTLP/HTTP trace receiver: what `tierlink up --traces` starts when no collector is
at hand (an OpenTelemetry Collector or Jaeger takes its place in production: the nodes speak
plain OTLP to either).

It accepts ``POST /v1/traces`` in both OTLP/HTTP encodings (binary protobuf and JSON, gzip
or not) and appends each export to a file as one line of OTLP JSON — the format of the
Collector's file exporter, with hex trace and span ids — which ``tierlink trace show``
reads. ``python -m tierlink.telemetry.otlp_receiver --port 4318 --out traces.jsonl``.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TRACES_PATH = "/v1/traces"
_MAX_BODY = 64 * 1024 * 1024
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def decode_export(body: bytes, content_type: str) -> dict[str, Any]:
    """One export request as OTLP JSON (a dict with ``resourceSpans``). Raises ValueError
    when the body is not an OTLP trace export in that encoding."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    if content_type.startswith("application/json"):
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise ValueError(f"the body is not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("resourceSpans", []), list):
            raise ValueError("an OTLP JSON export is an object with a resourceSpans list")
        return data
    if not content_type.startswith("application/x-protobuf"):
        raise ValueError(f"unsupported content type {content_type!r}: OTLP/HTTP sends "
                         "application/x-protobuf or application/json")
    msg = ExportTraceServiceRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"the body is not an ExportTraceServiceRequest: {exc}") from None
    return _hex_ids(json_format.MessageToDict(msg))


def _hex_ids(node: Any) -> Any:
    """protobuf's JSON writes bytes as base64; OTLP JSON writes trace and span ids as hex."""
    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in _ID_KEYS and isinstance(v, str)
                    else _hex_ids(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_hex_ids(v) for v in node]
    return node


def span_count(export: dict[str, Any]) -> int:
    return sum(len(ss.get("spans", [])) for rs in export.get("resourceSpans", [])
               for ss in rs.get("scopeSpans", []))


class OtlpReceiver:
    """Serves ``POST /v1/traces`` on ``host:port`` (0: any free port) into ``out``."""

    def __init__(self, out: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.out, self.host = out, host
        self.spans = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._post(self)

            def do_GET(self) -> None:
                if self.path == "/healthz":
                    _answer(self, 200, b'{"status": "ok"}', "application/json")
                else:
                    _answer(self, 404, b'{"error": "only POST /v1/traces is served here"}',
                            "application/json")

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _post(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.split("?")[0] != TRACES_PATH:
            _answer(h, 404, json.dumps({"error": f"unknown path {h.path}; OTLP traces go to "
                                                 f"{TRACES_PATH}"}).encode(), "application/json")
            return
        try:
            export = decode_export(_body(h), h.headers.get("Content-Type", ""))
        except ValueError as exc:
            _answer(h, 400, json.dumps({"error": str(exc)}).encode(), "application/json")
            return
        with self._lock:
            with self.out.open("a") as fh:
                fh.write(json.dumps(export, separators=(",", ":")) + "\n")
            self.spans += span_count(export)
        protobuf = h.headers.get("Content-Type", "").startswith("application/x-protobuf")
        # An empty ExportTraceServiceResponse: zero bytes in protobuf, {} in JSON.
        _answer(h, 200, b"" if protobuf else b"{}",
                "application/x-protobuf" if protobuf else "application/json")


def _body(h: BaseHTTPRequestHandler) -> bytes:
    try:
        length = int(h.headers.get("Content-Length", "0"))
    except ValueError:
        raise ValueError("Content-Length is not a number") from None
    if not 0 <= length <= _MAX_BODY:
        raise ValueError(f"a body of {length} bytes is refused (at most {_MAX_BODY})")
    body = h.rfile.read(length)
    if h.headers.get("Content-Encoding", "").lower() == "gzip":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError) as exc:
            raise ValueError(f"the body is not gzip: {exc}") from None
    return body


def _answer(h: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4318)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ready-file", type=Path, default=None)
    args = p.parse_args(argv)
    receiver = OtlpReceiver(args.out, args.host, args.port)
    if args.ready_file:  # whole or not at all: a launcher polls for it
        from tierlink.durable import write_json

        write_json(args.ready_file, {"port": receiver.port, "endpoint": receiver.endpoint},
                   "the OTLP receiver's ready file")
    import signal

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=receiver.stop).start())
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
