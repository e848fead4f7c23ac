// `toolgate serve` driven directly by the official TypeScript SDK's client
// (`@modelcontextprotocol/client`, pinned in tests/mcp/inspector/package.json
// under the alias `mcp-ts-client`, so the Inspector keeps the client it ships
// with), run with the pinned Node of that directory.
//
// The client runs with the SDK's DEFAULT settings: 2.4.0's
// `versionNegotiation` defaults to mode 'legacy' — no `server/discover`
// probe, the 2025 `initialize` handshake offering 2025-11-25 (the first of its
// SUPPORTED_PROTOCOL_VERSIONS), a stateful session (`Mcp-Session-Id` over
// HTTP) and asks as server-initiated `elicitation/create`. The stateless
// 2026-07-28 revision is opt-in there (`versionNegotiation: { mode: 'auto' }`);
// `--negotiation auto` runs the same checks that way (`server/discover`, the
// per-request `_meta` envelope, asks as `input_required` results answered by
// the SDK's auto-fulfilment through the same elicitation handler).
//
//   node ts_client.mjs --transport stdio|http [--url URL] [--negotiation default|auto] [--tag TAG]
//                      [--extra FILE --plugins DIR]
//
// Environment: TOOLGATE_BIN and TOOLGATE_CONFIG (stdio: the server it
// starts), TOOLGATE_TEST_TOKEN (http: the bearer token of agent `default`).
// The config is host/cli/tests/mcp.rs's: `text.repeat` is denied,
// `notes(op = "add")` asks, `hostile.membomb` is invisible, `hostile.loop`
// runs until its deadline (3 s). With `--extra` (a plugin adding `files.read`)
// and `--plugins` (the served plugin directory), the client's `listChanged`
// handler must see the plugin come and go (`notifications/tools/list_changed`
// to the session, or on 2026-07-28 the `subscriptions/listen` stream the SDK
// opens for it); the directory is left as it was.
//
// Prints one JSON line per check; on a mismatch prints the failed check as
// a JSON line with `"ok": false`, says why on stderr and exits 1.

import { copyFileSync, readFileSync, rmSync } from "node:fs";
import process from "node:process";

const SDK = new URL("./inspector/node_modules/mcp-ts-client/", import.meta.url);
// The paths the package's `exports` map names for `.` and `./stdio` (import).
const { Client, StreamableHTTPClientTransport, ProtocolError } = await import(new URL("dist/index.mjs", SDK));
const { StdioClientTransport } = await import(new URL("dist/stdio.mjs", SDK));

function option(name, fallback) {
    const i = process.argv.indexOf(`--${name}`);
    if (i === -1) {
        if (fallback === undefined) fail("usage", `--${name} is required`);
        return fallback;
    }
    return process.argv[i + 1];
}

const transportKind = option("transport");
const negotiation = option("negotiation", "default");
const tag = option("tag", `${transportKind}-${negotiation}-${process.pid}`);
// What each way of negotiating must end at against toolgate.
const EXPECTED = {
    default: { version: "2025-11-25", era: "legacy" },
    auto: { version: "2026-07-28", era: "modern" },
};
if (!EXPECTED[negotiation]) fail("usage", `--negotiation must be one of ${Object.keys(EXPECTED)}`);

function emit(record) {
    process.stdout.write(JSON.stringify(record) + "\n");
}

function fail(check, why, detail) {
    emit({ check, ok: false, error: why, ...(detail === undefined ? {} : { detail }) });
    process.stderr.write(`ts_client (${transportKind}, ${negotiation}): ${check}: ${why}\n`);
    if (detail !== undefined) process.stderr.write(`  ${JSON.stringify(detail)}\n`);
    process.exit(1);
}

function expect(check, condition, why, detail) {
    if (!condition) fail(check, why, detail);
}

