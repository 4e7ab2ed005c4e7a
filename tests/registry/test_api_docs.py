"""The API's docs (/docs) are served by the registry itself, under the dashboard pages'
policy: nothing loads from another origin. (FastAPI's own /docs loads Swagger UI from a
CDN, under no policy; create_app turns it off: FastAPI(docs_url=None, redoc_url=None).)"""

from __future__ import annotations

import re

from fleetbench.registry.web.pages import CONTENT_SECURITY_POLICY, SWAGGER_UI_FILES
from tests.factories import LiveRegistry

# What a source in a policy may be without naming another origin.
SAME_ORIGIN_SOURCES = {"'self'", "'none'", "'unsafe-inline'", "data:", "blob:"}


def test_the_docs_page_loads_only_this_registrys_files_under_the_pages_policy(
    live_registry: LiveRegistry,
) -> None:
    with live_registry.client() as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        policy = page.headers["content-security-policy"]
        assert policy == CONTENT_SECURITY_POLICY
        sources = {word for directive in policy.split(";") for word in directive.split()[1:]}
        assert sources <= SAME_ORIGIN_SOURCES
        loaded = re.findall(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"([^\"]*)\"", page.text)
        assert "<script>" not in page.text  # the policy forbids inline scripts
        fetched = [url for url in loaded if not url.startswith("data:")]
        assert sorted(fetched) == sorted(
            ["/static/style.css", "/static/docs.js"]
            + [f"/docs/swagger-ui/{name}" for name in SWAGGER_UI_FILES]
        )
        for url in fetched:
            answer = client.get(url)
            assert answer.status_code == 200, url
            kind = "javascript" if url.endswith(".js") else "css"
            assert answer.headers["content-type"] == f"text/{kind}; charset=utf-8", url
            assert answer.headers["x-content-type-options"] == "nosniff"
        bundle = client.get("/docs/swagger-ui/swagger-ui-bundle.js").content
        assert b"SwaggerUIBundle" in bundle[:2000] and len(bundle) > 500_000
        # FastAPI's CDN pages are gone, and the docs' routes stay out of the schema
        assert client.get("/redoc").status_code == 404
        assert client.get("/docs/oauth2-redirect").status_code == 404
        assert client.get("/docs/swagger-ui/swagger-ui.js").status_code == 404
        assert client.get("/docs/swagger-ui/..%2F__init__.py").status_code == 404
        paths = client.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith("/docs")]
