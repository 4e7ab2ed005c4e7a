"""The API's docs in Chromium: Swagger UI, from the registry's own copy, draws every
operation of the schema under the pages' policy (a violation is a console error, which
fails the test), and the browser asks nothing of another origin."""

from __future__ import annotations

from playwright.sync_api import Request

from tests.web.conftest import Dashboard


def test_swagger_ui_draws_every_operation_from_this_origin_alone(dashboard: Dashboard) -> None:
    requested: list[str] = []

    def note(request: Request) -> None:
        requested.append(request.url)

    dashboard.page.on("request", note)
    with dashboard.registry.client() as client:
        schema = client.get("/openapi.json").json()
    operations = {
        (method.upper(), path)
        for path, methods in schema["paths"].items()
        for method in methods
        if method in {"get", "put", "post", "delete", "patch"}
    }
    page = dashboard.open("/docs")
    page.wait_for_selector(".opblock")
    drawn = page.eval_on_selector_all(
        ".opblock",
        "blocks => blocks.map(b => [b.querySelector('.opblock-summary-method').textContent,"
        " b.querySelector('.opblock-summary-path').dataset.path])",
    )
    assert len(operations) > 30
    assert {(method, path) for method, path in drawn} == operations
    assert (
        page.locator(".information-container .title").inner_text().startswith("fleetbench registry")
    )
    assert dashboard.url + "/openapi.json" in requested
    elsewhere = [url for url in requested if not url.startswith(dashboard.url + "/")]
    assert elsewhere == []
