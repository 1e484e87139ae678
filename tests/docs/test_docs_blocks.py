"""Every shell and Python block of the tutorials and how-to guides runs, in order, as a
reader would run it (``doc_blocks``: background commands stopped by their pid, commands
aimed at a user's own infrastructure shown as text with the reason, and counted).

The pages with a ``TIERLINK_HOME`` of their own (``test-page: fresh-home``: their own models,
their own ``/tmp`` directories, free ports) share nothing with the others: they run in a
second lane, one after another, beside the rest; their tests, last in the order, collect
what they did."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from doc_blocks import ROOT, RUN, PageRun, blocks, fresh_home

pytestmark = pytest.mark.integration

# The tutorials and guides with blocks to run (every one of them: see the test below).
RUNNABLE = ["docs/tutorials/first-fleet.md",
            "docs/how-to/custom-policy.md", "docs/how-to/models.md", "docs/how-to/simulate.md",
            "docs/tutorials/chat.md", "docs/tutorials/demo.md", "docs/how-to/tracing.md",
            "docs/how-to/monitoring.md", "docs/how-to/control-plane-etcd.md",
            "docs/how-to/many-machines.md", "docs/how-to/fleet-operations.md",
            "docs/how-to/retrain.md", "docs/how-to/shadow-and-promote.md",
            "docs/how-to/add-a-runtime.md",
            "docs/how-to/add-an-output-kind.md", "docs/tutorials/own-model.md",
            "docs/how-to/python-model.md"]
PAGES = sorted(p for d in ("tutorials", "how-to") for p in (ROOT / "docs" / d).glob("*.md"))


def _env(home: Path | None) -> dict[str, str]:
    venv = str(ROOT / ".venv" / "bin")
    return {**os.environ, "PATH": f"{venv}:{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1", **({"TIERLINK_HOME": str(home)} if home else {})}


def _run_page(page: str, home: Path | None) -> None:
    found = blocks(ROOT / page)
    runs = [b for b in found if not b.not_run]
    assert runs, f"{page} has no block to run"
    assert all(b.lang in RUN for b in runs)
    run = PageRun(_env(home))
    try:
        for block in runs:
            run.run(block)
    finally:
        run.stop()


@pytest.fixture(scope="module")
def side_lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[None]]]:
    """The fresh-home pages, started at once in a lane of their own (see the module)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="docs-side-lane")
    try:
        yield {page: pool.submit(_run_page, page, tmp_path_factory.mktemp("page") / "home")
               for page in RUNNABLE if fresh_home(ROOT / page)}
    finally:
        pool.shutdown(wait=True)


@pytest.mark.parametrize("page", RUNNABLE)
def test_every_block_of_the_page_runs(page: str, side_lane: dict[str, Future[None]]) -> None:
    if page in side_lane:
        side_lane[page].result()  # its own lane ran it: its failure is raised here
        return
    _run_page(page, None)


def test_blocks_not_run_say_why_and_are_counted() -> None:
    found = [b for page in RUNNABLE for b in blocks(ROOT / page)]  # a reason is required
    shown = [b for b in found if b.not_run]
    print(f"{len(found) - len(shown)} blocks run, {len(shown)} shown and not run "
          f"({'; '.join(b.not_run for b in shown)})")
    assert len(found) > len(shown)


def test_the_directives_parse(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- test: background, ready=/tmp/r, contains=up, timeout=5 -->\n```bash\n"
                    "sleep 1\n```\n<!-- not run: your own collector -->\n```text\n"
                    "curl http://collector:4318\n```\n```yaml\na: 1\n```\n"
                    "```python\nprint(1)\n```\n")
    assert [(b.lang, b.background, b.ready, b.contains, b.timeout_s, b.not_run)
            for b in blocks(page)] == [
        ("bash", True, "/tmp/r", "up", 5.0, ""), ("text", False, "", "", 300.0,
                                                   "your own collector"),
        ("python", False, "", "", 300.0, "")]
    page.write_text("<!-- not run: -->\n```text\nx\n```\n")
    with pytest.raises(ValueError, match="must say why"):
        blocks(page)


def test_every_tutorial_and_guide_with_blocks_runs() -> None:
    """A new page's blocks are run too: it cannot be left out of RUNNABLE."""
    with_blocks = {str(p.relative_to(ROOT)) for p in PAGES
                   if any(not b.not_run for b in blocks(p))}
    assert with_blocks <= set(RUNNABLE), sorted(with_blocks - set(RUNNABLE))

