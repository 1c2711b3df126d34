"""Real client libraries against the application: instructor, langchain-openai, openai-agents,
pydantic-ai and the openai SDK's own helpers, each as its users call it, on the chat completions
API and on the Responses API (the tiny random model, loopback only, one app for the module on the
session's Ray).

The libraries are the `clients` extra, installed by CI: a missing one fails here (plain imports),
it does not skip.

A random model writes whatever the grammar lets it, so every answer is valid only because of the
grammar, and must be. The schemas are chosen so that every output the grammar allows fits well
within the token bound: enums, bounded integers, booleans, one short string, all required, no
other member (`extra="forbid"`), and no free whitespace (`structured_outputs.disable_any_whitespace`,
sent by each library's own `extra_body`); calls are forced, or one at most. So the tests cannot be
flaky, whatever is sampled.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

import instructor
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import NativeOutput, ToolOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.openai import OpenAIResponsesModel as PydanticResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

#: JSON without free whitespace: its every output then has a bounded length (vLLM's extension,
#: which the server takes on both APIs).
NO_WHITESPACE = {"structured_outputs": {"disable_any_whitespace": True}}
#: Far more than the longest output the schemas allow (a few dozen tokens).
MAX_TOKENS = 400
KEY = "sk-clients-0123456789abcdef"
PROMPT = "What is the forecast for Paris tomorrow?"


class Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: Literal["c", "f"]
    high: int = Field(ge=-40, le=50)
    rain: bool
    city: str = Field(max_length=6)


class Unit(BaseModel):
    """A tool's arguments."""

    model_config = ConfigDict(extra="forbid")

    unit: Literal["c", "f"]
    days: int = Field(ge=1, le=7)


@pytest.fixture(scope="module")
def app(serve_local):
    from serve.cli import Server

    set_tracing_disabled(True)
    server = Server(model="tiny", port=serve_local, shards=1, progress=False, mask_service=False,
                    options={"max_tokens_limit": 1024})
    server.start()
    yield server
    server.stop()


def sdk(app) -> openai.OpenAI:
    return openai.OpenAI(base_url=app.url, api_key=KEY, max_retries=0, timeout=120)


def async_sdk(app) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=app.url, api_key=KEY, max_retries=0, timeout=120)


# ------------------------------------------------------------------------------------------------
# The openai SDK's own helpers
# ------------------------------------------------------------------------------------------------

