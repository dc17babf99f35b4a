"""The demo page in a real headless browser: Debian's chromium driven by Playwright, against the real server.
Needs `apt-get install -y chromium` and `pip install playwright` (no `playwright install`: it uses the system
browser)."""

import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("DISTRINEWS_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(
        f"no browser at {CHROMIUM}: apt-get install -y chromium (or set DISTRINEWS_CHROMIUM)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")

from conftest import running_server  # noqa: E402   (after the skips above)

from distrinews.model import LABELS  # noqa: E402

pytestmark = pytest.mark.slow

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="module")
def url(checkpoint):
    with running_server(
        checkpoint, "--threads", "1", "--dtype", "fp32", "--max-text-chars", "120", "--log-level", "warning"
    ) as base:
        yield base


@pytest.fixture(scope="module")
def page(url):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.goto(url + "/")
        yield page
        browser.close()


def test_type_a_headline_and_see_the_label(page):
    page.fill("#text", "Oil prices climb as stocks slide on Wall Street")
    page.click("#go")
    page.wait_for_selector("#result:not([hidden])", timeout=30_000)
    assert page.text_content("#label") in LABELS
    rows = page.locator("#probs .row")
    assert rows.count() == 4
    assert [rows.nth(i).get_attribute("data-label") for i in range(4)] == LABELS
    shown = [float(rows.nth(i).locator(".p").text_content().rstrip("%")) for i in range(4)]
    assert abs(sum(shown) - 100) < 0.5
    assert page.errors == []


def test_example_button_and_model_line(page):
    page.click(".examples button >> nth=3")
    page.wait_for_function("document.querySelector('#text').value.includes('NASA')")
    page.wait_for_selector("#result:not([hidden])", timeout=30_000)
    assert page.text_content("#label") in LABELS
    page.wait_for_function("document.querySelector('#model').textContent.startsWith('model demo-untrained')")


def test_blank_input_and_length_limit(page):
    page.fill("#text", "   ")
    page.click("#go")
    page.wait_for_function("document.querySelector('#error').textContent.length > 0")
    assert "Type a headline first" in page.text_content("#error")
    page.wait_for_function("document.querySelector('#text').maxLength === 120")  # set from /health's limits
    page.fill("#text", "x" * 500)  # the browser itself keeps the text within the server's limit
    assert len(page.input_value("#text")) == 120
