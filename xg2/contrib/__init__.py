"""Integrations with other libraries (xgrammar's ``contrib``): ``hf`` for transformers' generate().

``xg2.contrib.hf`` is imported on first use, so that ``import xg2`` does not import transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["hf"]


def __getattr__(name: str) -> Any:
    if name == "hf":
        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
