"""Sphinx configuration of the user documentation (build: ``python -m sphinx -W -b html docs
OUT``; needs the ``docs`` extra)."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the packages, from a checkout without pip install -e
sys.path.insert(0, str(DOCS / "_ext"))

project = "popart_backend and poptorch_lite"
author = "the popart_backend developers"
copyright = "the popart_backend developers"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "popsim_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_inherit_docstrings = True
# Docstrings are written for the code's readers; names they mention that are not documented
# here stay plain text.
nitpicky = False

html_theme = "furo"
html_title = "popart_backend and poptorch_lite"
html_static_path: list[str] = []
# A docstring's bare ``type`` matches the ``type`` attribute of several classes; the ambiguity
# is harmless (the first match is used), so it is not a warning.
suppress_warnings = ["ref.python"]
