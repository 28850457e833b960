"""Sphinx configuration of pgstreams' documentation site: Markdown pages (MyST), the Python API
from the docstrings (autodoc), and the settings, checks, metrics and management commands from
their declarations in the code (``_ext/reference.py``). Build it with
``sphinx-build -W -b html docs docs/_build/html``; CI does, with warnings as errors."""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).parent / "_ext")]

# Enough of a project to import pgstreams' modules; the build never connects to a database.
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "pgstreams"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}},
    USE_TZ=True,
)
django.setup()

import pgstreams  # noqa: E402  (after django.setup(): the API's modules load models)

project = "pgstreams"
author = "the pgstreams authors"
release = version = pgstreams.__version__
copyright = "2026, the pgstreams authors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "reference"]
myst_enable_extensions = ["deflist"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "notes", "bench", "screenshots/*.md"]
suppress_warnings = ["myst.header"]  # pages start at their own level (a page's first heading is its title)

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"pgstreams {release}"
html_static_path: list[str] = []
