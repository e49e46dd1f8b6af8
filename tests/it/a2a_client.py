"""The official A2A Python SDK (`a2a-sdk`, the 0.3 line: A2A 0.3.0) against a running agentd
(SPEC §23), configured as docs/recipes.md says. Run by tests/it/a2a.rs with DEST/a2a/py of
scripts/install-test-peers.sh on PYTHONPATH. Environment: AGENTD_BASE, AGENTD_TOKEN. Prints
one JSON object per step; `raw_*` steps carry the endpoint's own JSON for schema checks.
The step `disconnected` is the cue for the test to release the held answer.
"""

import asyncio
import json
import os
import uuid

import httpx
from a2a.client import A2ACardResolver, A2AClientHTTPError, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import (
    Message,
    MessageSendConfiguration,
    Part,
    Role,
    TaskIdParams,
    TaskQueryParams,
    TextPart,
)

BASE = os.environ["AGENTD_BASE"]
TOKEN = os.environ["AGENTD_TOKEN"]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def out(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def message(text, context_id=None):
    return Message(
        role=Role.user,
        parts=[Part(root=TextPart(text=text))],
        message_id=str(uuid.uuid4()),
        context_id=context_id,
    )


def dump(task):
    return task.model_dump(mode="json", exclude_none=True, by_alias=True)


def texts(task):
    return "".join(
        p.root.text for a in (task.artifacts or []) for p in a.parts if p.root.kind == "text"
    )


async def last_task(client, msg, configuration=None):
    task = None
    async for event in client.send_message(msg, configuration=configuration):
        task = event[0] if isinstance(event, tuple) else event
    return task


async def cards(http, authed):
    public = await A2ACardResolver(http, BASE).get_agent_card()
    out("card_public", card=public.model_dump(mode="json", exclude_none=True, by_alias=True))
    card = await A2ACardResolver(authed, BASE).get_agent_card()
    client = ClientFactory(ClientConfig(httpx_client=authed, streaming=False)).create(card)
    full = await client.get_card()
    out("card_full", card=full.model_dump(mode="json", exclude_none=True, by_alias=True))
    out("raw_card_public", body=(await http.get(BASE + "/.well-known/agent-card.json")).json())
    out("raw_card_full", body=(await authed.get(BASE + "/.well-known/agent-card.json")).json())
    return card


async def conversation(authed, card):
    client = ClientFactory(ClientConfig(httpx_client=authed, streaming=False)).create(card)
    first = await last_task(client, message("a2a first"))
    out("send", task=dump(first), text=texts(first))
    second = await last_task(client, message("a2a second", first.context_id))
    out("send_again", task=dump(second), text=texts(second))
    got = await client.get_task(TaskQueryParams(id=first.id))
    out("get", task=dump(got), text=texts(got))
    try:
        await client.cancel_task(TaskIdParams(id=first.id))
        out("cancel_done", code=None)
    except A2AClientJSONRPCError as e:
        out("cancel_done", code=e.error.code, message=e.error.message)
    try:
        await client.get_task(TaskQueryParams(id="nope~nothing"))
        out("get_unknown", code=None)
    except A2AClientJSONRPCError as e:
        out("get_unknown", code=e.error.code)

    streaming = ClientFactory(ClientConfig(httpx_client=authed, streaming=True)).create(card)
    kinds, task = [], None
    async for task, update in streaming.send_message(message("a2a streamed")):
        kinds.append(update.kind if update else "task")
    out("stream", kinds=kinds, task=dump(task), text=texts(task))


async def cancel(authed, card):
    client = ClientFactory(ClientConfig(httpx_client=authed, streaming=False)).create(card)
    held = await last_task(
        client, message("a2a hold cancel"), MessageSendConfiguration(blocking=False)
    )
    out("submitted", task=dump(held))
    # A second task of the same context waits behind the held one: not cancelable yet, and
    # cancelling the held one never stops it.
    queued = await last_task(
        client,
        message("a2a after hold", held.context_id),
        MessageSendConfiguration(blocking=False),
    )
    try:
        await client.cancel_task(TaskIdParams(id=queued.id))
        out("cancel_queued", code=None)
    except A2AClientJSONRPCError as e:
        out("cancel_queued", code=e.error.code, message=e.error.message)
    for _ in range(600):
        try:
            task = await client.cancel_task(TaskIdParams(id=held.id))
            break
        except A2AClientJSONRPCError as e:
            if e.error.code != -32002 or "queued" not in e.error.message:
                raise
            await asyncio.sleep(0.1)
    out("cancel", task=dump(task))
    for _ in range(1200):
        after = await client.get_task(TaskQueryParams(id=queued.id))
        if after.status.state.value != "working":
            break
        await asyncio.sleep(0.1)
    out("after_cancel", task=dump(after), text=texts(after))


async def disconnect(authed):
    """A stream the client leaves after the first event: the message is answered anyway."""
    body = rpc("message/stream", {"message": raw_message("a2a hold disconnect")})
    async with authed.stream("POST", BASE + "/a2a", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                task = json.loads(line[5:])["result"]
                break
    out("disconnected", task=task)
    client = authed
    for _ in range(1200):
        got = (await client.post(BASE + "/a2a", json=rpc("tasks/get", {"id": task["id"]}))).json()
        if got["result"]["status"]["state"] == "completed":
            break
        await asyncio.sleep(0.1)
    out("after_disconnect", body=got)


def rpc(method, params):
    return {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}


def raw_message(text, **extra):
    return {
        "kind": "message",
        "role": "user",
        "messageId": str(uuid.uuid4()),
        "parts": [{"kind": "text", "text": text}],
        **extra,
    }


async def raw(http, authed):
    """The endpoint's own JSON, for the schema check, and the refusals."""
    post = lambda body, c=authed: c.post(BASE + "/a2a", json=body)
    sent = (await post(rpc("message/send", {"message": raw_message("a2a raw")}))).json()
    out("raw_send", body=sent)
    task_id = sent["result"]["id"]
    first = sent["result"]["history"][0]
    again = {"message": raw_message("a2a raw", messageId=first["messageId"], contextId=first["contextId"])}
    out("raw_retry", body=(await post(rpc("message/send", again))).json())
    again["message"]["parts"] = [{"kind": "text", "text": "a2a other"}]
    out("raw_reused_id", body=(await post(rpc("message/send", again))).json())
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    picture = raw_message("a2a picture")
    picture["parts"].append({"kind": "file", "file": {"bytes": png, "mimeType": "image/png"}})
    out("raw_picture", body=(await post(rpc("message/send", {"message": picture}))).json())
    out("raw_get", body=(await post(rpc("tasks/get", {"id": task_id, "historyLength": 1}))).json())
    out("raw_cancel", body=(await post(rpc("tasks/cancel", {"id": task_id}))).json())
    out("raw_unknown_method", body=(await post(rpc("tasks/nothing", {}))).json())
    data = raw_message("x")
    data["parts"] = [{"kind": "data", "data": {"a": 1}}]
    out("raw_data_part", body=(await post(rpc("message/send", {"message": data}))).json())
    parse = await authed.post(BASE + "/a2a", content=b"{not json")
    out("raw_parse_error", body=parse.json())
    events = []
    body = rpc("message/stream", {"message": raw_message("a2a raw stream")})
    async with authed.stream("POST", BASE + "/a2a", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    out("raw_stream", events=events)
    bad = httpx.AsyncClient(headers={"Authorization": "Bearer wrong"}, timeout=120)
    r = await bad.post(BASE + "/a2a", json=rpc("tasks/get", {"id": task_id}))
    out("raw_bad_token", status=r.status_code)


async def bad_token(card):
    wrong = httpx.AsyncClient(headers={"Authorization": "Bearer wrong-token"}, timeout=120)
    client = ClientFactory(ClientConfig(httpx_client=wrong, streaming=False)).create(card)
    try:
        await last_task(client, message("a2a never"))
        out("bad_token", status=None)
    except A2AClientHTTPError as e:
        out("bad_token", status=e.status_code)


async def main():
    async with httpx.AsyncClient(timeout=120) as http, httpx.AsyncClient(
        headers=AUTH, timeout=120
    ) as authed:
        card = await cards(http, authed)
        await conversation(authed, card)
        await cancel(authed, card)
        await raw(http, authed)
        await bad_token(card)
        await disconnect(authed)


asyncio.run(main())