/** JSON equality, whatever the order of object keys. */
function same(a, b) {
    const canonical = (v) => Array.isArray(v) ? v.map(canonical)
        : v !== null && typeof v === "object"
        ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]))
        : v;
    return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function text(result) {
    return (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
}

// The pinned client is the one running.
const pins = JSON.parse(readFileSync(new URL("./inspector/package.json", import.meta.url), "utf8")).dependencies;
const sdkVersion = JSON.parse(readFileSync(new URL("package.json", SDK), "utf8")).version;
expect("sdk", pins["mcp-ts-client"] === `npm:@modelcontextprotocol/client@${sdkVersion}`,
    `installed client ${sdkVersion} is not the pinned one (${pins["mcp-ts-client"]}): run scripts/test`);
emit({ check: "sdk", ok: true, package: "@modelcontextprotocol/client", version: sdkVersion, node: process.version });

function transport() {
    if (transportKind === "stdio") {
        const env = { PATH: process.env.PATH ?? "" };
        for (const k of ["TOOLGATE_TEST_TOKEN", "TOOLGATE_READER_TOKEN"]) if (process.env[k]) env[k] = process.env[k];
        return new StdioClientTransport({
            command: process.env.TOOLGATE_BIN,
            args: ["--config", process.env.TOOLGATE_CONFIG, "serve"],
            env,
            stderr: "inherit",
        });
    }
    if (transportKind === "http") {
        return new StreamableHTTPClientTransport(new URL(option("url")), {
            requestInit: { headers: { Authorization: `Bearer ${process.env.TOOLGATE_TEST_TOKEN}` } },
        });
    }
    fail("usage", "--transport must be stdio or http");
}

// Tool list changes, as the SDK reports them (it refreshes the list itself).
const toolLists = [];
let listChanged = () => {};
// Only the capability an ask needs is declared, and a handler for list
// changes; the protocol revision and everything else is the SDK's default.
const options = {
    capabilities: { elicitation: { form: {} } },
    listChanged: {
        tools: {
            onChanged: (error, tools) => {
                toolLists.push(error ? { error: String(error) } : tools.map((t) => t.name));
                listChanged();
            },
        },
    },
};
if (negotiation === "auto") options.versionNegotiation = { mode: "auto" };
const client = new Client({ name: "toolgate-ts-client-test", version: "0" }, options);

// What the SDK reports outside any call (a message it could not parse or
// route, a failed cancellation, a transport error): a compatible exchange has none.
const sdkErrors = [];
client.onerror = (e) => sdkErrors.push(String(e?.message ?? e));

// The human: each ask takes the next answer; an ask with none left is a failure.
const asked = [];
const answers = [];
client.setRequestHandler("elicitation/create", async (request) => {
    asked.push(request.params);
    const answer = answers.shift();
    if (answer === undefined) fail("elicitation", "asked when no ask was expected", request.params);
    return answer;
});

async function notes() {
    const r = await client.callTool({ name: "notes", arguments: { op: "list" } });
    expect("notes", !r.isError, "notes(op = list) failed", r);
    return JSON.parse(text(r)).notes;
}

async function protocolError(check, name) {
    try {
        const r = await client.callTool({ name, arguments: {} });
        fail(check, `calling \`${name}\` did not fail`, r);
    } catch (e) {
        expect(check, e instanceof ProtocolError, `calling \`${name}\` failed, but not with a protocol error`, String(e));
        expect(check, e.message.includes("unknown tool"), "the error does not say `unknown tool`", e.message);
        return e.code;
    }
}

try {
    await client.connect(transport());
} catch (e) {
    fail("connect", `connect failed: ${e?.stack ?? e}`);
}

try {
    // Initialize (or, with `auto`, `server/discover`): the revision and era toolgate settles on.
    const version = client.getNegotiatedProtocolVersion();
    const era = client.getProtocolEra();
    const server = client.getServerVersion();
    expect("connect", version === EXPECTED[negotiation].version && era === EXPECTED[negotiation].era,
        `negotiated ${version} (${era}); expected ${EXPECTED[negotiation].version} (${EXPECTED[negotiation].era})`);
    expect("connect", server?.name === "toolgate", "the server does not call itself toolgate", server);
    expect("connect", client.getServerCapabilities()?.tools !== undefined, "no tools capability",
        client.getServerCapabilities());
    emit({ check: "connect", ok: true, protocolVersion: version, era, server });

    // tools/list: what the agent sees, and only that.
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name);
    const ids = tools.map((t) => t.title);
    expect("list", ids.join() === [...ids].sort().join(), "not sorted by id", ids);
    for (const n of names) expect("list", /^[a-zA-Z0-9_-]{1,64}$/.test(n), `\`${n}\` is not a name every client takes`, names);
    for (const n of ["text_upper", "text_count", "notes", "hostile_loop"]) {
        expect("list", names.includes(n), `\`${n}\` is not listed`, names);
    }
    for (const n of ["hostile_membomb", "files_read"]) {
        expect("list", !names.includes(n), `\`${n}\` is listed though invisible or absent`, names);
    }
    for (const t of tools) expect("list", t.inputSchema?.type === "object", `${t.name}: inputSchema not an object`, t);
    const count = tools.find((t) => t.name === "text_count");
    expect("list", count?.title === "text.count", "text_count's title is not its id", count);
    expect("list", count.outputSchema?.type === "object", "text.count has no object outputSchema", count);
    expect("list", count.annotations?.readOnlyHint === true, "text.count is not read-only", count.annotations);
    emit({ check: "list", ok: true, tools: names });

    // An allowed call: the Tool's content (and structured content, validated
    // by the SDK against the listed outputSchema).
    const counted = await client.callTool({ name: "text_count", arguments: { text: "a b\nc" } });
    expect("call", !counted.isError, "text.count failed", counted);
    const expected = { chars: 5, words: 3, lines: 2 };
    expect("call", same(counted.structuredContent, expected),
        "unexpected structuredContent", counted);
    expect("call", same(JSON.parse(text(counted)), expected),
        "the text content is not the same JSON", counted);
    const upper = await client.callTool({ name: "text.upper", arguments: { text: "hi" } });
    expect("call", !upper.isError && text(upper) === '"HI"', "text.upper did not return \"HI\"", upper);
    emit({ check: "call", ok: true, structuredContent: counted.structuredContent, text: text(upper) });

    // A denied call: an isError result the model reads, not a protocol error.
    const denied = await client.callTool({ name: "text.repeat", arguments: { text: "a", times: 2 } });
    expect("denied", denied.isError === true && text(denied).includes("denied"), "not an isError result saying denied",
        denied);
    emit({ check: "denied", ok: true, text: text(denied) });

    // Unknown and invisible tools: protocol errors.
    const codes = [await protocolError("unknown", "no.such.tool"), await protocolError("unknown", "hostile.membomb")];
    emit({ check: "unknown", ok: true, codes });

    // An ask, accepted in the client's UI: the call runs once.
    const note = `ts-${tag}`;
    const args = { op: "add", note };
    const before = await notes();
    answers.push({ action: "accept", content: { confirm: true } });
    const approved = await client.callTool({ name: "notes", arguments: args });
    expect("ask-accept", !approved.isError && text(approved).includes(note), "the approved call did not run", approved);
    expect("ask-accept", asked.length === 1, `asked ${asked.length} times, not once`, asked);
    const form = asked[0];
    expect("ask-accept", (form.mode ?? "form") === "form" && form.message.includes("notes") && form.message.includes(note),
        "the ask does not name the tool and its arguments", form);
    expect("ask-accept", form.requestedSchema?.properties?.confirm?.type === "boolean",
        "the form has no boolean `confirm`", form.requestedSchema);
    const after = await notes();
    expect("ask-accept", same(after, [...before, note]), "not executed exactly once",
        { before, after });
    emit({ check: "ask-accept", ok: true, note, message: form.message });

    // The identical call again is a new ask; declined, it is blocked and runs nothing.
    answers.push({ action: "decline" });
    const again = await client.callTool({ name: "notes", arguments: args });
    expect("ask-again-decline", asked.length === 2, "the identical call was not asked anew", { asked, again });
    expect("ask-again-decline", again.isError === true && text(again).includes("blocked"), "not a blocked result",
        again);
    expect("ask-again-decline", (await notes()).filter((n) => n === note).length === 1, "the declined call ran");
    emit({ check: "ask-again-decline", ok: true, text: text(again) });

    // Dismissed in the UI (`cancel`: no choice made): nothing decided, the
    // request stays pending for a later ask or an approver.
    const cancelledNote = `ts-${tag}-cancelled`;
    answers.push({ action: "cancel" });
    const cancelled = await client.callTool({ name: "notes", arguments: { op: "add", note: cancelledNote } });
    expect("ask-cancel", asked.length === 3, "not asked", asked);
    expect("ask-cancel", cancelled.isError === true && text(cancelled).includes("stays pending")
        && !text(cancelled).includes("blocked"), "not a result saying the request stays pending", cancelled);
    expect("ask-cancel", !(await notes()).includes(cancelledNote), "the cancelled call ran");
    emit({ check: "ask-cancel", ok: true, text: text(cancelled) });

    // A long call withdrawn through an AbortSignal: the call ends at once on
    // the client, the server stops the guest (the journal says `cancelled`,
    // checked by test_serve.py) and the session goes on.
    const abort = new AbortController();
    const started = Date.now();
    setTimeout(() => abort.abort(new Error("withdrawn by the test")), 400);
    let outcome;
    try {
        outcome = { result: await client.callTool({ name: "hostile.loop", arguments: {} }, { signal: abort.signal }) };
    } catch (e) {
        outcome = { error: String(e?.message ?? e) };
    }
    const elapsed = Date.now() - started;
    expect("abort", outcome.error !== undefined, "the aborted call returned a result", outcome);
    expect("abort", elapsed < 2500, `the aborted call ended after ${elapsed} ms; the deadline is 3000 ms`, outcome);
    const next = await client.callTool({ name: "text.upper", arguments: { text: "next" } });
    expect("abort", !next.isError && text(next) === '"NEXT"', "the session did not go on after the abort", next);
    expect("abort", asked.length === 3, "something asked after the abort", asked);
    emit({ check: "abort", ok: true, endedAfterMs: elapsed, error: outcome.error });

    // The plugin directory changes: the client hears of it and lists the new tool.
    const extra = option("extra", "");
    if (extra) {
        const plugin = `${option("plugins")}/files.wasm`;
        const until = (check, want) => new Promise((resolve) => {
            const timer = setTimeout(() => fail(check, "no list change reached the client within 20 s", toolLists),
                20000);
            listChanged = () => {
                const last = toolLists.at(-1);
                if (Array.isArray(last) && want(last)) {
                    clearTimeout(timer);
                    resolve(last);
                }
            };
        });
        const added = until("list-changed", (names) => names.includes("files_read"));
        copyFileSync(extra, plugin);
        let removed;
        try {
            const names = await added;
            emit({ check: "list-changed", ok: true, added: names.filter((n) => n.startsWith("files_")) });
        } finally {
            removed = until("list-changed-back", (names) => !names.includes("files_read"));
            rmSync(plugin);
        }
        await removed;
        emit({ check: "list-changed-back", ok: true });
    }
} catch (e) {
    fail("unexpected", `${e?.stack ?? e}`);
}

// An HTTP session (2025-11-25) is ended by the client as the revision says: DELETE.
const t = client.transport;
if (t instanceof StreamableHTTPClientTransport && t.sessionId !== undefined) {
    const session = t.sessionId;
    try {
        await t.terminateSession();
    } catch (e) {
        fail("end-session", `DELETE of the session failed: ${e?.message ?? e}`);
    }
    emit({ check: "end-session", ok: true, session });
}
await client.close();
expect("sdk-errors", sdkErrors.length === 0, "the SDK reported errors", sdkErrors);
emit({ check: "done", ok: true });
