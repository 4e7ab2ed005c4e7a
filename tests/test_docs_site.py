"""The documentation site (mkdocs.yml over docs/) builds in strict mode, and strict mode is what
catches a broken cross-reference: the pages were one README once and still point at each
other's sections, so a renamed heading or a moved page must fail here rather than leave a
dead link on the site. The site has a page for every file of docs/, the index links to each,
and no page fetches anything from another host (fonts, a CDN)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # material's banner, not a warning
    )


def _url(page: Path) -> str:
    """Where mkdocs puts a page (directory URLs): design/layout.md -> design/layout/."""
    stem = page.with_suffix("").as_posix()
    return "" if stem == "index" else stem.removesuffix("/index") + "/"


class _ContentLinks(HTMLParser):
    """The hrefs inside the page's article (not the navigation, which lists every page)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if self.depth:
            self.depth += tag == "article"
        elif tag == "article" and "md-content__inner" in classes:
            self.depth = 1
        if self.depth and tag == "a":
            self.hrefs.append(dict(attrs).get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag == "article":
            self.depth -= 1


def test_the_site_builds_strict_with_a_page_for_each_doc_and_the_index_links_them(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    built = _build(ROOT, site)
    assert built.returncode == 0, built.stderr + built.stdout

    pages = sorted(p.relative_to(DOCS) for p in DOCS.rglob("*.md"))
    assert len(pages) >= 11, pages
    for page in pages:
        assert (site / _url(page) / "index.html").is_file(), f"no page built for docs/{page}"

    links = _ContentLinks()
    links.feed((site / "index.html").read_text())
    linked = {href.split("#")[0] for href in links.hrefs}
    missing = [str(p) for p in pages if _url(p) and _url(p) not in linked]
    assert not missing, f"docs/index.md does not link to {missing} (it links {sorted(linked)})"

    # theme.font: false and no CDN: nothing a page loads comes from another host.
    for html in site.rglob("*.html"):
        text = html.read_text()
        assert "fonts.googleapis.com" not in text, html
        remote = re.findall(r'<(?:script|link|img)\b[^>]*(?:src|href)="(?:https?:)?//[^"]*"', text)
        assert not remote, (html, remote)


def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(DOCS, project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    with (project / "docs" / "install.md").open("a") as page:
        page.write("\n[x](nope.md) and [y](registry.md#no-such-section)\n")

    built = _build(project, tmp_path / "site")
    output = built.stderr + built.stdout
    assert built.returncode != 0, output
    assert "'nope.md'" in output, output
    assert "#no-such-section" in output, output
