"""Sphinx configuration of the wflow documentation (build: ``make -C docs html``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if not os.environ.get("WFLOW_TEST_INSTALLED"):
    sys.path.insert(0, str(ROOT))  # document the checkout the docs live in
# (CI sets WFLOW_TEST_INSTALLED and documents the installed wheel instead.)
sys.path.insert(0, str(HERE / "_ext"))
os.environ.setdefault("MPLBACKEND", "Agg")  # the gallery scripts run headless

import wflow  # noqa: E402

project = "wflow"
author = "wflow developers"
copyright = "2026, wflow developers"
release = wflow.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "wflow_docs",  # docs/_ext/wflow_docs.py: the configuration-key table
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = [
    "_build",
    "Thumbs.db",
    ".DS_Store",
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
    "auto_examples/*.json",
    "auto_examples/*.md5",
]

# -- Markdown (MyST) ----------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# -- API reference ------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_typehints = "none"  # types live in the numpydoc parameter lists
autodoc_default_options = {"members": True, "member-order": "bysource"}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# -- examples gallery ---------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "image_scrapers": ("matplotlib",),
    "reset_modules": ("matplotlib",),
    "remove_config_comments": True,
    "show_memory": False,
    "min_reported_time": 1,
    "write_computation_times": False,
    "abort_on_example_error": True,
}

# -- HTML ---------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"wflow {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"**": ["sidebar-nav-bs"]}
html_static_path: list[str] = []
html_show_sourcelink = False
