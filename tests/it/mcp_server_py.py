"""agentd's MCP server driven by the official Python MCP SDK (PyPI `mcp`), for
tests/it/mcp_server.rs. Prints one JSON line per step: `{"step": NAME, ...}`.

usage: mcp_server_py.py stdio|http|refusals
  stdio: starts `$AGENTD_BIN mcp -c $AGENTD_CONFIG` (state directory from $AGENTD_STATE_DIR)
  http, refusals: `$AGENTD_BASE/mcp` with the bearer token $AGENTD_TOKEN
"""

import json
import os
import sys

import anyio
import mcp_types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

WAIT = 120


def step(name, **kw):
    print(json.dumps({"step": name, **kw}), flush=True)


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def exercise(streams, label):
    updated = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.set()

    read, write = streams
    async with ClientSession(read, write, message_handler=on_message) as session:
        init = await session.initialize()
        step("init", server=init.server_info.name, protocol=init.protocol_version)
        tools = await session.list_tools()
        step("tools", names=sorted(t.name for t in tools.tools),
             strict=all(t.input_schema.get("additionalProperties") is False for t in tools.tools))
        resources = await session.list_resources()
        templates = await session.list_resource_templates()
        step("resources", uris=[str(r.uri) for r in resources.resources],
             templates=[t.uri_template for t in templates.resource_templates])
        prompts = await session.list_prompts()
        step("prompts", names=[p.name for p in prompts.prompts])
        prompt = await session.get_prompt("example")
        step("prompt", text=prompt.messages[0].content.text[:200])

        progress = []

        async def on_progress(value, total, message):
            progress.append(message)

        r = await session.call_tool("ask", {"message": f"mcp hello {label}"},
                                    progress_callback=on_progress)
        step("ask", text=text_of(r), structured=r.structured_content, is_error=r.is_error,
             progress=progress)

        try:
            await session.call_tool("send", {"message": "mcp queued", "bogus": 1})
            step("strict", refused=False)
        except MCPError as e:
            step("strict", refused=True, error=str(e))

        r = await session.call_tool("memory_search", {"query": "zebra password"})
        step("memory_search", is_error=r.is_error, text=text_of(r)[:2000])

        r = await session.call_tool("cost", {"period": "all"})
        step("cost", is_error=r.is_error, structured=r.structured_content)

        memory = [str(r.uri) for r in resources.resources if "memory/" in str(r.uri)]
        read_memory = await session.read_resource(memory[0]) if memory else None
        step("memory_file", uri=memory[0] if memory else None,
             text=read_memory.contents[0].text[:500] if read_memory else None)
        monitor = await session.read_resource("agentd://monitor")
        step("monitor", json=json.loads(monitor.contents[0].text))

        await session.subscribe_resource("agentd://monitor")
        r = await session.call_tool("ask", {"message": "mcp update", "session": f"mcp-{label}-2"})
        with anyio.fail_after(WAIT):
            await updated.wait()
        step("updated", reply=text_of(r))

        trail = await session.read_resource(f"agentd://sessions/mcp-{label}-2/trail")
        step("trail", json=json.loads(trail.contents[0].text))

        # Cancellation: once the slow message reports progress, the call is cancelled (the SDK
        # sends notifications/cancelled), which must stop the message as /stop does.
        started = anyio.Event()

        async def on_slow(value, total, message):
            started.set()

        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def slow():
                with scope:
                    await session.call_tool("ask", {"message": "mcp slow",
                                                    "session": f"mcp-{label}-slow"},
                                            progress_callback=on_slow)

            tg.start_soon(slow)
            with anyio.fail_after(WAIT):
                await started.wait()
            scope.cancel()
        step("cancelled")
        # The session answers again (what was running was stopped, not left hanging).
        with anyio.fail_after(WAIT):
            while True:
                r = await session.call_tool("history", {"session": f"mcp-{label}-slow"})
                events = (r.structured_content or {}).get("events", [])
                if any("Stopped." in json.dumps(e) for e in events):
                    break
                await anyio.sleep(0.2)
        step("stopped")


async def refused(headers, what):
    client = create_mcp_http_client(headers=headers)
    try:
        with anyio.fail_after(WAIT):
            async with streamable_http_client(os.environ["AGENTD_BASE"] + "/mcp",
                                              http_client=client) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
        step(what, refused=False)
    except BaseException as e:  # noqa: BLE001 - the SDK wraps the HTTP error in groups
        step(what, refused=True, error=repr(e)[:500])


async def main():
    mode = sys.argv[1]
    token = os.environ.get("AGENTD_TOKEN", "")
    if mode == "stdio":
        params = StdioServerParameters(
            command=os.environ["AGENTD_BIN"],
            args=["mcp", "-c", os.environ["AGENTD_CONFIG"]],
            env={"AGENTD_STATE_DIR": os.environ["AGENTD_STATE_DIR"]},
        )
        async with stdio_client(params) as streams:
            await exercise(streams, "stdio")
    elif mode == "http":
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with streamable_http_client(os.environ["AGENTD_BASE"] + "/mcp",
                                          http_client=client) as streams:
            await exercise(streams, "http")
    elif mode == "refusals":
        await refused({"Authorization": "Bearer wrong-token"}, "bad_token")
        await refused({"Authorization": f"Bearer {token}", "Origin": "http://evil.example"},
                      "bad_origin")
        await refused({"Authorization": f"Bearer {token}",
                       "Origin": os.environ["AGENTD_BASE"]}, "own_origin")
    step("done")


anyio.run(main)
