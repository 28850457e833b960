"""The docs' Python blocks are Python: every block of the README and of the documentation site's
pages compiles, the ones no test runs (a model API's task, say) included."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "notes" not in p.parts)]
DOCS = [str(p.relative_to(ROOT)) for p in PAGES if "```python\n" in p.read_text()]


def test_the_readme_the_tutorial_and_the_how_tos_have_python_blocks() -> None:
    assert {"README.md", "docs/tutorial.md", "docs/howto/generations.md", "docs/howto/ai-sdk.md"} <= set(DOCS)


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_block_of_the_doc_compiles(doc: str) -> None:
    text = (ROOT / doc).read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):  # in a list item too, indented
        line = text[: text.index(block)].count("\n") + 1
        where = f"{doc}, the block at line {line}"
        compile(textwrap.dedent(block), where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_the_readme_is_a_front_page_that_links_every_page_of_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    pages = [p for p in PAGES[1:] if p.name not in ("index.md", "changelog.md")]
    missing = [str(p.relative_to(ROOT)) for p in pages if f"({p.relative_to(ROOT)})" not in readme]
    assert not missing, f"the README links no {missing}"


def test_every_relative_link_of_every_markdown_file_names_a_file_that_exists() -> None:
    """Sphinx checks the site's links (-W), but not the README's, the changelog's or the notes'."""
    broken = []
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")]:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # not inside code blocks
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+:", target) and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken
