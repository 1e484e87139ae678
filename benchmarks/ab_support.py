"""What the before/after benchmarks (``hop_ab.py``, ``registry_read.py``) share: a checkout of
the old revision, a process's CPU time, and the command line that runs one and writes JSON."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def short_rev(rev: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev],
                          check=True, capture_output=True, text=True).stdout.strip()


def worktree(stack: ExitStack, rev: str, prefix: str) -> Path:
    """A checkout of ``rev`` in a temporary directory, removed when ``stack`` closes."""
    path = Path(tempfile.mkdtemp(prefix=prefix)) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev],
                   check=True)
    stack.callback(subprocess.run, ["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(path)], check=False)
    return path


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cli(doc: str, add_arguments: Callable[[argparse.ArgumentParser], None],
        run: Callable[[argparse.Namespace], dict[str, Any]],
        print_table: Callable[[dict[str, Any]], None], argv: list[str] | None) -> None:
    """Parse ``--old-rev``, ``--json`` and the benchmark's own flags, run, print, write."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--old-rev", required=True, help="the git revision to compare with")
    add_arguments(parser)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    result = run(args)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
