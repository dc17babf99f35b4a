"""The course website: nbdev's docs pipeline runs offline on every notebook, and no relative link is broken.

`nbdev_docs` works in two stages: (1) nbdev *processes* every notebook of nbs/ into _proc/ (front matter, hidden cells
removed, and every cell that imports something or is exported is executed, to render the API docs), then (2) Quarto
renders _proc/ into the _docs/ website. These tests run both stages on a copy of the project in a temporary folder
(the working tree is never touched) and check every relative link:

- in the markdown of the processed notebooks, always (links to other pages, anchors to their headings, files);
- in the rendered HTML, when Quarto is installed (`quarto` on PATH or next to this Python); otherwise that test is
  skipped and says why.

The link checker itself is tested on small fake sites, so a broken link is known to be caught.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
NOTEBOOKS = sorted(p.name for p in NBS.glob("*.ipynb"))
PAGE_SUFFIXES = (".ipynb", ".qmd", ".md")


def find_quarto() -> str | None:
    "The quarto executable: on PATH, or installed next to this Python (pip install quarto-cli)."
    beside = Path(sys.executable).parent / "quarto"
    return shutil.which("quarto") or (str(beside) if beside.exists() else None)


# ---------------------------------------------------------------------------------------------------- the link checker
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}).*?^\1\2[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_MD_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_MD_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HTML_URL = re.compile(r"""<(?:a|img|link|script|source|iframe)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_EXPLICIT_ID = re.compile(r"\{#([^}\s]+)[^}]*\}\s*$")
_HTML_ID = re.compile(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)


def strip_code(md: str) -> str:
    "Markdown without fenced code blocks and code spans (links and headings inside code are not links or headings)."
    return _CODE_SPAN.sub("", _FENCE.sub("", md))


def pandoc_slug(heading: str) -> str:
    "The id Pandoc (hence Quarto) gives a heading: plain text, lower case, only letters/digits/_-., joined by '-'."
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    parts = re.split(r"(`+[^`]*`+)", text)  # code spans are taken verbatim...
    text = "".join(
        p.strip("`")
        if p.startswith("`")
        # ...elsewhere, drop HTML tags and emphasis
        else re.sub(r"(\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w))", "", re.sub(r"<[^>]+>", "", p))
        for p in parts
    )
    text = "".join(c for c in text.lower() if c.isalnum() or c in "_-." or c.isspace())
    text = "-".join(text.split())
    text = re.sub(r"^[^a-z\u00c0-\uffff]+", "", text)  # everything before the first letter goes
    return text or "section"


def markdown_cells(path: Path) -> list[str]:
    "The markdown of a page: the markdown cells of a notebook, or the whole of a .md/.qmd file."
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text(encoding="utf-8"))
        return [
            "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"]
            if c["cell_type"] == "markdown"
        ]
    return [path.read_text(encoding="utf-8")]


def page_anchors(path: Path) -> set[str]:
    "Every id a page defines: headings (Pandoc's ids, de-duplicated as Pandoc does), {#explicit} ids, HTML ids."
    ids, counts = set(), {}
    for md in markdown_cells(path):
        code_free = _FENCE.sub("", md)
        for m in _HEADING.finditer(code_free):
            explicit = _EXPLICIT_ID.search(m.group(2))
            if explicit:
                ids.add(explicit.group(1))
                continue
            slug = pandoc_slug(m.group(2))
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            ids.add(slug if n == 0 else f"{slug}-{n}")
        ids.update(_HTML_ID.findall(code_free))
    return ids


def markdown_links(path: Path) -> list[str]:
    "Every link target in a page's markdown (inline links, images, reference definitions, raw <a>/<img>)."
    links = []
    for md in markdown_cells(path):
        text = strip_code(md)
        links += _MD_LINK.findall(text) + _MD_REF_DEF.findall(text) + _HTML_URL.findall(text)
    return links


def _is_external(target: str) -> bool:
    return bool(urlsplit(target).scheme) or target.startswith("//")


