"""The demo's chat phase on its own fleet (``demo/fleets/chat-fleet.yaml``): tierlink vs
cloud-only vs device-only on everyday and labelled prompts at three privacy levels."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tierlink.core.progress import Phase, Reporter
from tierlink.demo.chat import RUNS, chat_items, labelled_items, run_chat, summarize
from tierlink.demo.fleets import CHAT_FLEET, fleet_path
from tierlink.fleet.config import load_fleet
from tierlink.fleet.launcher import launch

console = Console(stderr=True)


def chat_phase(quick: bool, fleet_file: Path | None = None,
               per_device: int | None = None,
               reporter: Reporter | None = None) -> dict[str, Any]:
    """``fleet_file``: the chat fleet (default: the demo's own, ``chat-fleet.yaml``);
    ``reporter``: where its phases show (default: stderr)."""
    reporter = reporter or Reporter()
    config = load_fleet(fleet_path(CHAT_FLEET) if fleet_file is None else fleet_file)
    devices = [n.node_id for n in config.nodes if n.tier.label == "device" and n.chat]
    share = per_device or (12 if quick else 30)
    items = chat_items(devices, share) + labelled_items(devices, share)
    runs: dict[str, Any] = {}
    reference: dict[tuple[str, str], str] = {}
    run_dir = Path(tempfile.mkdtemp(prefix="tierlink-chat-"))
    try:
        with reporter.phase("starting the chat fleet"):
            fleet = launch(config, {}, run_dir, say=reporter.say, ready_timeout_s=180.0)
        with fleet:
            for run in RUNS:
                with reporter.phase(f"chat {run}", len(items)) as phase:
                    records = run_chat(fleet, items, run, progress=_counter(phase))
                if run == "cloud_only":
                    reference = {(r["device"], r["prompt"]): r["text"] for r in records}
                runs[run] = summarize(records, reference)
    except BaseException:
        reporter.say(f"the chat fleet's logs and state are kept in {run_dir}")
        raise
    shutil.rmtree(run_dir, ignore_errors=True)  # a stopped fleet's logs, state, certificates
    _print(runs)
    return {"fleet": config.name, "prompts": len(items), "runs": runs}


def _counter(phase: Phase) -> Callable[[int], None]:
    """``run_chat``'s progress: answers so far, counted on ``phase``."""
    return lambda n: phase.update(completed=n)


def _print(runs: dict[str, Any]) -> None:
    table = Table("chat run", "same as large", "labelled right", "TTFT p50 / p95 ms",
                  "left device", "cost / 1k", "privacy violations", "local / site / any same",
                  title="chat phase (everyday answers compared with the large model's own; "
                        "labelled prompts scored)")
    for name, r in runs.items():
        by = r["by_privacy"]
        labelled = r["labelled_right"]
        table.add_row(name, f"{100 * r['same_as_large']:.1f}%",
                      "—" if labelled is None else f"{100 * labelled:.1f}%",
                      f"{r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f}",
                      f"{100 * r['left_device']:.0f}%", f"${r['cost_per_1k']:.4f}",
                      str(r["privacy_violations"]),
                      " / ".join(f"{100 * by[p]['same_as_large']:.0f}%"
                                 for p in ("local", "site", "any")))
    Console().print(table)
