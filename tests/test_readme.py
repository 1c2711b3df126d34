"""The README's Python examples run as written (with ../shared where it is beside the checkout)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SHARED

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code):
    if not SHARED.exists():
        pytest.skip(f"{SHARED} not found: the README's examples read vocabularies from ../shared")
    exec(compile(code.replace("../shared", str(SHARED)), str(README), "exec"), {"__name__": "readme"})  # noqa: S102 - our own README