def test_openai_chat_completions_parse(app):
    r = sdk(app).chat.completions.parse(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                        response_format=Forecast, max_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(r.choices[0].message.parsed, Forecast)


def test_openai_responses_parse_and_stream(app):
    client = sdk(app)
    r = client.responses.parse(model="tiny", input=PROMPT, instructions="Answer as JSON.", text_format=Forecast,
                               max_output_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    assert isinstance(r.output_parsed, Forecast)
    assert Forecast.model_validate_json(r.output_text) == r.output_parsed
    assert r.usage.input_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    with client.responses.stream(model="tiny", input=PROMPT, text_format=Forecast, max_output_tokens=MAX_TOKENS,
                                 extra_body=NO_WHITESPACE) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert isinstance(final.output_parsed, Forecast) and final.output_text == text


def test_openai_responses_function_call_round_trip(app):
    """A forced call, its output items fed back with the tool's result, then a structured answer:
    the conversation whole in `input`, as a client without stored responses sends it."""
    client = sdk(app)
    tools = [{"type": "function", "name": "set_unit", "description": "Set the unit.", "strict": True,
              "parameters": Unit.model_json_schema()}]
    first = client.responses.create(model="tiny", input=PROMPT, tools=tools, tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "set_unit" and call.id.startswith("fc_")
    Unit.model_validate_json(call.arguments)
    conversation = [{"role": "user", "content": PROMPT}, *[item.model_dump(exclude_none=True) for item in first.output],
                    {"type": "function_call_output", "call_id": call.call_id, "output": "done"}]
    second = client.responses.parse(model="tiny", input=conversation, tools=tools, tool_choice="none",
                                    text_format=Forecast, max_output_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
    assert second.status == "completed" and isinstance(second.output_parsed, Forecast)
    with pytest.raises(openai.BadRequestError) as err:     # a result for no call is refused, with its place
        client.responses.create(model="tiny", input=conversation[-1:], max_output_tokens=8)
    assert err.value.body["param"] == "/input/0/call_id"


# ------------------------------------------------------------------------------------------------
# instructor
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor(app, mode):
    client = instructor.from_openai(sdk(app), mode=mode)
    forecast = client.chat.completions.create(model="tiny", response_model=Forecast, max_retries=0,
                                              messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
    assert isinstance(forecast, Forecast)


def test_instructor_on_the_responses_api(app):
    client = instructor.from_openai(sdk(app), mode=instructor.Mode.RESPONSES_TOOLS)
    forecast = client.responses.create(model="tiny", response_model=Forecast, max_retries=0, input=PROMPT,
                                       max_output_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE)
    assert isinstance(forecast, Forecast)


# ------------------------------------------------------------------------------------------------
# langchain-openai
# ------------------------------------------------------------------------------------------------

def chat_openai(app, max_tokens: int = MAX_TOKENS, api: str = "chat") -> ChatOpenAI:
    return ChatOpenAI(model="tiny", base_url=app.url, api_key=KEY, max_tokens=max_tokens, max_retries=0,
                      timeout=120, extra_body=NO_WHITESPACE, use_responses_api=api == "responses")


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(app, method, api):
    forecast = chat_openai(app, api=api).with_structured_output(Forecast, method=method).invoke(PROMPT)
    assert isinstance(forecast, Forecast)


def test_langchain_bind_tools_with_a_forced_tool_whole_and_streamed(app):
    llm = chat_openai(app).bind_tools([Unit, Forecast], tool_choice="Forecast")
    message = llm.invoke(PROMPT)
    [call] = message.tool_calls
    assert call["name"] == "Forecast"
    Forecast.model_validate(call["args"])
    chunks = list(llm.stream(PROMPT))
    streamed = sum(chunks[1:], chunks[0])
    assert isinstance(streamed, AIMessageChunk)
    [call] = streamed.tool_calls
    assert call["name"] == "Forecast"
    Forecast.model_validate(call["args"])


def test_langchain_streams_text(app):
    chunks = list(chat_openai(app, max_tokens=8).stream(PROMPT))
    text = "".join(c.content for c in chunks)
    assert text and sum(chunks[1:], chunks[0]).response_metadata["finish_reason"] in ("stop", "length")
    chunks = list(chat_openai(app, max_tokens=8, api="responses").stream(PROMPT))      # Responses events
    message = sum(chunks[1:], chunks[0])
    assert message.text and message.response_metadata["status"] == "incomplete"


# ------------------------------------------------------------------------------------------------
# openai-agents
# ------------------------------------------------------------------------------------------------

def agents_model(app, api: str):
    if api == "chat":
        return OpenAIChatCompletionsModel(model="tiny", openai_client=async_sdk(app))
    return OpenAIResponsesModel(model="tiny", openai_client=async_sdk(app))


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_output_type(app, api):
    agent = Agent(name="forecaster", instructions="Give the forecast.", model=agents_model(app, api),
                  output_type=Forecast, model_settings=ModelSettings(max_tokens=MAX_TOKENS, extra_body=NO_WHITESPACE))
    result = Runner.run_sync(agent, PROMPT, max_turns=1)
    assert isinstance(result.final_output, Forecast)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_function_tool(app, api):
    """The tool is called under `tool_choice="required"` and its result is the answer
    (`stop_on_first_tool`): one model call, and the arguments the tool got are its schema's."""
    seen: list[Unit] = []

    @function_tool
    def set_unit(unit: Literal["c", "f"], days: Annotated[int, Field(ge=1, le=7)]) -> str:
        """Set the unit and the number of days of the forecast."""
        seen.append(Unit(unit=unit, days=days))
        return json.dumps({"unit": unit, "days": days})

    agent = Agent(name="units", instructions="Set the unit.", model=agents_model(app, api), tools=[set_unit],
                  tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_TOKENS,
                                               extra_body=NO_WHITESPACE))
    result = Runner.run_sync(agent, PROMPT, max_turns=2)
    assert len(seen) == 1 and Unit.model_validate_json(result.final_output) == seen[0]


# ------------------------------------------------------------------------------------------------
# pydantic-ai
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("output", ["tool", "native"])
def test_pydantic_ai(app, output, api):
    provider = OpenAIProvider(openai_client=async_sdk(app))
    model = (OpenAIChatModel if api == "chat" else PydanticResponsesModel)("tiny", provider=provider)
    output_type = ToolOutput(Forecast) if output == "tool" else NativeOutput(Forecast)
    agent = PydanticAgent(model, output_type=output_type, retries=0, model_settings={
        "max_tokens": MAX_TOKENS, "parallel_tool_calls": False, "extra_body": NO_WHITESPACE})
    result = agent.run_sync(PROMPT)
    assert isinstance(result.output, Forecast)
