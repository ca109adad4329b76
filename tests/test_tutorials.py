"""The tutorials (docs/tutorials/*.py, jupytext percent-format notebooks that the documentation build executes): each
is a notebook with a title, its links to other pages of the site name pages that exist (mkdocs checks the links of
Markdown pages, not those inside a notebook), and, with ``-m slow``, each runs top to bottom as a plain script in a
directory of its own, as the build runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TUTORIALS = sorted((DOCS / "tutorials").glob("*.py"))
# A Markdown link in a notebook's text cell, to a relative address: the site's directory URLs, ../page/ from a tutorial.
LINK = re.compile(r"\]\(((?:\.\./)+)([^)#\s]*?)/?(#[^)\s]*)?\)")


def page_exists(ups: str, target: str) -> bool:
    """Whether ``ups`` + ``target`` from a tutorial's page (``/tutorials/NAME/``) is a page of the site: a Markdown
    page under docs/ or another tutorial."""
    depth = ups.count("../")
    base = {1: DOCS / "tutorials", 2: DOCS}.get(depth)
    if base is None:
        return False
    if not target:
        return (base / "index.md").exists()
    return any(p.exists() for p in (base / f"{target}.md", base / target / "index.md", base / f"{target}.py"))


def test_the_links_checker_has_power():
    assert page_exists("../../", "reproductions") and page_exists("../", "nvil-vimco-relax")
    assert not page_exists("../../", "no-such-page") and not page_exists("../", "reproductions")


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_is_a_notebook_whose_links_resolve(path):
    text = path.read_text()
    assert "# %% [markdown]" in text and re.search(r"^# # \S", text, re.M), f"{path.name}: no title cell"
    bad = [f"{ups}{target}" for ups, target, _ in LINK.findall(text) if not page_exists(ups, target)]
    assert not bad, f"{path.name} links to pages that do not exist: {bad}"


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(path, tmp_path):
    """The notebook as a script (a percent-format notebook is one), in an empty working directory, plots to Agg."""
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONWARNINGS": "ignore::UserWarning"}
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"{path.name} failed:\n{done.stderr[-3000:]}"
    assert not list(tmp_path.iterdir()), f"{path.name} wrote into its working directory: {list(tmp_path.iterdir())}"
