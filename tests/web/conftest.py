"""The dashboard in a real headless browser: Debian's Chromium driven by Playwright (no
browser download; scripts/test.sh installs the `chromium` package when it is missing).
One browser for the whole session, a fresh context (cookies, storage) for each test.

Every test gets a `dashboard` on a live registry (SQLite only: the API is tested on both
databases elsewhere); console errors and uncaught exceptions fail the test, and a
screenshot of the last page is saved under $FLEETBENCH_TEST_ARTIFACTS (default
test-artifacts/ in the repository root)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, sync_playwright

from fleetbench.contract import wire
from tests.factories import LiveRegistry, make_report, post_report

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(
    os.environ.get("FLEETBENCH_TEST_ARTIFACTS")
    or Path(__file__).resolve().parents[2] / "test-artifacts"
)
TIMEOUT_MS = 15_000
TIMES, MINUS = "\u00d7", "\u2212"  # the signs the pages print in titles and changes


@pytest.fixture
def empty_database_url(tmp_path: Path) -> str:
    """Browser tests run on SQLite only: the API is tested on both databases elsewhere."""
    return f"sqlite:///{tmp_path / 'registry.db'}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium, for one test module: Playwright's sync API keeps an event loop running in
    the thread until it stops, and the test modules a worker runs after this one call
    asyncio.run (the serving load generator, webhooks)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Dashboard:
    """A browser page on a live registry that records what went wrong in it."""

    def __init__(self, page: Page, registry: LiveRegistry) -> None:
        self.page = page
        self.registry = registry
        self.url = registry.url
        self.errors: list[str] = []
        self.allowed: list[re.Pattern[str]] = []
        self.api_requests: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        page.on("request", self._request)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not any(
            pattern.search(message.text) for pattern in self.allowed
        ):
            self.errors.append(f"console.{message.type}: {message.text}")

    def _request(self, request: Request) -> None:
        path = request.url.removeprefix(self.url)
        if path.startswith("/v1/"):
            self.api_requests.append(path)

    def allow_console(self, pattern: str) -> None:
        """A console message this test expects (the browser logs failed fetches)."""
        self.allowed.append(re.compile(pattern))

    def open(self, path: str, state: str = "ready") -> Page:
        """Load a page and wait until its script says it is drawn (body[data-state])."""
        self.page.goto(self.url + path)
        self.wait(state)
        return self.page

    def wait(self, state: str = "ready") -> None:
        self.page.wait_for_selector(f"body[data-state='{state}']", timeout=TIMEOUT_MS)

    def table(self, selector: str) -> list[list[str]]:
        """The visible rows of a table, as the user reads them."""
        rows: list[list[str]] = self.page.eval_on_selector_all(
            f"{selector} tbody tr:not([hidden])",
            "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))",
        )
        return rows

    def trace_points(self, chart_id: str) -> dict[str, int]:
        """Each plotly trace's name and its number of points, read back from the chart."""
        return {trace["name"]: len(trace["x"]) for trace in self.chart(chart_id)["data"]}

    def chart(self, chart_id: str) -> dict[str, Any]:
        """The chart's data and layout as plotly holds them."""
        chart: dict[str, Any] = self.page.evaluate(
            "id => { const g = document.getElementById(id);"
            " return {data: g.data, layout: g.layout}; }",
            chart_id,
        )
        return chart

    def assert_clean(self) -> None:
        assert self.errors == [], "\n".join(self.errors)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def dashboard(
    browser: Browser, live_registry: LiveRegistry, request: pytest.FixtureRequest
) -> Iterator[Dashboard]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    board = Dashboard(page, live_registry)
    try:
        yield board
    finally:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
        try:
            board.screenshot(name)
        finally:
            context.close()
    board.assert_clean()


class Fleet:
    """Reports runs to the live registry, one token per node."""

    def __init__(self, registry: LiveRegistry) -> None:
        self.registry = registry
        self._tokens: dict[str, str] = {}

    def node(self, name: str, **labels: str) -> str:
        if name not in self._tokens:
            self._tokens[name] = self.registry.token(name, **labels)
        return self._tokens[name]

    def report(self, node: str = "m4pro", **fields: Any) -> wire.RunReport:
        """Post make_report's report for the node; 201 expected."""
        report = make_report(node=node, **fields)
        with self.registry.client(self.node(node)) as client:
            response = post_report(client, report)
        assert response.status_code == 201, response.text
        return report

    def get(self, path: str, **params: Any) -> Any:
        with self.registry.client() as client:
            response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def fleet(live_registry: LiveRegistry) -> Fleet:
    return Fleet(live_registry)


def hours_ago(hours: float) -> datetime:
    return datetime.now(UTC) - timedelta(hours=hours)


def apple_m4_pro() -> wire.HardwareFingerprint:
    return wire.HardwareFingerprint(
        hash="m4pro-fingerprint-0001",
        data={"probes": {"apple": {"chip": "Apple M4 Pro", "memory_bytes": 24 * 2**30}}},
    )
