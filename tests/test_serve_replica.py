"""The replica in process (tiny model, no Ray): its bounds and its text handling."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve import protocol as p
from serve.replica import Replica, ReplicaOptions, TextStream

TOOL = {"type": "function", "function": {"name": "t0", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def replica():
    r = Replica(ReplicaOptions(model="tiny", max_body_bytes=20_000, max_tools=3, max_len=512))
    yield r
    asyncio.run(r.close())


def chat(replica, **body):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body}
    return asyncio.run(replica.chat("t", json.dumps(body).encode()))


def test_bounds_answer_with_typed_errors(replica):
    with pytest.raises(p.RequestError) as err:
        chat(replica, messages=[{"role": "user", "content": "x" * 30_000}])
    assert err.value.status == 413
    tools = [{**TOOL, "function": {**TOOL["function"], "name": f"t{i}"}} for i in range(4)]
    with pytest.raises(p.RequestError) as err:
        chat(replica, tools=tools, tool_choice="required")
    assert err.value.status == 400 and err.value.param == "/tools"
    with pytest.raises(p.RequestError) as err:            # longer than the model's 512 positions
        chat(replica, messages=[{"role": "user", "content": "hello " * 1000}])
    assert err.value.status == 400 and err.value.code == "context_length_exceeded"
    assert "at least" not in str(err.value)                # tokenized: 6000 bytes may be fewer tokens
    saved, replica._max_token_bytes = replica._max_token_bytes, 1
    try:                                                   # 1 byte per token at most: refused by its bytes
        with pytest.raises(p.RequestError) as err:
            chat(replica, messages=[{"role": "user", "content": "hello " * 100}])
        assert err.value.code == "context_length_exceeded" and "at least" in str(err.value)
    finally:
        replica._max_token_bytes = saved
    assert 16 <= replica._max_token_bytes <= 256            # the vocabulary's longest token, in bytes


def test_stop_strings_cut_the_text_and_the_stream_holds_back_their_starts(replica):
    whole = json.loads(chat(replica, max_tokens=24, temperature=0))["choices"][0]["message"]["content"]
    assert len(whole) > 6
    stop = whole[3:6]
    cut = json.loads(chat(replica, max_tokens=24, temperature=0, stop=[stop]))["choices"][0]
    assert cut["message"]["content"] == whole[:whole.index(stop)] and cut["finish_reason"] == "stop"

    class Letters:          # a tokenizer whose tokens are letters
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids)

    stream = TextStream(Letters(), ["END"])
    pieces = [stream.add(ord(c)) for c in "abcENxyEND"]
    assert "".join(pieces) + stream.flush() == "abcENxy" and stream.stopped
    assert "N" not in pieces[4]         # "EN" might have begun "END": it was held back until it did not
