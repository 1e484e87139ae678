"""The documentation site: it builds with ``--strict`` (every internal link and anchor
resolves, every page is in the navigation, the generated references and the Python API
render), a newcomer's four questions are answered one click from the home page, and the
built site loads in Chromium with the network cut off (no web font, no CDN script)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
# A newcomer's questions and the page that answers each (reached from the home page).
QUESTIONS = {"where a request's placement is decided": "explanation/placement/",
             "how to write and register a placement policy": "how-to/custom-policy/",
             "how to bring a model of one's own": "tutorials/own-model/",
             "how a request travels from device to cloud": "explanation/life-of-a-request/"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          check=False, cwd=ROOT, env={**os.environ, **QUIET},
                          capture_output=True,
                          text=True, timeout=300)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert done.returncode == 0, "\n".join(warnings) or done.stderr[-3000:]
    return out


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$|^\s*-\s*([\w/.-]+\.md)\s*$",
                     (ROOT / "mkdocs.yml").read_text(), flags=re.MULTILINE)
    pages = [a or b for a, b in nav]
    assert len(pages) > 30
    for page in pages:
        built = site / (page[:-3] + "/index.html" if not page.endswith("index.md")
                        else page[:-3] + ".html")
        assert built.is_file(), f"{page} was not built"


def test_each_question_is_answered_one_click_from_home(site: Path) -> None:
    home = (site / "index.html").read_text()
    for question, page in QUESTIONS.items():
        assert f'href="{page}"' in home, f"the home page does not link {page} ({question})"
        assert (site / page / "index.html").is_file()


def test_the_reference_is_generated_not_kept(site: Path) -> None:
    assert not (ROOT / "docs" / "reference" / "cli.md").exists()  # made at build time only
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "tierlink demo" in cli and "Generated from the code" in cli


@pytest.fixture
def offline_page() -> Iterator[tuple[Any, list[str]]]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(chromium).is_file(), "headless Chromium is needed: apt-get install chromium"
    asked: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            context = browser.new_context(offline=True)

            def refuse(route: Any) -> None:
                if not route.request.url.startswith("file://"):
                    asked.append(route.request.url)
                    route.abort()
                else:
                    route.continue_()

            context.route("**/*", refuse)
            yield context.new_page(), asked
        finally:
            browser.close()


def test_the_built_site_needs_no_network(site: Path,
                                         offline_page: tuple[Any, list[str]]) -> None:
    page, asked = offline_page
    for path in ("index.html", "explanation/placement/index.html",
                 "reference/python-api/index.html"):
        page.goto((site / path).as_uri(), wait_until="load")
        assert page.title().endswith("tierlink")
        assert page.locator("nav").count() > 0
    assert asked == [], f"the site asked the network for {asked}"