def _as_page(site: Path, target: Path) -> Path | None:
    "The source page (or file) of the site that a relative target names, if it exists."
    if target.is_dir():
        target = target / "index.html"
    candidates = [target]
    if target.suffix in (".html", "") or target.suffix in PAGE_SUFFIXES:
        candidates += [target.with_suffix(s) for s in PAGE_SUFFIXES]
    for c in candidates:
        if c.is_file():
            return c
    return None


def check_markdown_links(site: Path, pages: list[Path] | None = None) -> list[str]:
    """Broken relative links in the markdown of `pages` (default: every page of `site`), as 'page: target (why)'.
    A link must stay inside the site, name an existing page or file, and an anchor must be an id of that page."""
    site = site.resolve()
    pages = pages or sorted(p for s in PAGE_SUFFIXES for p in site.glob(f"*{s}") if not p.name.startswith((".", "_")))
    broken, anchors = [], {}
    for page in pages:
        for target in markdown_links(page):
            if _is_external(target):
                continue
            where, _, anchor = unquote(target).partition("#")
            dest = page if not where else _as_page(site, (page.parent / where).resolve())
            if where and not (page.parent / where).resolve().is_relative_to(site):
                broken.append(f"{page.name}: {target} (outside the site: link to the repository's URL instead)")
                continue
            if dest is None:
                broken.append(f"{page.name}: {target} (no such page or file)")
                continue
            if anchor and dest.suffix in PAGE_SUFFIXES:
                if dest not in anchors:
                    anchors[dest] = page_anchors(dest)
                if anchor not in anchors[dest]:
                    broken.append(f"{page.name}: {target} (no heading or id '{anchor}' in {dest.name})")
    return broken


class _HTMLLinks(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "img", "link", "script", "source", "iframe"):
                self.links.append(a[key])


def _parse_html(path: Path) -> _HTMLLinks:
    p = _HTMLLinks()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


def check_html_links(site: Path) -> list[str]:
    "Broken relative links in every .html file of a rendered site: missing files, and anchors missing from their page."
    site = site.resolve()
    parsed = {p: _parse_html(p) for p in sorted(site.rglob("*.html"))}
    broken = []
    for page, info in parsed.items():
        for target in info.links:
            if _is_external(target) or target.startswith(("javascript:", "mailto:", "data:")):
                continue
            parts = urlsplit(target)
            where, anchor = unquote(parts.path), unquote(parts.fragment)
            dest = (page.parent / where).resolve() if where else page
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.is_relative_to(site) or not dest.exists():
                broken.append(f"{page.relative_to(site)}: {target} (no such file)")
                continue
            if anchor and dest.suffix == ".html" and anchor not in parsed.get(dest, _HTMLLinks()).ids:
                broken.append(f"{page.relative_to(site)}: {target} (no id '{anchor}' in {dest.name})")
    return broken


# --------------------------------------------------------------------------------- the checker catches broken links
def _notebook(path: Path, *markdown: str):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_slugs_follow_pandoc():
    assert pandoc_slug("Unused parameters") == "unused-parameters"
    assert pandoc_slug("A hang: uneven batch counts") == "a-hang-uneven-batch-counts"
    assert (
        pandoc_slug("`TORCH_DISTRIBUTED_DEBUG`: make DDP check itself")
        == "torch_distributed_debug-make-ddp-check-itself"
    )
    assert pandoc_slug("Saving the wrapper: the `module.` prefix") == "saving-the-wrapper-the-module.-prefix"
    assert (
        pandoc_slug("Saving a checkpoint: every rank vs rank 0 + barrier")
        == "saving-a-checkpoint-every-rank-vs-rank-0-barrier"
    )
    assert pandoc_slug("1. Why *distribute*?") == "why-distribute"
    assert pandoc_slug("2 × 3") == "section"
    assert pandoc_slug("The `__init__` file and *bold_text*") == "the-__init__-file-and-bold_text"


