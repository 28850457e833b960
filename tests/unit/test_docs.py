"""The docs' Python blocks are Python: every block of the README and the GUIDE compiles, the ones
no test runs (a model API's task, say) included."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize("doc", ["README.md", "docs/GUIDE.md"])
def test_every_python_block_of_the_doc_compiles(doc: str) -> None:
    text = (ROOT / doc).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)  # in a list item too, indented
    assert blocks
    for block in blocks:
        line = text[: text.index(block)].count("\n") + 1
        where = f"{doc}, the block at line {line}"
        compile(textwrap.dedent(block), where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
