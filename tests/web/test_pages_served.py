"""The dashboard's routes without a browser: pages, assets, plotly.js and packaging."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from fleetbench.registry.web.pages import CONTENT_SECURITY_POLICY, STATIC_DIR, plotly_js_path
from tests.factories import LiveRegistry

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("path", "page"),
    [
        ("/", "index.html"),
        ("/placement", "placement.html"),
        ("/capacity", "capacity.html"),
        ("/compare", "compare.html"),
        ("/regressions", "regressions.html"),
        ("/plans", "plans.html"),
        ("/series?node=a&model=b&pp=1&tg=1&b=1", "series.html"),
        ("/curves?node=a&model=b", "curves.html"),
        ("/nodes/gpu-07", "curves.html"),
        ("/nodes/gpu-07/models/Llama-3.1-8B-Q4_K_M", "curves.html"),
    ],
)
def test_pages_are_served_with_a_strict_policy(
    live_registry: LiveRegistry, path: str, page: str
) -> None:
    with live_registry.client() as client:
        response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY  # no inline or remote scripts
    assert response.text == (STATIC_DIR / page).read_text()


def test_plotly_is_served_from_the_installed_package(live_registry: LiveRegistry) -> None:
    path = plotly_js_path()
    assert path is not None
    assert path.parts[-3:] == ("plotly", "package_data", "plotly.min.js")
    with live_registry.client() as client:
        response = client.get("/static/plotly.min.js")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/javascript; charset=utf-8"
    assert response.content == path.read_bytes()
    assert b"plotly.js v" in response.content[:200]


def test_only_the_dashboard_assets_are_served(live_registry: LiveRegistry) -> None:
    with live_registry.client() as client:
        script = client.get("/static/common.js")
        assert script.status_code == 200
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
        for name in ("pages.py", "index.html", "missing.js", "..%2Fpages.py", ".hidden.js"):
            assert client.get(f"/static/{name}").status_code == 404, name
        assert client.get("/static/../web/pages.py").status_code == 404
        # The pages stay out of the API's schema.
        paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths
    assert not [p for p in paths if p.startswith(("/static", "/placement", "/series"))]


def test_every_page_loads_its_own_script_and_only_existing_assets() -> None:
    for page in STATIC_DIR.glob("*.html"):
        html = page.read_text()
        assets = re.findall(r'(?:src|href)="/static/([^"]+)"', html)
        assert "style.css" in assets, page.name
        assert [a for a in assets if a.endswith(".js") and a != "plotly.min.js"], page.name
        for asset in assets:
            assert asset == "plotly.min.js" or (STATIC_DIR / asset).is_file(), (page.name, asset)
        assert "<script>" not in html  # the policy forbids inline scripts
        assert "http://" not in html and "https://" not in html  # no CDN


def test_the_web_files_ship_in_the_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["fleetbench.registry"]
    files = [p.relative_to(STATIC_DIR.parent.parent).as_posix() for p in STATIC_DIR.iterdir()]
    assert len(files) >= 12
    for name in files:
        assert any(fnmatch(name, pattern) for pattern in patterns), name