def test_markdown_checker_reports_broken_links(tmp_path):
    site = tmp_path / "nbs"
    site.mkdir()
    (tmp_path / "outside.md").write_text("# Outside\n")
    (site / "image.png").write_bytes(b"\x89PNG")
    _notebook(site / "b.ipynb", "# B\n\n> summary", "## Real heading\n\ntext", "## Real heading\n\nagain")
    _notebook(
        site / "a.ipynb",
        "# A",
        "Good: [b](b.ipynb), [b as html](b.html#real-heading), [the second one](b.ipynb#real-heading-1), "
        "![img](image.png), [web](https://example.com/x.ipynb), [mail](mailto:x@y.z), [here](#local)",
        "## Local\n\nBroken: [gone](missing.ipynb), [bad anchor](b.ipynb#no-such-heading), "
        "[escape](../outside.md), [bad local](#nowhere)\n\n[ref]: missing.md",
        "```python\nx = y[0](1)  # [not a link](nowhere.ipynb)\n```\n`[also not](nowhere.ipynb)`",
    )
    broken = check_markdown_links(site)
    assert sorted(b.split(" (")[0] for b in broken) == sorted(
        [
            "a.ipynb: missing.ipynb",
            "a.ipynb: b.ipynb#no-such-heading",
            "a.ipynb: ../outside.md",
            "a.ipynb: #nowhere",
            "a.ipynb: missing.md",
        ]
    ), broken


def test_html_checker_reports_broken_links(tmp_path):
    (tmp_path / "site_libs").mkdir()
    (tmp_path / "site_libs" / "app.js").write_text("")
    (tmp_path / "b.html").write_text('<html><body><section id="real"><h2>Real</h2></section></body></html>')
    (tmp_path / "index.html").write_text("<html></html>")
    (tmp_path / "a.html").write_text(
        '<html><head><script src="site_libs/app.js"></script><link href="https://cdn.example/x.css"></head><body>'
        '<a href="b.html#real">ok</a> <a href="./">home</a> <a href="#top" id="top">top</a>'
        '<a href="c.html">gone</a> <a href="b.html#nope">bad anchor</a> <img src="img/missing.png">'
        '<a href="../escape.html">out</a></body></html>'
    )
    broken = check_html_links(tmp_path)
    assert sorted(b.split(" (")[0] for b in broken) == sorted(
        ["a.html: c.html", "a.html: b.html#nope", "a.html: img/missing.png", "a.html: ../escape.html"]
    ), broken


