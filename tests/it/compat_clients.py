"""The official OpenAI and Anthropic Python SDKs against a running agentd (SPEC §17).

Run by tests/it/compat.rs with the SDKs from scripts/install-test-peers.sh on PYTHONPATH:

    python3 compat_clients.py SCENARIO

Environment: AGENTD_BASE (http://127.0.0.1:PORT), AGENTD_TOKEN. Prints one JSON object per
step on stdout ({"step": ..., ...}); the Rust test asserts on them and on the daemon's trail.
"""

import json
import os
import sys

import anthropic
import openai

BASE = os.environ["AGENTD_BASE"]
TOKEN = os.environ["AGENTD_TOKEN"]


def out(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def oai(**kw):
    return openai.OpenAI(base_url=BASE + "/v1", api_key=TOKEN, max_retries=0, **kw)


def ant(**kw):
    return anthropic.Anthropic(base_url=BASE, api_key=TOKEN, max_retries=0, **kw)


def usage_of(u):
    return u.model_dump() if u is not None else None


def basics():
    client = oai()
    out("models", ids=[m.id for m in client.models.list()])
    raw = client.models.with_raw_response.retrieve("agentd:primary")
    out("model", id=raw.parse().id, request_id=raw.headers.get("x-request-id"))
    try:
        client.models.retrieve("agentd:nope")
        out("missing_model", error=None)
    except openai.NotFoundError as e:
        out("missing_model", error=type(e).__name__, status=e.status_code)

    a = ant()
    out("ant_models", ids=[m.id for m in a.models.list()])
    m = a.models.retrieve("agentd:primary")
    out("ant_model", id=m.id, type=m.type, display_name=m.display_name)
    try:
        a.models.retrieve("claude-nope")
        out("ant_missing_model", error=None)
    except anthropic.NotFoundError as e:
        out("ant_missing_model", error=type(e).__name__, status=e.status_code)
    short = a.messages.count_tokens(model="agentd", messages=[{"role": "user", "content": "hi"}])
    long = a.messages.count_tokens(model="agentd", system="Be brief.",
                                   messages=[{"role": "user", "content": "word " * 400}])
    out("count_tokens", short=short.input_tokens, long=long.input_tokens)

    session = {"X-Agentd-Session": "sdk"}
    r = client.chat.completions.create(
        model="agentd",
        messages=[
            {"role": "system", "content": "Answer in English."},
            {"role": "user", "content": "first question"},
        ],
        extra_headers=session,
    )
    out("chat", id=r.id, content=r.choices[0].message.content,
        finish=r.choices[0].finish_reason, usage=usage_of(r.usage))

    r = client.chat.completions.create(
        model="agentd",
        messages=[{"role": "user", "content": "second question"}],
        extra_headers=session,
    )
    out("chat2", content=r.choices[0].message.content)

    try:
        openai.OpenAI(base_url=BASE + "/v1", api_key="wrong-key", max_retries=0).models.list()
        out("bad_key", error=None)
    except openai.AuthenticationError as e:
        out("bad_key", error=type(e).__name__, status=e.status_code)

    try:
        anthropic.Anthropic(base_url=BASE, api_key="wrong-key", max_retries=0).messages.create(
            model="agentd", max_tokens=100, messages=[{"role": "user", "content": "x"}]
        )
        out("bad_key_anthropic", error=None)
    except anthropic.AuthenticationError as e:
        out("bad_key_anthropic", error=type(e).__name__, status=e.status_code)

    m = ant().messages.create(
        model="agentd",
        max_tokens=200,
        system="Be brief.",
        metadata={"user_id": "ant"},
        messages=[{"role": "user", "content": "hello messages"}],
    )
    out("messages", id=m.id, text=m.content[0].text, stop=m.stop_reason, usage=usage_of(m.usage))

    # Clients that always send a tool list send it empty, with "none": that is no client tool.
    m = ant().messages.create(
        model="agentd",
        max_tokens=50,
        tools=[],
        tool_choice={"type": "none"},
        metadata={"user_id": "ant"},
        messages=[{"role": "user", "content": "no tools please"}],
    )
    out("no_tools", text=m.content[0].text)

    # A proxy in front answered 502 and the SDK retried: the same Idempotency-Key twice.
    ids = []
    for _ in range(2):
        r = client.chat.completions.create(
            model="agentd",
            messages=[{"role": "user", "content": "only once please"}],
            extra_headers={"Idempotency-Key": "idem-0001", "X-Agentd-Session": "sdk"},
        )
        ids.append(r.id)
        content = r.choices[0].message.content
    out("idempotent", ids=ids, content=content)

    # No session: the request's own messages are the history of a one-off session.
    r = client.chat.completions.create(
        model="agentd",
        messages=[
            {"role": "user", "content": "my name is Zed"},
            {"role": "assistant", "content": "Hello Zed."},
            {"role": "user", "content": "what is my name?"},
        ],
    )
    out("one_off", content=r.choices[0].message.content)


def streaming():
    client = oai()
    chunks = client.chat.completions.create(
        model="agentd",
        messages=[{"role": "user", "content": "stream to me"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Agentd-Session": "stream"},
    )
    text, usage, finish = "", None, None
    for c in chunks:
        if c.choices:
            text += c.choices[0].delta.content or ""
            finish = c.choices[0].finish_reason or finish
        if c.usage is not None:
            usage = c.usage.model_dump()
    out("chat_stream", content=text, finish=finish, usage=usage)

    with ant().messages.stream(
        model="agentd",
        max_tokens=200,
        metadata={"user_id": "stream"},
        messages=[{"role": "user", "content": "stream messages"}],
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    out("messages_stream", text=text, stop=final.stop_reason, usage=usage_of(final.usage))


def budget():
    # The SDKs' own retries are on (2 by default): x-should-retry: false must stop them.
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=TOKEN)
    session = {"X-Agentd-Session": "budget"}
    r = client.chat.completions.create(
        model="agentd", messages=[{"role": "user", "content": "spend it all"}], extra_headers=session
    )
    out("spent", content=r.choices[0].message.content)
    try:
        client.chat.completions.create(
            model="agentd", messages=[{"role": "user", "content": "one more"}], extra_headers=session
        )
        out("over_openai", error=None)
    except openai.RateLimitError as e:
        out("over_openai", error=type(e).__name__, status=e.status_code, body=e.body,
            should_retry=e.response.headers.get("x-should-retry"))
    try:
        anthropic.Anthropic(base_url=BASE, api_key=TOKEN).messages.create(
            model="agentd", max_tokens=100, metadata={"user_id": "budget"},
            messages=[{"role": "user", "content": "and another"}],
        )
        out("over_anthropic", error=None)
    except anthropic.RateLimitError as e:
        out("over_anthropic", error=type(e).__name__, status=e.status_code, body=e.body)


def responses():
    client = oai()
    r = client.responses.create(model="agentd", input="responses first question",
                                instructions="Answer in English.")
    out("first", id=r.id, text=r.output_text, status=r.status, usage=usage_of(r.usage),
        instructions=r.instructions)
    r2 = client.responses.create(model="agentd", input="responses second question",
                                 previous_response_id=r.id)
    out("second", id=r2.id, text=r2.output_text, previous=r2.previous_response_id)

    events = []
    deltas = []
    final = None
    for e in client.responses.create(model="agentd", stream=True, input=[
            {"role": "user", "content": [
                {"type": "input_text", "text": "responses stream to me"},
                {"type": "input_image",
                 "image_url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="}]}]):
        events.append(e.type)
        if e.type == "response.output_text.delta":
            deltas.append(e.delta)
        if e.type == "response.completed":
            final = e.response
    out("stream", events=events, text="".join(deltas), id=final.id,
        final_text=final.output_text, usage=usage_of(final.usage))
    with client.responses.stream(model="agentd", input="responses third question",
                                 previous_response_id=final.id) as s:
        done = s.get_final_response()
    out("stream_continued", text=done.output_text, id=done.id)

    named = client.responses.create(model="agentd", input="responses named first", user="resp-user")
    named2 = client.responses.create(model="agentd", input="responses named second",
                                     previous_response_id=named.id)
    out("named", ids=[named.id, named2.id], text=named2.output_text)

    unstored = client.responses.create(model="agentd", input="responses not stored", store=False)
    out("unstored", store=unstored.store, text=unstored.output_text)
    for step, prev in [("unstored_continue", unstored.id),
                       ("unknown_continue", "resp_" + "0" * 48), ("foreign_continue", "chatcmpl-1")]:
        try:
            client.responses.create(model="agentd", input="x", previous_response_id=prev)
            out(step, error=None)
        except openai.APIStatusError as e:
            out(step, error=type(e).__name__, status=e.status_code, message=e.message)
    try:
        client.responses.create(model="agentd", input="x", background=True)
        out("background", error=None)
    except openai.APIStatusError as e:
        out("background", error=type(e).__name__, status=e.status_code, message=e.message)

    weather = {"type": "function", "name": "get_weather", "description": "The weather of a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}
    t1 = client.responses.create(model="agentd", input="responses weather tool", tools=[weather])
    calls = [o for o in t1.output if o.type == "function_call"]
    t2 = client.responses.create(model="agentd", previous_response_id=t1.id, tools=[weather],
                                 input=[{"type": "function_call_output",
                                         "call_id": calls[0].call_id, "output": "18 C and sunny"}])
    out("tool_round", status=t1.status, text=t2.output_text,
        calls=[{"name": c.name, "arguments": c.arguments, "call_id": c.call_id} for c in calls])
    events, final = [], None
    for e in client.responses.create(model="agentd", input="responses weather stream",
                                     tools=[weather], stream=True, user="resp-tools"):
        events.append(e.type)
        if e.type == "response.completed":
            final = e.response
    calls = [o for o in final.output if o.type == "function_call"]
    done = client.responses.create(model="agentd", user="resp-tools", tools=[weather],
                                   input=[{"type": "function_call_output",
                                           "call_id": calls[0].call_id, "output": "rain"}])
    out("tool_stream", events=events, calls=[c.call_id for c in calls], text=done.output_text)
    try:
        client.responses.create(model="agentd", user="resp-tools", tools=[weather],
                                input=[{"type": "function_call_output", "call_id": "nope",
                                        "output": "x"}])
        out("tool_unknown", error=None)
    except openai.APIStatusError as e:
        out("tool_unknown", error=type(e).__name__, status=e.status_code, message=e.message)


def structured():
    import pydantic

    class City(pydantic.BaseModel):
        name: str
        people: int

    client = oai()
    session = {"X-Agentd-Session": "structured"}
    r = client.chat.completions.parse(
        model="agentd",
        messages=[{"role": "user", "content": "structured city"}],
        response_format=City,
        extra_headers=session,
    )
    out("parsed", parsed=r.choices[0].message.parsed.model_dump(),
        content=r.choices[0].message.content)

    schema = City.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    r = client.chat.completions.create(
        model="agentd", messages=[{"role": "user", "content": "structured retry"}],
        response_format=fmt, extra_headers=session,
    )
    out("retry", content=r.choices[0].message.content)

    try:
        client.chat.completions.create(
            model="agentd", messages=[{"role": "user", "content": "structured never"}],
            response_format=fmt, extra_headers=session,
        )
        out("never", error=None)
    except openai.APIStatusError as e:
        out("never", error=type(e).__name__, status=e.status_code, body=e.body)

    m = ant().messages.parse(
        model="agentd", max_tokens=200, metadata={"user_id": "structured-ant"},
        messages=[{"role": "user", "content": "structured anthropic"}],
        output_format=City,
    )
    out("anthropic", parsed=m.parsed_output.model_dump(), text=m.content[0].text)


def unsupported():
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": {"type": "object"}}}
    try:
        oai().chat.completions.create(
            model="agentd", messages=[{"role": "user", "content": "structured refused"}],
            response_format=fmt, extra_headers={"X-Agentd-Session": "refused"},
        )
        out("openai", error=None)
    except openai.BadRequestError as e:
        out("openai", error=type(e).__name__, status=e.status_code, body=e.body)
    try:
        ant().messages.create(
            model="agentd", max_tokens=100, metadata={"user_id": "refused"},
            messages=[{"role": "user", "content": "structured refused"}],
            output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
        )
        out("anthropic", error=None)
    except anthropic.BadRequestError as e:
        out("anthropic", error=type(e).__name__, status=e.status_code, body=e.body)
    # Without a format the same model answers.
    r = oai().chat.completions.create(
        model="agentd", messages=[{"role": "user", "content": "plain please"}],
    )
    out("plain", content=r.choices[0].message.content)


WEATHER_OAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, from the client.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
WEATHER_ANT = {
    "name": "get_weather",
    "description": "The weather in a city, from the client.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]},
}


def error_of(call):
    try:
        call()
        return {"error": None}
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        return {"error": type(e).__name__, "status": e.status_code, "body": e.body}


def oai_round(client, question, session):
    """A client tool round trip on chat completions: the call, then the result."""
    extra = {"user": session} if session else {}
    messages = [{"role": "user", "content": question}]
    r = client.chat.completions.create(model="agentd", messages=messages,
                                       tools=[WEATHER_OAI], **extra)
    msg = r.choices[0].message
    calls = [{"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments)}
             for c in msg.tool_calls or []]
    messages.append(msg.model_dump(exclude_none=True))
    for c in msg.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": c.id, "content": "18 C and sunny"})
    r2 = client.chat.completions.create(model="agentd", messages=messages,
                                        tools=[WEATHER_OAI], **extra)
    return {"finish": r.choices[0].finish_reason, "calls": calls,
            "final": r2.choices[0].message.content, "final_finish": r2.choices[0].finish_reason}


def ant_round(client, question, session):
    """A client tool round trip on messages: the tool_use, then the tool_result."""
    extra = {"metadata": {"user_id": session}} if session else {}
    messages = [{"role": "user", "content": question}]
    m = client.messages.create(model="agentd", max_tokens=200, messages=messages,
                               tools=[WEATHER_ANT], **extra)
    uses = [b for b in m.content if b.type == "tool_use"]
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b.id, "content": "18 C and sunny"} for b in uses]})
    m2 = client.messages.create(model="agentd", max_tokens=200, messages=messages,
                                tools=[WEATHER_ANT], **extra)
    return {"stop": m.stop_reason, "calls": [{"id": b.id, "name": b.name, "input": b.input} for b in uses],
            "final": "".join(b.text for b in m2.content if b.type == "text"),
            "final_stop": m2.stop_reason}


def client_tools():
    client = oai()
    out("oai_session", **oai_round(client, "weather in Paris? (oai session)", "tools-oai"))
    out("oai_one_off", **oai_round(client, "weather in Paris? (oai one-off)", None))
    out("ant_session", **ant_round(ant(), "weather in Paris? (ant session)", "tools-ant"))
    out("ant_one_off", **ant_round(ant(), "weather in Paris? (ant one-off)", None))

    # Streamed: the call arrives as delta.tool_calls chunks.
    chunks = client.chat.completions.create(
        model="agentd", messages=[{"role": "user", "content": "weather in Paris? (oai stream)"}],
        tools=[WEATHER_OAI], stream=True, user="tools-stream")
    calls, finish, text = {}, None, ""
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        text += d.content or ""
        for t in d.tool_calls or []:
            entry = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = t.id or entry["id"]
            if t.function is not None:
                entry["name"] = t.function.name or entry["name"]
                entry["arguments"] += t.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    calls = [calls[i] for i in sorted(calls)]
    out("oai_stream", finish=finish, text=text, calls=calls)
    with ant().messages.stream(
        model="agentd", max_tokens=200, metadata={"user_id": "tools-stream-ant"},
        messages=[{"role": "user", "content": "weather in Paris? (ant stream)"}],
        tools=[WEATHER_ANT],
    ) as s:
        final = s.get_final_message()
    out("ant_stream", stop=final.stop_reason,
        calls=[{"id": b.id, "name": b.name, "input": b.input} for b in final.content if b.type == "tool_use"])

    # A client tool named like one of agentd's own tools.
    clash = dict(WEATHER_OAI, function=dict(WEATHER_OAI["function"], name="session_status"))
    out("clash", **error_of(lambda: client.chat.completions.create(
        model="agentd", messages=[{"role": "user", "content": "clash"}], tools=[clash])))
    # A result for a call the session never made.
    out("unknown_call", **error_of(lambda: client.chat.completions.create(
        model="agentd", tools=[WEATHER_OAI], user="tools-oai",
        messages=[{"role": "user", "content": "x"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_never", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "call_never", "content": "made up"}])))

    # agentd's own tool and a client tool in one answer.
    out("mixed", **oai_round(client, "weather in Paris? (mixed)", "tools-mixed"))


if __name__ == "__main__":
    {"basics": basics, "streaming": streaming, "budget": budget, "responses": responses,
     "structured": structured, "unsupported": unsupported,
     "client_tools": client_tools}[sys.argv[1]]()
