"""xg2: structured generation for agentic LLM serving (XGrammar 2 methods, Cython core).

The public API follows xgrammar's names and shapes, so an engine integration switches by import.
"""

from . import builtin_structural_tag, contrib, exception  # noqa: F401 (xgrammar's modules of these names)
from .batch_matcher import BatchGrammarMatcher
from .builtin_structural_tag import get_builtin_structural_tag, normalize_tool_choice
from .compiler import CompiledGrammar, GrammarCompiler
from .config import get_max_recursion_depth, max_recursion_depth, set_max_recursion_depth
from .errors import (
    FillTimeoutError,
    GrammarError,
    GrammarLimitError,
    ModelFormatError,
    RegexError,
    SchemaError,
    SchemaWarning,
    StructuralTagError,
    TokenizerError,
    UsageError,
    XG2Error,
)
from .exception import (
    DeserializeFormatError,
    DeserializeVersionError,
    InvalidJSONError,
    InvalidStructuralTagError,
)
from .grammar.grammar import Grammar
from .grammar.model_formats import get_model_structural_tag, register_model_structural_tag
from .grammar.model_output import (
    ModelOutput,
    ToolCallOut,
    model_output_hold,
    read_model_output,
    register_model_output_reader,
    tool_format_of_template,
)
from .grammar.structural_tag import StructuralTag, StructuralTagItem
from .kernels import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    get_bitmask_shape,
    reset_token_bitmask,
)
from .matcher import GrammarMatcher
from .serialization import get_serialization_version
from .tokenizer import TokenizerInfo, VocabType

__all__ = [
    "BatchGrammarMatcher",
    "CompiledGrammar",
    "DeserializeFormatError",
    "DeserializeVersionError",
    "FillTimeoutError",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarLimitError",
    "GrammarMatcher",
    "InvalidJSONError",
    "InvalidStructuralTagError",
    "ModelFormatError",
    "ModelOutput",
    "RegexError",
    "SchemaError",
    "SchemaWarning",
    "StructuralTag",
    "StructuralTagError",
    "StructuralTagItem",
    "TokenizerError",
    "TokenizerInfo",
    "ToolCallOut",
    "UsageError",
    "VocabType",
    "XG2Error",
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "get_bitmask_shape",
    "get_builtin_structural_tag",
    "get_max_recursion_depth",
    "get_model_structural_tag",
    "get_serialization_version",
    "max_recursion_depth",
    "model_output_hold",
    "normalize_tool_choice",
    "read_model_output",
    "register_model_output_reader",
    "register_model_structural_tag",
    "reset_token_bitmask",
    "set_max_recursion_depth",
    "tool_format_of_template",
]

__version__ = "0.1.0"
