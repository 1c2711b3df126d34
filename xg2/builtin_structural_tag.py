"""xgrammar's ``builtin_structural_tag`` module: the structural tag of each model's output format,
by model name (`get_model_structural_tag`) or by a function per model taking an already normalised
request (`get_llama_structural_tag`, ...), and `normalize_tool_choice`, the model-independent part
between them. Every function here is a view of the formats in xg2.grammar.model_formats: a model's
function gives the tag `get_model_structural_tag` gives for its name.

A per-model function takes xgrammar's parameters: `tools` (function tools), `builtin_tools`, the
simplified `tool_choice` (``"auto"``: text or calls, text only without tools; ``"required"``: at
least one call; ``"forced"``: exactly one call of the one tool given), `reasoning`
(``"enabled"``, ``"disabled"`` or ``"auto"``; ``"enabled"`` unless said, ``"auto"`` for MiniMax-M3's,
whose thinking is adaptive by default, as in xgrammar), `any_order`, `exclude_special_tokens`,
`max_whitespace_cnt` and `parallel_tool_calls`; further keyword arguments are accepted and ignored,
as xgrammar's are. Invalid requests raise xg2.ModelFormatError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from .grammar.model_formats import (
    build_model_structural_tag,
    get_model_structural_tag,
    normalized_tool_choice,
    register_model_structural_tag,
)
from .grammar.structural_tag import StructuralTag
from .openai_tool_call_schema import BuiltinToolParam, FunctionToolParam

#: xgrammar's old name of get_model_structural_tag.
get_builtin_structural_tag = get_model_structural_tag


def normalize_tool_choice(tools: list | None = None, tool_choice: Any = "auto"
                          ) -> tuple[list[FunctionToolParam], list[BuiltinToolParam], str]:
    """(function tools, builtin tools, simplified tool choice) of an OpenAI-style request, ready
    for a per-model function: the tools the tool choice leaves (``"none"`` leaves none) as
    xg2.openai_tool_call_schema structs, and ``"auto"``, ``"required"`` or ``"forced"``."""
    kept, mode = normalized_tool_choice(tools, tool_choice)
    functions: list[FunctionToolParam] = []
    builtins: list[BuiltinToolParam] = []
    for t in kept:
        if t.get("type", "function") == "function":
            functions.append(msgspec.convert({**t, "type": "function"}, FunctionToolParam))
        else:
            builtins.append(msgspec.convert(t, BuiltinToolParam))
    return functions, builtins, mode


def _model_function(model: str, what: str, reasoning_default: str = "enabled") -> Callable[..., StructuralTag]:
    def get_structural_tag(tools: list | None = None, builtin_tools: list | None = None, tool_choice: str = "auto",
                           reasoning: str = reasoning_default, any_order: bool = False, exclude_special_tokens: bool = True,
                           max_whitespace_cnt: int | None = None, parallel_tool_calls: bool = True,
                           **kwargs: Any) -> StructuralTag:
        del kwargs
        return build_model_structural_tag(model, tools, builtin_tools, tool_choice, reasoning, any_order,
                                          exclude_special_tokens, max_whitespace_cnt, parallel_tool_calls)

    get_structural_tag.__name__ = get_structural_tag.__qualname__ = f"get_{model}_structural_tag"
    get_structural_tag.__doc__ = f"""The structural tag of {what} (model format ``"{model}"``) for a
    normalised request; see the module's description of the parameters."""
    return get_structural_tag


get_llama_structural_tag = _model_function("llama", "Llama 3.x JSON tool calling")
get_qwen_3_structural_tag = _model_function("qwen_3", "Qwen 3's Hermes-style calls")
get_qwen_3_5_structural_tag = _model_function("qwen_3_5", "Qwen 3.5's XML calls (Qwen3-Coder's syntax) with reasoning")
#: One function for both, as in xgrammar: Qwen3-Coder and Qwen 3.5 write calls one way, read by
#: one parser, so their formats are the same.
get_qwen_3_coder_structural_tag = get_qwen_3_5_structural_tag
get_deepseek_r1_structural_tag = _model_function("deepseek_r1", "DeepSeek-R1's fenced JSON calls")
get_deepseek_v3_1_structural_tag = _model_function("deepseek_v3_1", "DeepSeek-V3.1's calls")
get_deepseek_v3_2_structural_tag = _model_function("deepseek_v3_2", "DeepSeek-V3.2's DSML calls")
get_kimi_structural_tag = _model_function("kimi", "Kimi K2's calls")
get_harmony_structural_tag = _model_function("harmony", "gpt-oss's harmony messages")
get_glm_4_7_structural_tag = _model_function("glm_4_7", "GLM-4.7's arg_key/arg_value calls")
get_minimax_structural_tag = _model_function("minimax", "MiniMax-M2's invoke calls")
get_exaone_structural_tag = _model_function("exaone", "EXAONE 4.0's Hermes-style calls")
get_deepseek_v4_structural_tag = _model_function("deepseek_v4", "DeepSeek-V4's DSML calls")
get_deepseek_v4_1_structural_tag = _model_function("deepseek_v4_1", "DeepSeek-V4.1's DSML calls (spaced tag names)")
get_minimax_m3_structural_tag = _model_function("minimax_m3", "MiniMax-M3's namespaced invoke calls", "auto")
get_mimo_structural_tag = _model_function("mimo", "MiMo-V2's function/parameter calls")
get_cohere_structural_tag = _model_function("cohere", "Cohere Command's cofl calls (cmd5, nested values)")
get_kimi_k3_structural_tag = _model_function("kimi_k3", "Kimi K3's channels")

__all__ = [
    "get_builtin_structural_tag",
    "get_cohere_structural_tag",
    "get_deepseek_r1_structural_tag",
    "get_deepseek_v3_1_structural_tag",
    "get_deepseek_v3_2_structural_tag",
    "get_deepseek_v4_1_structural_tag",
    "get_deepseek_v4_structural_tag",
    "get_exaone_structural_tag",
    "get_glm_4_7_structural_tag",
    "get_harmony_structural_tag",
    "get_kimi_k3_structural_tag",
    "get_kimi_structural_tag",
    "get_llama_structural_tag",
    "get_mimo_structural_tag",
    "get_minimax_m3_structural_tag",
    "get_minimax_structural_tag",
    "get_model_structural_tag",
    "get_qwen_3_5_structural_tag",
    "get_qwen_3_coder_structural_tag",
    "get_qwen_3_structural_tag",
    "normalize_tool_choice",
    "register_model_structural_tag",
]
