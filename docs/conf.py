"""Sphinx configuration of the documentation site (``scripts/docs build``).

Why Sphinx + MyST rather than MkDocs: the pages in docs/ are GitHub-flavoured
Markdown and must stay readable on GitHub. MyST parses them with markdown-it
(CommonMark, the parser family GitHub uses), so lists, tables and code blocks
render the same here and there, and ``[text](other.md#heading)`` links resolve
with GitHub's heading slugs. The docstrings of the package are reST with Sphinx
roles (``:class:`Lock```, ``:param ttl:``): autodoc renders them as written, and
nitpicky mode turns every unresolvable reference into an error. It is also what
Django, Celery, redis-py and most Django apps publish their docs with.

The navigation lives here (``NAV``), not in index.md, so that index.md stays a
plain page on GitHub: a hidden toctree is appended to the landing page when
Sphinx reads it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

# autodoc imports the package, which needs configured Django settings (the
# models, the admin); nothing connects to Redis.
import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.messages",
        "django.contrib.sessions",
        "django_redislock",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()

import django_redislock  # noqa: E402

project = "django-redislock"
author = "django-redislock developers"
copyright = "django-redislock developers"
release = version = django_redislock.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_rtd_theme",
]

root_doc = "index"
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "images/benchmarks/README.md"]

# A newcomer's path through the docs: (caption, [page, ...]). Pages another
# change adds later are listed too and only included once the file exists.
NAV: list[tuple[str, list[str]]] = [
    ("Getting started", ["overview", "quickstart", "locks", "views", "celery"]),
    (
        "Guides",
        [
            "primitives",
            "shaping",
            "fencing",
            "one-process",
            "admin",
            "metrics",
            "settings",
            "testing",
            "without-django",
        ],
    ),
    ("Running it", ["topology", "cluster", "redlock", "failures", "benchmarks"]),
    ("Reference", ["api", "architecture", "development", "changelog"]),
    (
        "Migrating",
        [
            "migrating-from-celery-once",
            "migrating-from-celery-singleton",
            "redis-py-migration",
        ],
    ),
]


# Pages that show a file from outside docs/ on the site; on GitHub the .md in
# docs/ is a one-line pointer to the file itself.
INCLUDED = {"overview": "README.md", "changelog": "CHANGELOG.md"}
_PAGE_OF = {f"../{path}": f"{page}.md" for page, path in INCLUDED.items()}
_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")


def _site_link(match: re.Match[str], base: str) -> str:
    """Rewrite one Markdown link written for GitHub so that it works on the site.

    *base* is the link's directory relative to docs/ ("" for docs/ pages, "../"
    for the README and CHANGELOG shown on the site). Links to other docs pages
    stay; links to the README/CHANGELOG go to their site pages; links to any
    other repository file outside docs/ become the path in code (the site has no
    copy of it).
    """
    bang, text, target = match.groups()
    if bang or "://" in target or target.startswith(("#", "mailto:")):
        return match.group(0)
    path, hash_, anchor = target.partition("#")
    if not path:
        return match.group(0)
    # Relative to docs/ ("../docs/locks.md" from the README is "locks.md").
    resolved = os.path.relpath(os.path.normpath(HERE / base / path), HERE)
    if not resolved.startswith(".."):
        return f"[{text}]({resolved}{hash_}{anchor})"
    page = _PAGE_OF.get(resolved)
    if page is not None:
        return f"[{text}]({page}{hash_}{anchor})"
    shown = os.path.relpath(HERE / base / path, ROOT) + ("/" if path.endswith("/") else "")
    if text.strip("`") == shown:
        return f"`{shown}`"
    return f"{text} (`{shown}`)"


#: Navigation titles where the page's own heading does not fit the menu.
TITLES = {"overview": "Overview"}


def _toctrees() -> str:
    blocks = []
    for caption, pages in NAV:
        present = [p for p in pages if (HERE / f"{p}.md").exists()]
        if present:
            lines = "\n".join(f"{TITLES[p]} <{p}>" if p in TITLES else p for p in present)
            blocks.append(f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{lines}\n```\n")
    return "".join(blocks)


def _read_source(app: Any, docname: str, source: list[str]) -> None:
    base = ""
    if docname in INCLUDED:
        base = "../"
        source[0] = (ROOT / INCLUDED[docname]).read_text(encoding="utf-8")
    source[0] = _LINK.sub(lambda m: _site_link(m, base), source[0])
    if docname == root_doc:
        source[0] += _toctrees()


def _resolve_short_name(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve ``:class:`HolderInfo``` and the like by the name's last parts.

    Docstrings name classes of their own module briefly, but the API reference
    documents public classes under ``django_redislock.<Name>``, so the module a
    docstring is read in is not always the one its short names live in. Retried
    as a "specific" reference (the target may be any documented name ending in
    it); a name documented nowhere still fails the build.
    """
    if node.get("refdomain") != "py" or node.get("refspecific"):
        return None
    node["refspecific"] = True
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], node["reftarget"], node, contnode
    )


def setup(app: Any) -> None:
    app.connect("source-read", _read_source)
    app.connect("missing-reference", _resolve_short_name)


# --- Markdown (MyST) ---------------------------------------------------------
myst_heading_anchors = 6  # GitHub's slugs for [text](page.md#heading) links
myst_enable_extensions = ["colon_fence"]
suppress_warnings: list[str] = []

# --- API reference (autodoc) -------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"show-inheritance": True}

# Every reference must resolve (strict build: -W -n). Names from other
# projects cannot be linked without intersphinx, which would need the network;
# they are rendered as code.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(redis|celery|django|kombu|asyncio|collections|datetime|types|typing)\..*"),
    # Docstrings point maintainers at private modules (engine/, guard, ...): no
    # page documents those, the name is shown as code.
    (r"py:mod", r"django_redislock\..*"),
    # Private names (a leading underscore), e.g. a private base class.
    (r"py:.*", r"django_redislock\.(.*\.)?_[A-Za-z].*"),
]
# Private names in public signatures: the backend classes of LockManager.backend,
# the manager protocol of Lock(manager=...) and GuardedRedis's source, single_instance's TypeVar.
nitpick_ignore = [
    ("py:class", "django_redislock.engine.backends.single.SingleBackend"),
    ("py:class", "django_redislock.engine.backends.cluster.ClusterBackend"),
    ("py:class", "django_redislock.engine.backends.redlock.RedlockBackend"),
    ("py:class", "HasSource"),
    # GuardedRedis(source=...): a manager's BackendSource, as for HasSource.
    ("py:class", "Source"),
    ("py:class", "F"),
]

# --- HTML --------------------------------------------------------------------
html_theme = "sphinx_rtd_theme"
html_title = f"django-redislock {release}"
html_theme_options = {"navigation_depth": 3, "collapse_navigation": False}
html_show_sourcelink = False
html_copy_source = False
