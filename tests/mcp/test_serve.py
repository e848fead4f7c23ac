"""`toolgate serve` driven by the official MCP Python SDK over stdio.

Run by host/tests/mcp.rs, which builds the plugin directory and the config and
passes them in TOOLGATE_BIN, TOOLGATE_CONFIG and TOOLGATE_EXTRA.
"""

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess

import jsonschema
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import McpError

BIN = os.environ["TOOLGATE_BIN"]
CONFIG = os.environ["TOOLGATE_CONFIG"]
EXTRA = os.environ["TOOLGATE_EXTRA"]
# The approver's key (listed in the config's `[approval] keys`) and the journal.
APPROVER_KEY = os.environ["TOOLGATE_APPROVER_KEY"]
JOURNAL = os.path.join(os.path.dirname(CONFIG), "journal.db")
PARAMS = StdioServerParameters(command=BIN, args=["--config", CONFIG, "serve"], env={"PATH": os.environ.get("PATH", "")})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def session(elicit=None, on_message=None, body=None):
    async with stdio_client(PARAMS) as (read, write):
        kwargs = {}
        if elicit is not None:
            kwargs["elicitation_callback"] = elicit
        if on_message is not None:
            kwargs["message_handler"] = on_message
        async with ClientSession(read, write, **kwargs) as s:
            init = await s.initialize()
            assert init.protocolVersion in ("2025-06-18", "2025-11-25"), init.protocolVersion
            return await body(s)


def text(result):
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def test_list_shows_the_snapshot_with_valid_schemas():
    async def body(s):
        tools = (await s.list_tools()).tools
        names = sorted(t.name for t in tools)
        assert "text.upper" in names and "notes" in names
        assert "hostile.membomb" not in names, "invisible tools are not listed"
        for t in tools:
            assert t.inputSchema["type"] == "object"
            jsonschema.validators.validator_for(t.inputSchema).check_schema(t.inputSchema)
            if t.outputSchema is not None:
                assert t.outputSchema["type"] == "object"
                jsonschema.validators.validator_for(t.outputSchema).check_schema(t.outputSchema)
        count = next(t for t in tools if t.name == "text.count")
        assert count.outputSchema is not None
        assert count.annotations.readOnlyHint is True

    run(session(body=body))


def test_call_returns_content_and_structured_content():
    async def body(s):
        r = await s.call_tool("text.count", {"text": "a b\nc"})
        assert not r.isError
        assert r.structuredContent == {"chars": 5, "words": 3, "lines": 2}
        assert json.loads(text(r)) == r.structuredContent
        r = await s.call_tool("text.upper", {"text": "hi"})
        assert not r.isError and text(r) == '"HI"'

    run(session(body=body))


def test_denied_tool_and_invalid_arguments_are_is_error_results():
    async def body(s):
        r = await s.call_tool("text.repeat", {"text": "a", "times": 2})
        assert r.isError and "denied" in text(r)
        r = await s.call_tool("text.upper", {"wrong": 1})
        assert r.isError and "invalid arguments" in text(r)

    run(session(body=body))


def test_unknown_and_invisible_tools_are_protocol_errors():
    async def body(s):
        for name in ["no.such.tool", "hostile.membomb"]:
            with pytest.raises(McpError) as e:
                await s.call_tool(name, {})
            assert "unknown tool" in str(e.value)

    run(session(body=body))


