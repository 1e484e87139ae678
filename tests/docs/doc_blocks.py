"""The shell and Python blocks of the tutorials and how-to guides, read as a test runs them.

A page's fenced ``bash`` and ``python`` blocks run in order, from the repository root, each
in a process of its own (a Python block as a script). An HTML comment on the line just
before a fence (invisible on the site) says how:

- ``<!-- test: timeout=120 -->`` — the block's time limit in seconds (default 300);
- ``<!-- test: background, ready=/tmp/x/endpoints.json -->`` — a long-running command
  (``tierlink up``): started in its own process group, the page goes on once ``ready`` (a
  file) exists and is not empty — or holds ``contains=TEXT`` —, or answers 200 (an
  ``http://`` URL on loopback), and the group is stopped by its pid when the page ends;
- ``<!-- not run: reason -->`` before a ``text`` block — a command aimed at a user's own
  infrastructure (a collector's address, a real cluster): shown, counted, never run.

A page that says ``<!-- test-page: fresh-home -->`` runs with ``TIERLINK_HOME`` in a fresh
directory (what it installs stays out of the machine's own). A block that includes a file
(``--8<-- "path"``, the site's snippets) runs that file's text, as the site shows it.

Nothing is skipped: every ``bash``/``python`` block runs, and a ``text`` block that says it
is not run must say why.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ("bash", "python")
DIRECTIVE = re.compile(r"^<!--\s*(test|not run):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', flags=re.MULTILINE)
FRESH_HOME = "<!-- test-page: fresh-home -->"
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    background: bool = False
    ready: str = ""
    contains: str = ""  # what the ``ready`` file must hold
    timeout_s: float = DEFAULT_TIMEOUT_S
    not_run: str = ""  # the reason a shown command is not run

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` that run or say why not."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        directive = DIRECTIVE.match(lines[i - 1]) if i else None
        code = SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(),
                           "\n".join(lines[i + 1:end]) + "\n")
        block = _block(name, i + 1, fence.group(1), code, directive)
        if block is not None:
            out.append(block)
        i = end + 1
    return out


def fresh_home(page: Path) -> bool:
    """Whether ``page`` asks for a ``TIERLINK_HOME`` of its own."""
    return FRESH_HOME in page.read_text()


def _block(page: str, line: int, lang: str, code: str,
           directive: re.Match[str] | None) -> Block | None:
    kind, args = (directive.group(1), directive.group(2)) if directive else ("", "")
    if kind == "not run":
        if not args:
            raise ValueError(f"{page}:{line}: a block not run must say why")
        return Block(page, line, lang, code, not_run=args)
    if lang not in RUN:
        return None
    options = dict(_option(part) for part in args.split(",") if part.strip())
    return Block(page, line, lang, code, background="background" in options,
                 ready=options.get("ready", ""), contains=options.get("contains", ""),
                 timeout_s=float(options.get("timeout", DEFAULT_TIMEOUT_S)))


def _option(part: str) -> tuple[str, str]:
    key, _, value = part.strip().partition("=")
    return key, value


def _ready(what: str, contains: str = "") -> bool:
    if not what.startswith("http://"):
        path = Path(what)
        return (path.is_file() and path.stat().st_size > 0
                and (not contains or contains in path.read_text(errors="replace")))
    try:
        with urllib.request.urlopen(what, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


class PageRun:
    """Runs one page's blocks in order; stops what it started in the background."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, block: Block) -> None:
        argv = (["bash", "-euo", "pipefail", "-c", block.code] if block.lang == "bash"
                else [sys.executable, "-c", block.code])
        if block.background:
            self._start(block, argv)
            return
        done = subprocess.run(argv, check=False, cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=block.timeout_s)
        assert done.returncode == 0, (f"{block.where} failed ({done.returncode}):\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")

    def _start(self, block: Block, argv: list[str]) -> None:
        if block.ready and not block.ready.startswith("http://"):
            Path(block.ready).unlink(missing_ok=True)  # a file left by an earlier run
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.background.append(proc)
        deadline = time.monotonic() + block.timeout_s
        while block.ready and not _ready(block.ready, block.contains):
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise AssertionError(f"{block.where} ended before it was ready:\n{err[-3000:]}")
            assert time.monotonic() < deadline, f"{block.where} not ready in {block.timeout_s} s"
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the background commands by their process group (their pid: we started them)
        as Ctrl-C would, and wait for them to release what they started; one that does not
        stop in time is killed and the page fails: its fleet would be left running."""
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        stuck = []
        for proc in self.background:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stuck.append(proc.args)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
        assert not stuck, f"did not stop on Ctrl-C within 60 s: {stuck}"
