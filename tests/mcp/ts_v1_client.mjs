// `toolgate serve` driven by the TypeScript SDK's v1 line
// (`@modelcontextprotocol/sdk` 1.32.2, pinned in tests/mcp/inspector/package.json
// under the alias `mcp-ts-sdk-v1`), the client Claude Code, Claude Desktop and
// Cursor build on, with its default settings, run with the pinned Node of
// that directory.
//
//   node ts_v1_client.mjs --transport stdio|http [--url URL] [--cycles N]
//
// Connects, lists the tools, calls an allowed tool and a denied one (an
// isError result saying denied). Over HTTP it then connects and closes N
// more times (default 0) as the client does: its transport's close() sends
// no DELETE, so each leaves its session behind; every one must connect and
// call. Environment: TOOLGATE_BIN and TOOLGATE_CONFIG (stdio: the server it
// starts), TOOLGATE_TEST_TOKEN (http: the bearer token of agent `default`).
// The config is host/cli/tests/mcp.rs's.
//
// Prints one JSON line per check; on a mismatch prints the failed check as
// a JSON line with `"ok": false`, says why on stderr and exits 1.

import process from "node:process";

const SDK = new URL("./inspector/node_modules/mcp-ts-sdk-v1/dist/esm/", import.meta.url);
const { Client } = await import(new URL("client/index.js", SDK));
const { StreamableHTTPClientTransport } = await import(new URL("client/streamableHttp.js", SDK));
const { StdioClientTransport } = await import(new URL("client/stdio.js", SDK));

function option(name, fallback) {
    const i = process.argv.indexOf(`--${name}`);
    if (i === -1) {
        if (fallback === undefined) fail("usage", `--${name} is required`);
        return fallback;
    }
    return process.argv[i + 1];
}

const transportKind = option("transport");
const cycles = Number(option("cycles", "0"));

function emit(record) {
    process.stdout.write(JSON.stringify(record) + "\n");
}

function fail(check, why, detail) {
    emit({ check, ok: false, error: why, ...(detail === undefined ? {} : { detail }) });
    process.stderr.write(`ts_v1_client (${transportKind}): ${check}: ${why}\n`);
    if (detail !== undefined) process.stderr.write(`  ${JSON.stringify(detail)}\n`);
    process.exit(1);
}

function expect(check, condition, why, detail) {
    if (!condition) fail(check, why, detail);
}

function transport() {
    if (transportKind === "stdio") {
        return new StdioClientTransport({
            command: process.env.TOOLGATE_BIN,
            args: ["--config", process.env.TOOLGATE_CONFIG, "serve"],
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

const text = (r) => (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");

async function connect(check) {
    const client = new Client({ name: "toolgate-ts-v1-client-test", version: "1.0.0" });
    try {
        await client.connect(transport());
    } catch (e) {
        fail(check, `connect failed: ${e?.message ?? e}`);
    }
    return client;
}

const client = await connect("connect");
const version = client.transport?.protocolVersion ?? null;
emit({ check: "connect", ok: true, protocolVersion: version, server: client.getServerVersion()?.name });

const { tools } = await client.listTools();
const names = tools.map((t) => t.name);
for (const n of ["text_upper", "text_count", "notes"]) {
    expect("list", names.includes(n), `\`${n}\` is not listed`, names);
}
expect("list", !names.includes("hostile_membomb"), "an invisible tool is listed", names);
emit({ check: "list", ok: true, tools: names.length });

const counted = await client.callTool({ name: "text_count", arguments: { text: "a b\nc" } });
expect("call", !counted.isError, "text.count failed", counted);
const c = counted.structuredContent;
expect("call", c?.chars === 5 && c?.words === 3 && c?.lines === 2, "text.count's result is wrong", counted);
emit({ check: "call", ok: true, structuredContent: c });

const denied = await client.callTool({ name: "text_repeat", arguments: { text: "a", times: 2 } });
expect("denied", denied.isError === true && text(denied).includes("denied"), "not an isError result saying denied",
    denied);
emit({ check: "denied", ok: true });
await client.close();

// The client's close(): no DELETE, the session stays on the server.
for (let n = 0; n < cycles; n++) {
    const again = await connect(`cycle-${n}`);
    const r = await again.callTool({ name: "text_upper", arguments: { text: "hi" } });
    expect(`cycle-${n}`, !r.isError && text(r) === '"HI"', "text.upper did not return \"HI\"", r);
    await again.close();
}
if (cycles > 0) emit({ check: "cycles", ok: true, cycles });
emit({ check: "done", ok: true });
process.exit(0);