# -------------------------------------------------------------------------------------------- the real course site
def _nbdev(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    "Run one of nbdev's command-line tools (the public interface) in `cwd`."
    tool = Path(sys.executable).parent / args[0]
    return subprocess.run([str(tool), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """A copy of the project processed by nbdev_docs' first stage (and rendered with Quarto, when installed): nbdev.yml
    and sidebar.yml refreshed from settings.ini, every notebook processed into _proc/ by nbdev's `proc_nbs`."""
    work = tmp_path_factory.mktemp("docs")
    shutil.copy2(ROOT / "settings.ini", work)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "_proc", "_docs", "runs", "__pycache__", "*.tmp")
    shutil.copytree(NBS, work / "nbs", ignore=ignore)
    shutil.copytree(ROOT / "distrinews", work / "distrinews", ignore=ignore)
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    refresh = [sys.executable, "-c", "from nbdev.quarto import refresh_quarto_yml; refresh_quarto_yml()"]
    steps = [subprocess.run(refresh, cwd=work, env=env, capture_output=True, text=True, timeout=120)]
    steps.append(_nbdev("nbdev_sidebar", cwd=work, env=env))
    # nbdev.serve.proc_nbs is nbdev_docs' processing stage; the `nbdev_proc_nbs` command would first try to install
    # Quarto, which needs the network
    process = [sys.executable, "-c", "from nbdev.serve import proc_nbs; proc_nbs(n_workers=1)"]
    steps.append(subprocess.run(process, cwd=work, env=env, capture_output=True, text=True, timeout=600))
    for step in steps:
        assert step.returncode == 0, f"{step.args}:\n{step.stdout[-2000:]}{step.stderr[-3000:]}"
    rendered, render_log = None, ""
    quarto = find_quarto()
    if quarto:
        r = subprocess.run(
            [quarto, "render", "--no-cache"], cwd=work / "_proc", env=env, capture_output=True, text=True, timeout=600
        )
        render_log = r.stdout[-3000:] + r.stderr[-3000:]
        if r.returncode == 0:
            rendered = work / "_proc" / "_docs"
    return dict(work=work, proc=work / "_proc", quarto=quarto, rendered=rendered, render_log=render_log)


def test_quarto_configuration():
    "_quarto.yml is a website that reads nbdev.yml and sidebar.yml; every navbar link names an existing notebook."
    q = yaml.safe_load((NBS / "_quarto.yml").read_text())
    assert q["project"]["type"] == "website"
    assert {"nbdev.yml", "sidebar.yml"} <= set(q["metadata-files"])
    assert (NBS / q["format"]["html"]["css"]).is_file()
    hrefs = [item["href"] for item in q["website"]["navbar"].get("left", []) if "href" in item]
    assert hrefs and all((NBS / h).is_file() for h in hrefs), hrefs
    n = yaml.safe_load((NBS / "nbdev.yml").read_text())
    assert n["project"]["output-dir"] == "_docs"


@pytest.mark.slow
@pytest.mark.slow_tier
def test_nbdev_yml_matches_settings(site):
    "nbdev regenerates nbdev.yml from settings.ini on every docs build: the committed copy must be what it writes."
    assert (site["work"] / "nbs" / "nbdev.yml").read_text() == (NBS / "nbdev.yml").read_text()


# Problems in notebooks whose fixes belong to their authors; each entry says what to change. A case listed here is an
# expected failure (and an unexpected pass once fixed: then delete its entry).
KNOWN_BROKEN_LINKS = {}


def _known(cases: dict) -> list:
    return [
        pytest.param(nb, marks=pytest.mark.xfail(reason=cases[nb], strict=False)) if nb in cases else nb
        for nb in NOTEBOOKS
    ]


@pytest.mark.slow
@pytest.mark.slow_tier
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_processes_for_docs(site, notebook):
    """nbdev executes every cell that imports something (the fixture fails when one of them needs a name another cell
    defines); each notebook becomes a page of the site without its hidden cells."""
    directive = re.compile(r"^#\s*\|.*$", re.M)

    def body(cell):
        return directive.sub("", "".join(cell["source"])).strip()

    source = json.loads((NBS / notebook).read_text())["cells"]
    page = {body(c) for c in json.loads((site["proc"] / notebook).read_text())["cells"]}
    hidden = [body(c) for c in source if re.search(r"^#\s*\|\s*hide\s*$", "".join(c["source"]), re.M)]
    assert page, f"{notebook}: the processed page is empty"
    shown = [h[:60] for h in hidden if h and h in page]
    assert not shown, f"{notebook}: hidden cells are on the page: {shown}"


@pytest.mark.slow
@pytest.mark.slow_tier
@pytest.mark.parametrize("notebook", _known(KNOWN_BROKEN_LINKS))
def test_notebook_links(site, notebook):
    "Every relative link in the notebook's markdown names an existing page of the site (and an existing heading)."
    broken = check_markdown_links(site["proc"], [site["proc"] / notebook])
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.slow
@pytest.mark.slow_tier
def test_rendered_site_links(site):
    "The website Quarto renders from the processed notebooks has no broken relative link."
    if not site["quarto"]:
        pytest.skip(
            "Quarto is not installed, so the HTML site cannot be rendered here (the markdown links are still "
            "checked above). Install it from quarto.org, or `pip install quarto-cli` where GitHub is reachable."
        )
    assert site["rendered"] is not None, "quarto render failed:\n" + site["render_log"]
    pages = list(site["rendered"].glob("*.html"))
    assert {Path(nb).stem for nb in NOTEBOOKS} <= {p.stem for p in pages}, sorted(p.name for p in pages)
    broken = check_html_links(site["rendered"])
    assert not broken, "broken links:\n" + "\n".join(broken[:50])
