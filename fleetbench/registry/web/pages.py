"""The dashboard's routes: static HTML pages, their scripts and styles, plotly.js from the
`plotly` package's own copy, and the API's docs (/docs: Swagger UI from the
`fastapi-offline` package's copy); no CDN, every page under one policy. Every page fetches
its data from `/v1` (the docs, /openapi.json) in the browser, so these routes read no
database and need no token."""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse

__all__ = ["STATIC_DIR", "SWAGGER_UI_FILES", "plotly_js_path", "router", "swagger_ui_path"]

STATIC_DIR = Path(__file__).parent / "static"

# Scripts only from this origin; plotly sets inline styles and draws with data: images.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
_ASSET = re.compile(r"^[a-z][a-z0-9-]*\.(js|css)$")
_MEDIA_TYPES = {"js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8"}

# Swagger UI's files the docs page loads (fastapi-offline ships them in its static/)
SWAGGER_UI_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")
_PACKAGED_ASSET_HEADERS = {
    "Cache-Control": "public, max-age=86400",
    "X-Content-Type-Options": "nosniff",
}

router = APIRouter(include_in_schema=False)


def _packaged_file(package: str, *path: str) -> Path | None:
    """A file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location).joinpath(*path)
        if candidate.is_file():
            return candidate
    return None


@cache
def plotly_js_path() -> Path | None:
    """plotly.min.js inside the installed `plotly` package."""
    return _packaged_file("plotly", "package_data", "plotly.min.js")


@cache
def swagger_ui_path(name: str) -> Path | None:
    """One of SWAGGER_UI_FILES inside the installed `fastapi-offline` package."""
    return _packaged_file("fastapi_offline", "static", name)


def _packaged_asset(path: Path | None, name: str, package: str) -> FileResponse:
    if path is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"{name} not found: install `{package}`"
        )
    media_type = _MEDIA_TYPES[path.suffix.removeprefix(".")]
    return FileResponse(path, media_type=media_type, headers=_PACKAGED_ASSET_HEADERS)


def _page(name: str) -> FileResponse:
    return FileResponse(
        STATIC_DIR / name, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS
    )


@router.get("/")
def overview() -> FileResponse:
    """The fleet: every node with its hardware, engine build, last run and health."""
    return _page("index.html")


@router.get("/curves")
@router.get("/nodes/{node}")
@router.get("/nodes/{node}/models/{model:path}")
def curves_page() -> FileResponse:
    """A node and the models it has run, or its batching curves of one model (one line per
    llama.cpp build): addressed by path or by ?node=&model=; the page reads which."""
    return _page("curves.html")


@router.get("/placement")
def placement_page() -> FileResponse:
    """The placement question as a form; the answer as a table and a chart."""
    return _page("placement.html")


@router.get("/capacity")
def capacity_page() -> FileResponse:
    """The capacity question as a form; the plan as a table and a chart."""
    return _page("capacity.html")


@router.get("/compare")
def compare_page() -> FileResponse:
    """Two builds compared across the fleet: the verdict, each node's ratio per B."""
    return _page("compare.html")


@router.get("/regressions")
def regressions_page() -> FileResponse:
    """Regressions (and improvements) the registry has detected."""
    return _page("regressions.html")


@router.get("/plans")
def plans_page() -> FileResponse:
    """The sweep plans, and which nodes run or skip each."""
    return _page("plans.html")


@router.get("/series")
def series_page() -> FileResponse:
    """One series' timeline with build changes marked."""
    return _page("series.html")


@router.get("/docs")
def api_docs_page() -> FileResponse:
    """The API's interactive docs: Swagger UI drawing /openapi.json (FastAPI's own /docs
    loads it from a CDN, under no policy)."""
    return _page("docs.html")


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return _packaged_asset(plotly_js_path(), "plotly.min.js", "plotly")


@router.get("/docs/swagger-ui/{name}")
def swagger_ui(name: str) -> FileResponse:
    if name not in SWAGGER_UI_FILES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no asset {name!r}")
    return _packaged_asset(swagger_ui_path(name), name, "fastapi-offline")


@router.get("/static/{name}")
def asset(name: str) -> FileResponse:
    """The dashboard's own scripts and styles (names checked: no other file is served)."""
    found = _ASSET.match(name)
    path = STATIC_DIR / name
    if found is None or not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no asset {name!r}")
    return FileResponse(
        path,
        media_type=_MEDIA_TYPES[found.group(1)],
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