def test_ask_approved_through_elicitation_executes_exactly_once():
    asked = []

    async def elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def body(s):
        before = json.loads(text(await s.call_tool("notes", {"op": "list"})))["notes"]
        r = await s.call_tool("notes", {"op": "add", "note": "approved"})
        assert not r.isError, text(r)
        after = json.loads(text(await s.call_tool("notes", {"op": "list"})))["notes"]
        assert after == before + ["approved"], "executed once"
        assert len(asked) == 1 and "notes" in asked[0] and "approved" in asked[0]
        # The journal records the client's UI as the approver.
        with sqlite3.connect(JOURNAL) as db:
            by, via = db.execute(
                "SELECT approved_by, approved_via FROM steps WHERE approved_via IS NOT NULL ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        assert via == "mcp-elicitation" and by, (by, via)

    run(session(elicit=elicit, body=body))


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_ask_declined_or_cancelled_commits_a_blocked_result(action):
    async def elicit(context, params):
        return types.ElicitResult(action=action)

    async def body(s):
        before = json.loads(text(await s.call_tool("notes", {"op": "list"})))["notes"]
        r = await s.call_tool("notes", {"op": "add", "note": "never"})
        assert r.isError and "blocked" in text(r)
        after = json.loads(text(await s.call_tool("notes", {"op": "list"})))["notes"]
        assert after == before

    run(session(elicit=elicit, body=body))


def test_a_client_without_elicitation_never_sees_the_ticket_and_its_retry_gets_the_result():
    async def body(s):
        args = {"op": "add", "note": "later"}
        r = await s.call_tool("notes", args)
        assert r.isError and "awaiting human approval" in text(r), text(r)
        with sqlite3.connect(JOURNAL) as db:
            ticket, request = db.execute(
                "SELECT ticket_id, call_id FROM awaiting WHERE state = 'pending' ORDER BY rowid DESC LIMIT 1"
            ).fetchone()
            step_texts = [row[0] for row in db.execute("SELECT result FROM steps")]
        assert request in text(r), "the model reads the correlation id"
        assert ticket not in json.dumps(r.model_dump()), "no ticket in the MCP result"
        assert not any(ticket in t for t in step_texts), "no ticket in the model-facing journal text"
        # Asking again while undecided: the same request, no second ticket.
        again = await s.call_tool("notes", args)
        assert request in text(again) and ticket not in text(again)
        # An approver decides out of band, with the approver key.
        out = subprocess.run(
            [BIN, "--config", CONFIG, "approve", ticket, "--key", APPROVER_KEY], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        # The identical call now gets the approved call's result, once.
        done = await s.call_tool("notes", args)
        assert not done.isError and "later" in text(done), text(done)
        asks_again = await s.call_tool("notes", args)
        assert asks_again.isError and "awaiting human approval" in text(asks_again)

    run(session(body=body))


def test_guest_output_never_enters_the_protocol_stream():
    async def body(s):
        r = await s.call_tool("hostile.chatter", {})
        assert not r.isError and text(r) == '"chatted"'
        assert len((await s.list_tools()).tools) > 0

    run(session(body=body))


def test_stuck_calls_do_not_block_other_requests():
    async def body(s):
        loops = [asyncio.create_task(s.call_tool("hostile.loop", {})) for _ in range(2)]
        await asyncio.sleep(0.3)
        tools = await s.list_tools()
        r = await s.call_tool("text.upper", {"text": "alive"})
        assert tools.tools and not r.isError
        assert not any(t.done() for t in loops), "answered while both loops were still running"
        for t in loops:
            res = await t
            assert res.isError and "deadline" in text(res)

    run(session(body=body))


def test_plugin_directory_changes_notify_the_client():
    changed = asyncio.Event()

    async def on_message(message):
        if isinstance(message, types.ServerNotification) and isinstance(message.root, types.ToolListChangedNotification):
            changed.set()

    async def body(s):
        names = {t.name for t in (await s.list_tools()).tools}
        assert "files.read" not in names
        plugins = os.path.join(os.path.dirname(CONFIG), "plugins")
        shutil.copy(EXTRA, os.path.join(plugins, "files.wasm"))
        try:
            await asyncio.wait_for(changed.wait(), 20)
            names = {t.name for t in (await s.list_tools()).tools}
            assert "files.read" in names
        finally:
            os.remove(os.path.join(plugins, "files.wasm"))

    run(session(on_message=on_message, body=body))


def test_the_server_exits_cleanly_when_stdin_closes():
    async def body():
        proc = await asyncio.create_subprocess_exec(
            BIN, "--config", CONFIG, "serve",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        proc.stdin.write((json.dumps(init) + "\n").encode())
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert json.loads(line)["result"]["protocolVersion"] == "2025-06-18"
        proc.stdin.close()
        code = await asyncio.wait_for(proc.wait(), 30)
        assert code == 0

    run(body())
