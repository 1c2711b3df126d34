"""Chat prompts, and the OpenAI shape of the tool calls a model's output is read into.

The prompt the model sees and the calls xg2 constrains it to write must agree: a model shown its
past calls in one spelling and forced to write new ones in another does worse. For SmolLM2 (whose
own template knows nothing of tools) the prompt is rendered here by hand, with tools described
and past calls written the ``qwen_3`` (Hermes) way, the format the server constrains it to; a
model directory's own chat template renders its prompts (TemplateChatFormat). The output is read
back by the format's reader (xg2.read_model_output), from the same definition as its grammar:
`openai_tool_calls` gives its calls the shape OpenAI's clients expect.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from xg2 import ToolCallOut

#: SmolLM2's own default system prompt, used by its chat template when a conversation has none.
SMOLLM2_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

# Written for this project; it carries the same information as the Hermes / Qwen 2.5 tool prompt
# (where the signatures are, and how a call must be spelled) because small models are trained on
# prompts of that shape.
_TOOLS_INTRO = (
    "# Tools\n\n"
    "You can call functions to help answer the user. "
    "The functions available to you are described, one JSON signature per line, "
    "between the <tools></tools> XML tags below:\n"
    "<tools>\n"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\n"
    "To call a function, write a JSON object holding the function's name and its arguments "
    "between <tool_call></tool_call> XML tags, one block per call:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>'
)

class ChatFormatError(ValueError):
    """A message the renderer cannot express (the server answers it with a 400)."""


def _text(content: Any, role: str) -> str:
    """OpenAI content: a string, None, or a list of parts of which only text parts have a
    textual rendering."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatFormatError(f"{role} message: content part of type {kind!r} is not supported "
                                      "(only text parts are)")
        return "\n".join(texts)
    raise ChatFormatError(f"{role} message: content must be a string, null or a list of text parts, "
                          f"got {type(content).__name__}")


def _tool_entry(tool: Any) -> dict:
    """Accept both the OpenAI wrapper and a bare function object, so callers need not care."""
    if not isinstance(tool, dict):
        raise ChatFormatError(f"a tool must be an object, got {type(tool).__name__}")
    if "function" in tool:
        return tool
    if "name" in tool:
        return {"type": "function", "function": tool}
    raise ChatFormatError("a tool must be {'type': 'function', 'function': {'name': ..., ...}}")


def _arguments(value: Any) -> Any:
    """OpenAI sends arguments as JSON text; the prompt shows them as a JSON value, as the model
    writes them (text that is not JSON is shown as a JSON string rather than dropped)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return {} if value is None else value


def _call_block(call: Any) -> str:
    if not isinstance(call, dict):
        raise ChatFormatError(f"a tool call must be an object, got {type(call).__name__}")
    function = call.get("function", call)
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ChatFormatError("a tool call needs function.name")
    args = json.dumps(_arguments(function.get("arguments")), ensure_ascii=False)
    # The name is spliced in verbatim, as xg2's qwen_3 tag writes it, not JSON-escaped.
    return f'{CALL_OPEN}\n{{"name": "{name}", "arguments": {args}}}\n{CALL_CLOSE}'


def new_call_id() -> str:
    """An id in OpenAI's shape; random so ids from different requests never collide."""
    return "call_" + secrets.token_hex(12)


def openai_tool_calls(calls: list[ToolCallOut]) -> list[dict]:
    """Calls read from an output as OpenAI's `tool_calls`: fresh ids, the arguments as compact
    JSON text."""
    return [{"id": new_call_id(), "type": "function",
             "function": {"name": c.name,
                          "arguments": json.dumps(c.arguments, ensure_ascii=False, separators=(",", ":"))}}
            for c in calls]


class ChatFormat:
    """ChatML prompts with Hermes-style tools (calls written the ``qwen_3`` way).

    ``default_system``: the system prompt added when a conversation has none (SmolLM2's template
    does this too, so plain conversations render exactly as its own template would); None adds
    one only when there are tools to describe."""

    def __init__(self, default_system: str | None = SMOLLM2_SYSTEM_PROMPT) -> None:
        self.default_system = default_system

    def __repr__(self) -> str:
        return f"{type(self).__name__}(default_system={self.default_system!r})"

    # -- rendering ---------------------------------------------------------------------------

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text for ``messages``, ending with the assistant's generation prompt."""
        return self._render_chatml(messages, tools)

    def _render_chatml(self, messages: list[dict], tools: list[dict] | None) -> str:
        if not isinstance(messages, list):
            raise ChatFormatError("messages must be a list")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ChatFormatError("each message must be an object with a string role")
        out: list[str] = []
        rest = messages
        system: str | None = self.default_system
        if messages and messages[0]["role"] in ("system", "developer"):
            system, rest = _text(messages[0].get("content"), "system"), messages[1:]
        if tools:
            section = _TOOLS_INTRO + "\n".join(json.dumps(_tool_entry(t), ensure_ascii=False) for t in tools)
            section += _TOOLS_OUTRO
            system = f"{system}\n\n{section}" if system else section
        if system is not None:
            out.append(f"<|im_start|>system\n{system}<|im_end|>\n")
        for i, m in enumerate(rest):
            role = m["role"]
            if role == "tool":
                # Consecutive results share one user turn, as in Qwen's template.
                if i == 0 or rest[i - 1]["role"] != "tool":
                    out.append("<|im_start|>user")
                out.append(f"\n<tool_response>\n{_text(m.get('content'), role)}\n</tool_response>")
                if i + 1 == len(rest) or rest[i + 1]["role"] != "tool":
                    out.append("<|im_end|>\n")
            elif role == "assistant" and m.get("tool_calls"):
                parts = [_text(m.get("content"), role)] if m.get("content") else []
                parts += [_call_block(c) for c in m["tool_calls"]]
                out.append("<|im_start|>assistant\n" + "\n".join(parts) + "<|im_end|>\n")
            else:
                if role == "developer":
                    role = "system"
                out.append(f"<|im_start|>{role}\n{_text(m.get('content'), role)}<|im_end|>\n")
        out.append("<|im_start|>assistant\n")
        return "".join(out)


class TemplateChatFormat(ChatFormat):
    """For a model directory of unknown family: its own chat template renders the prompt (it knows
    the model's roles and special tokens), and ChatML is the fallback when it has none."""

    def __init__(self, tokenizer: Any, default_system: str | None = None) -> None:
        super().__init__(default_system)
        self.tokenizer = tokenizer

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            return self._render_chatml(messages, tools)
        plain = []
        for m in messages:
            m = dict(m)
            m["content"] = _text(m.get("content"), str(m.get("role")))
            if m.get("tool_calls"):     # templates index into arguments, so they want the object
                m["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
                    if isinstance(c, dict) and isinstance(c.get("function"), dict) else c
                    for c in m["tool_calls"]]
            plain.append(m)
        entries = [_tool_entry(t) for t in tools] if tools else None
        return self.tokenizer.apply_chat_template(plain, tools=entries, add_generation_prompt=True, tokenize=False)
