"""``tierlink trace``: receive spans over OTLP, list traces, draw one as a waterfall.

A fleet started with ``tierlink up --traces`` writes ``<run dir>/traces.jsonl``; a node
with ``--trace-file`` writes the SDK's span JSON; an OpenTelemetry Collector's file
exporter writes OTLP JSON. ``list`` and ``show`` read any of them (``--file``, repeatable).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tierlink.cli.errors import fail
from tierlink.errors import TierlinkError

app = typer.Typer(help="Receive, list and show request traces.", no_args_is_help=True)
console = Console(stderr=True)

FILES_HELP = "span files: OTLP JSON lines or SDK span JSON lines (repeatable)"


@app.command()
def collect(out: Path = typer.Option(Path("traces.jsonl"), help="append exports here"),
            port: int = typer.Option(4318, help="the OTLP/HTTP port (0: any free one)"),
            host: str = typer.Option("127.0.0.1")) -> None:
    """Receive OTLP/HTTP trace exports (POST /v1/traces) into OUT until Ctrl-C."""
    from tierlink.telemetry.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver(out, host, port)
    console.print(f"receiving OTLP traces at {receiver.endpoint}/v1/traces into {out} "
                  "(Ctrl-C to stop)")
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    console.print(f"{receiver.spans} spans received")


@app.command("list")
def list_cmd(file: list[Path] = typer.Option(..., "--file", "-f", help=FILES_HELP),
             limit: int = typer.Option(20, min=1, help="the newest this many"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """The traces in the files, newest first: root span, duration, spans, services."""
    from tierlink.telemetry.trace_view import load_spans, summaries

    try:
        found = summaries(load_spans(file))[:limit]
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps([t.to_json() for t in found], indent=2))
        return
    table = Table(title=f"{len(found)} traces")
    table.add_column("trace id", no_wrap=True, min_width=32)
    for column in ("root", "ms", "spans", "services", "errors"):
        table.add_column(column)
    for t in found:
        table.add_row(t.trace_id, f"{t.service} {t.root}", f"{t.duration_ms:.2f}",
                      str(t.spans), ", ".join(t.services), str(t.errors or ""))
    Console().print(table)


@app.command()
def show(trace_id: str = typer.Argument(..., help="a trace id (or its first digits)"),
         file: list[Path] = typer.Option(..., "--file", "-f", help=FILES_HELP),
         width: int = typer.Option(40, min=10, max=200, help="bar width"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """One trace as a waterfall: every span by node, on one time axis."""
    from tierlink.telemetry.trace_view import find_trace, load_spans, to_json, waterfall

    try:
        group = find_trace(load_spans(file), trace_id)
    except TierlinkError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(to_json(group), indent=2))
        return
    for line in waterfall(group, width):
        print(line)
