"""The demo's chat phase on its own fleet (``demo/fleets/chat-fleet.yaml``): tierlink vs
cloud-only vs device-only on labelled prompts at three privacy levels."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from tierlink.demo.chat import RUNS, chat_items, run_chat, summarize
from tierlink.demo.fleets import CHAT_FLEET, fleet_path
from tierlink.fleet.config import load_fleet
from tierlink.fleet.launcher import launch

console = Console(stderr=True)


def chat_phase(quick: bool, fleet_file: Path | None = None,
               per_device: int | None = None) -> dict[str, Any]:
    """``fleet_file``: the chat fleet (default: the demo's own, ``chat-fleet.yaml``)."""
    config = load_fleet(fleet_path(CHAT_FLEET) if fleet_file is None else fleet_file)
    devices = [n.node_id for n in config.nodes if n.tier.label == "device" and n.chat]
    items = chat_items(devices, per_device=per_device or (12 if quick else 30))
    runs: dict[str, Any] = {}
    reference: dict[tuple[str, str], str] = {}
    run_dir = Path(tempfile.mkdtemp(prefix="tierlink-chat-"))
    try:
        with launch(config, {}, run_dir, say=lambda m: console.print(f"[dim]{m}[/dim]"),
                    ready_timeout_s=180.0) as fleet:
            for run in RUNS:
                with Progress(TextColumn(f"chat {run:<12}"), BarColumn(),
                              MofNCompleteColumn(), console=console) as bar:
                    task = bar.add_task(run, total=len(items))

                    def advance(n: int, bar: Progress = bar, task: Any = task) -> None:
                        bar.update(task, completed=n)
                    records = run_chat(fleet, items, run, progress=advance)
                if run == "cloud_only":
                    reference = {(r["device"], r["prompt"]): r["text"] for r in records}
                runs[run] = summarize(records, reference)
    except BaseException:
        console.print(f"[dim]the chat fleet's logs and state are kept in {run_dir}[/dim]")
        raise
    shutil.rmtree(run_dir, ignore_errors=True)  # a stopped fleet's logs, state, certificates
    _print(runs)
    return {"fleet": config.name, "prompts": len(items), "runs": runs}


def _print(runs: dict[str, Any]) -> None:
    table = Table("chat run", "same as large", "TTFT p50 / p95 ms", "left device",
                  "cost / 1k", "privacy violations", "local / site / any same",
                  title="chat phase (answers compared with the large model's own)")
    for name, r in runs.items():
        by = r["by_privacy"]
        table.add_row(name, f"{100 * r['same_as_large']:.1f}%",
                      f"{r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f}",
                      f"{100 * r['left_device']:.0f}%", f"${r['cost_per_1k']:.4f}",
                      str(r["privacy_violations"]),
                      " / ".join(f"{100 * by[p]['same_as_large']:.0f}%"
                                 for p in ("local", "site", "any")))
    Console().print(table)
