"""OpenAI-style tool and tool-choice parameters (xgrammar's ``openai_tool_call_schema`` names), as
msgspec structs: typed objects a caller may build instead of dicts and pass to
``get_model_structural_tag``. Field names and defaults follow the OpenAI Chat Completions shapes;
``msgspec.convert(dict, FunctionToolParam)`` reads a request's JSON into them."""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec


class _Param(msgspec.Struct, kw_only=True):
    def model_dump(self, exclude_none: bool = True) -> dict[str, Any]:
        """The plain JSON shape (None fields left out), as pydantic's method of that name gives it."""
        out = msgspec.to_builtins(self)
        return _without_none(out) if exclude_none else out


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


class FunctionDefinition(_Param):
    name: str
    description: Union[str, None] = None  # noqa: UP007 (msgspec reads the annotation)
    parameters: Union[dict[str, Any], None] = None  # noqa: UP007
    strict: Union[bool, None] = None  # noqa: UP007


class FunctionToolParam(_Param):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class BuiltinToolParam(_Param):
    """A provider's builtin tool: `type` is its kind (``web_search_preview``), `name` what the
    model writes (default: the type), `parameters` the schema of its arguments."""
    type: str
    name: Union[str, None] = None  # noqa: UP007
    parameters: Union[dict[str, Any], None] = None  # noqa: UP007


class NamedToolChoiceFunction(_Param):
    name: str


class NamedToolChoiceParam(_Param):
    function: NamedToolChoiceFunction
    type: Literal["function"] = "function"


class BuiltinToolChoiceParam(_Param):
    type: str
    name: Union[str, None] = None  # noqa: UP007


class AllowedToolRef(_Param):
    type: str
    function: Union[NamedToolChoiceFunction, None] = None  # noqa: UP007
    name: Union[str, None] = None  # noqa: UP007


class AllowedToolsParam(_Param):
    mode: Literal["auto", "required"]
    tools: list[AllowedToolRef]


class AllowedToolChoiceParam(_Param):
    allowed_tools: AllowedToolsParam
    type: Literal["allowed_tools"] = "allowed_tools"


ToolParam = FunctionToolParam | BuiltinToolParam
ToolChoiceOptionParam = Literal["none", "auto", "required"] | NamedToolChoiceParam | AllowedToolChoiceParam | \
    BuiltinToolChoiceParam

__all__ = ["AllowedToolChoiceParam", "AllowedToolRef", "AllowedToolsParam", "BuiltinToolChoiceParam",
           "BuiltinToolParam", "FunctionDefinition", "FunctionToolParam", "NamedToolChoiceFunction",
           "NamedToolChoiceParam", "ToolChoiceOptionParam", "ToolParam"]
