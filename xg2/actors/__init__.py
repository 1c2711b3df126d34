"""The grammar runtime: sessions and batched steps in the process that samples (`GrammarRuntime`,
no Ray needed), and the Ray actors that share the cache across processes (`CacheShard`, the shard
router, the cache tier, `MatcherHost`; imported from their modules, since they need Ray)."""

from .runtime import FillHandle, GrammarRuntime, Session
from .spec import (
    EBNFSpec,
    GrammarSpec,
    JSONSchemaSpec,
    RegexSpec,
    SessionOptions,
    SessionSpec,
    StructuralTagSpec,
    ToolsSpec,
    content_key,
)

__all__ = [
    "EBNFSpec",
    "FillHandle",
    "GrammarRuntime",
    "GrammarSpec",
    "JSONSchemaSpec",
    "RegexSpec",
    "Session",
    "SessionOptions",
    "SessionSpec",
    "StructuralTagSpec",
    "ToolsSpec",
    "content_key",
]
