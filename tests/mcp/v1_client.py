"""`toolgate serve` driven by the last release of the MCP Python SDK's 1.x
line (pinned in tests/requirements-mcp1.txt, its own venv `.venv-mcp1`):
the `ClientSession` API that agent frameworks built on 1.x still use
(LangChain's MCP adapters, the OpenAI Agents SDK, many desktop hosts), which
negotiates with `initialize` and takes 2024-11-05 to 2025-11-25.

`--version V` makes the session ask for an older revision, as a client
built on an older SDK does; the server must answer with it (or the client
disconnects). Prints one JSON line per check; exits 1 at the first failure.
Run by test_serve.py with TOOLGATE_BIN, TOOLGATE_CONFIG and, for HTTP,
--url and TOOLGATE_TEST_TOKEN.
"""

import argparse
import asyncio
import json
import os
import sys
from datetime import timedelta

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError


def emit(record):
    print(json.dumps(record), flush=True)


def fail(check, message, detail=None):
    emit({"check": check, "ok": False, "message": message, "detail": repr(detail)})
    sys.exit(1)


def expect(check, ok, message, detail=None):
    if not ok:
        fail(check, message, detail)


def text(result):
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def run(args):
    # What an older client asks for: the SDK sends LATEST_PROTOCOL_VERSION.
    if args.version:
        types.LATEST_PROTOCOL_VERSION = args.version
    asked = []
    answers = []

    async def elicit(_context, params):
        asked.append(params)
        if not answers:
            fail("elicitation", "asked when no ask was expected", params)
        return answers.pop(0)

    if args.transport == "stdio":
        params = StdioServerParameters(command=os.environ["TOOLGATE_BIN"],
                                       args=["--config", os.environ["TOOLGATE_CONFIG"], "serve"],
                                       env={k: v for k, v in os.environ.items()
                                            if k in ("PATH", "TOOLGATE_TEST_TOKEN", "TOOLGATE_READER_TOKEN")})
        transport = stdio_client(params)
    else:
        headers = {"Authorization": f"Bearer {os.environ['TOOLGATE_TEST_TOKEN']}"}
        transport = streamablehttp_client(args.url, headers=headers)
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=60),
                                 elicitation_callback=elicit,
                                 client_info=types.Implementation(name="toolgate-py1-client-test",
                                                                  version="0")) as session:
            init = await session.initialize()
            want = args.version or types.LATEST_PROTOCOL_VERSION
            expect("connect", init.protocolVersion == want,
                   f"negotiated {init.protocolVersion}, asked for {want}", init)
            expect("connect", init.serverInfo.name == "toolgate", "the server does not call itself toolgate", init)
            expect("connect", init.capabilities.tools is not None, "no tools capability", init.capabilities)
            emit({"check": "connect", "ok": True, "protocolVersion": init.protocolVersion})

            tools = (await session.list_tools()).tools
            names = [t.name for t in tools]
            for n in ["text_upper", "text_count", "notes"]:
                expect("list", n in names, f"`{n}` is not listed", names)
            expect("list", "hostile_membomb" not in names, "an invisible tool is listed", names)
            emit({"check": "list", "ok": True, "tools": names})

            counted = await session.call_tool("text_count", {"text": "a b\nc"})
            expect("call", not counted.isError, "text.count failed", counted)
            expect("call", json.loads(text(counted)) == {"chars": 5, "words": 3, "lines": 2},
                   "unexpected text content", counted)
            upper = await session.call_tool("text.upper", {"text": "hi"})
            expect("call", not upper.isError and text(upper) == '"HI"', 'text.upper did not return "HI"', upper)
            emit({"check": "call", "ok": True, "structuredContent": counted.structuredContent})

            denied = await session.call_tool("text.repeat", {"text": "a", "times": 2})
            expect("denied", denied.isError and "denied" in text(denied), "not an isError result saying denied",
                   denied)
            emit({"check": "denied", "ok": True})

            try:
                r = await session.call_tool("no.such.tool", {})
                fail("unknown", "calling an unknown tool did not fail", r)
            except McpError as e:
                expect("unknown", "unknown tool" in str(e), "the error does not say `unknown tool`", str(e))
            emit({"check": "unknown", "ok": True})

            # An ask. Revisions before 2025-06-18 have no elicitation: the
            # server must not send one; the call is refused, the request pending.
            note = f"py1-{args.tag}"
            answers.append(types.ElicitResult(action="accept", content={"confirm": True}))
            approved = await session.call_tool("notes", {"op": "add", "note": note})
            listed = json.loads(text(await session.call_tool("notes", {"op": "list"})))["notes"]
            if asked:
                expect("ask", not approved.isError and note in text(approved), "the approved call did not run",
                       approved)
                expect("ask", listed.count(note) == 1, "not executed exactly once", listed)
                answers.append(types.ElicitResult(action="decline"))
                again = await session.call_tool("notes", {"op": "add", "note": note})
                expect("ask", len(asked) == 2, "the identical call was not asked anew", asked)
                expect("ask", again.isError and "blocked" in text(again), "a declined ask is not blocked", again)
                emit({"check": "ask", "ok": True, "asked": True})
            else:
                answers.clear()
                expect("ask", approved.isError and "needs human approval" in text(approved),
                       "an ask the client was not asked is not refused as needing approval", approved)
                expect("ask", note not in listed, "the call ran without approval", listed)
                expect("ask", "tkt-" not in text(approved), "the refusal shows a ticket", approved)
                emit({"check": "ask", "ok": True, "asked": False})
    emit({"check": "done", "ok": True})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--transport", choices=["stdio", "http"], required=True)
    p.add_argument("--url")
    p.add_argument("--version")
    p.add_argument("--tag", default=str(os.getpid()))
    asyncio.run(asyncio.wait_for(run(p.parse_args()), 120))


if __name__ == "__main__":
    main()
