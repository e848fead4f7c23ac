"""`toolgate serve` through a real MCP client (the official Python SDK):
start-up (process spawn to the first `tools/list` answer) with a directory of
generated components, and the per-call cost above a trivial MCP server driven
by the same client on the same machine, over stdio and Streamable HTTP, with
the in-memory store and with the durable journal (whose fsyncs per call are
counted with strace).

Usage: bench_serve.py TOOLGATE_BIN CONFIG CALLS RUST_TRIVIAL_BIN [FLOOR_BIN COMPONENT]
(run by scripts/bench, after the `scale` bench generated target/scale/dir20).
Two baselines: `host/cli/examples/trivial_mcp_server.rs` (the same Rust SDK
as toolgate, one in-process tool, the same transport: the stricter
comparison, used for the target) and `trivial_server.py` (the Python SDK,
stdio). With FLOOR_BIN, also `host/cli/examples/wasm_floor_mcp_server.rs`
running COMPONENT: the same rmcp server with each call in a fresh wasmtime
instance and nothing else, the floor of any host that sandboxes every call.
Prints Markdown table rows and writes JSON next to CONFIG.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

HERE = os.path.dirname(os.path.abspath(__file__))
# The SDK's default: `server/discover`, then 2026-07-28 (the handshake on older servers).
MODE = os.environ.get("MCP_MODE", "auto")
TOKEN = "bench-token-0123456789abcdef"
ENV = {"PATH": os.environ.get("PATH", ""), "TOOLGATE_BENCH_TOKEN": TOKEN}


def variant(config: str, name: str, durable: bool, durability: str = "machine") -> str:
    """A copy of CONFIG next to it: HTTP auth for the agent, and the store
    (with its `durability`)."""
    with open(config) as f:
        text = f.read()
    if durable:
        text = text.replace('store = ":memory:"', f'store = "{name}.db"\ndurability = "{durability}"')
    text += '\n[[serve.auth]]\nagent = "default"\ntoken = { env = "TOOLGATE_BENCH_TOKEN" }\n'
    out = os.path.join(os.path.dirname(config), f"{name}.toml")
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(os.path.join(os.path.dirname(config), f"{name}.db{suffix}"))
        except FileNotFoundError:
            pass
    with open(out, "w") as f:
        f.write(text)
    return out


class HttpServer:
    """A server process announcing `serving MCP on URL` on stderr."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=ENV, text=True)
        announced = threading.Event()

        def drain():
            for line in self.proc.stderr:
                if "serving MCP on " in line:
                    self.url = line.split("serving MCP on ", 1)[1].strip()
                    announced.set()

        threading.Thread(target=drain, daemon=True).start()
        if not announced.wait(60):
            self.proc.kill()
            raise SystemExit(f"{argv[0]} did not start serving")

    def client(self):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        return Client(streamable_http_client(self.url, http_client=http), mode=MODE)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stdio(argv):
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=ENV)
    return lambda: Client(params, mode=MODE)


async def startup(client, expect_tools: int) -> float:
    t = time.perf_counter()
    async with client() as s:
        tools = await s.list_tools()
        elapsed = time.perf_counter() - t
        assert len(tools.tools) == expect_tools, len(tools.tools)
    return elapsed


async def per_call(client, tool: str, calls: int) -> list[float]:
    async with client() as s:
        for _ in range(50):  # warm-up (and the first, compiling or cache-loading call)
            res = await s.call_tool(tool, {"text": "hello"})
            assert not res.is_error, res
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            res = await s.call_tool(tool, {"text": "hello"})
            out.append(time.perf_counter() - t)
            assert not res.is_error, res
        return out


async def paired(a, tool_a: str, b, tool_b: str, calls: int) -> list[float]:
    """Per-call cost of server `a` above server `b`: both sessions open at
    once, calls alternating a, b, a, b…, so both see the same machine at the
    same moment; each pair's difference, a minus b."""
    async with a() as sa, b() as sb:
        for _ in range(50):  # warm-up (and the first, compiling or cache-loading call)
            assert not (await sa.call_tool(tool_a, {"text": "hello"})).is_error
            assert not (await sb.call_tool(tool_b, {"text": "hello"})).is_error
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            res = await sa.call_tool(tool_a, {"text": "hello"})
            ta = time.perf_counter() - t
            assert not res.is_error, res
            t = time.perf_counter()
            res = await sb.call_tool(tool_b, {"text": "hello"})
            tb = time.perf_counter() - t
            assert not res.is_error, res
            out.append(ta - tb)
        return out


async def fsyncs_per_call(binary: str, config: str, calls: int) -> float:
    """fsync + fdatasync system calls of `toolgate serve` per call on the
    durable journal: a run of CALLS calls minus a run of none, under strace."""
    if not shutil.which("strace"):
        return float("nan")

    async def count(n: int) -> int:
        with tempfile.NamedTemporaryFile(suffix=".strace") as out:
            argv = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out.name,
                    binary, "--config", config, "serve"]
            async with stdio(argv)() as s:
                for _ in range(n):
                    res = await s.call_tool("text.upper", {"text": "hello"})
                    assert not res.is_error, res
            total = 0
            for line in open(out.name):
                m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fsync|fdatasync)$", line)
                if m:
                    total += int(m.group(1))
            return total

    return (await count(calls) - await count(0)) / calls


async def main() -> None:
    binary, config = sys.argv[1], sys.argv[2]
    calls = int(sys.argv[3])
    rust_bin = sys.argv[4]
    memory = variant(config, "bench-memory", durable=False)
    durable = variant(config, "bench-durable", durable=True)
    process = variant(config, "bench-process", durable=True, durability="process")
    toolgate = stdio([binary, "--config", memory, "serve"])
    toolgate_durable = stdio([binary, "--config", durable, "serve"])
    toolgate_process = stdio([binary, "--config", process, "serve"])
    trivial = stdio([sys.executable, os.path.join(HERE, "trivial_server.py")])
    rust = stdio([rust_bin])

    starts = [await startup(toolgate, 60) for _ in range(10)]
    trivial_starts = [await startup(trivial, 1) for _ in range(5)]
    rust_starts = [await startup(rust, 1) for _ in range(10)]

    # The target's figure: toolgate (in memory) and the trivial server paired
    # call by call, before the HTTP servers below start (their idle processes
    # would share the two cores with the stdio pair).
    pairs = {"stdio": await paired(toolgate, "text.upper", rust, "upper", calls)}
    if len(sys.argv) > 6:
        floor = stdio([sys.argv[5], sys.argv[6]])
        pairs["floor_trivial"] = await paired(floor, "upper", rust, "upper", calls)
        pairs["toolgate_floor"] = await paired(toolgate, "text.upper", floor, "upper", calls)

    http_servers = {
        "toolgate": HttpServer([binary, "--config", memory, "serve", "--http", "127.0.0.1:0"]),
        "toolgate_durable": HttpServer([binary, "--config", durable, "serve", "--http", "127.0.0.1:0"]),
        "rust": HttpServer([rust_bin, "--http"]),
    }
    legs = {
        ("stdio", "toolgate"): (toolgate, "text.upper"),
        ("stdio", "toolgate_durable"): (toolgate_durable, "text.upper"),
        ("stdio", "toolgate_process"): (toolgate_process, "text.upper"),
        ("stdio", "rust"): (rust, "upper"),
        ("stdio", "python"): (trivial, "upper"),
        ("http", "toolgate"): (http_servers["toolgate"].client, "text.upper"),
        ("http", "toolgate_durable"): (http_servers["toolgate_durable"].client, "text.upper"),
        ("http", "rust"): (http_servers["rust"].client, "upper"),
    }
    samples = {leg: [] for leg in legs}
    try:
        # Interleaved rounds, so drift on a shared machine hits every leg alike.
        for _ in range(4):
            for leg, (client, tool) in legs.items():
                samples[leg] += await per_call(client, tool, calls // 4)
        pairs["http"] = await paired(http_servers["toolgate"].client, "text.upper",
                                     http_servers["rust"].client, "upper", calls)
    finally:
        for server in http_servers.values():
            server.stop()
    fsyncs = await fsyncs_per_call(binary, durable, 200)
    fsyncs_process = await fsyncs_per_call(binary, process, 200)

    med = statistics.median
    ms = {f"{t}_{who}_call_ms": med(v) * 1e3 for (t, who), v in samples.items()}
    result = {
        "startup_ms": med(starts) * 1e3,
        "trivial_startup_ms": med(trivial_starts) * 1e3,
        "rust_trivial_startup_ms": med(rust_starts) * 1e3,
        **ms,
        "fsyncs_per_durable_call": fsyncs,
        "fsyncs_per_process_durable_call": fsyncs_process,
    }
    for t in ("stdio", "http"):
        # The median of the paired differences (see `paired`).
        result[f"{t}_overhead_ms"] = med(pairs[t]) * 1e3
        result[f"{t}_overhead_unpaired_ms"] = ms[f"{t}_toolgate_call_ms"] - ms[f"{t}_rust_call_ms"]
        result[f"{t}_durable_overhead_ms"] = ms[f"{t}_toolgate_durable_call_ms"] - ms[f"{t}_rust_call_ms"]
    result["overhead_vs_python_ms"] = ms["stdio_toolgate_call_ms"] - ms["stdio_python_call_ms"]
    if "floor_trivial" in pairs:
        result["floor_above_trivial_ms"] = med(pairs["floor_trivial"]) * 1e3
        result["toolgate_above_floor_ms"] = med(pairs["toolgate_floor"]) * 1e3
    with open(os.path.join(os.path.dirname(config), "serve.json"), "w") as f:
        json.dump(result, f, indent=2)
    ok = lambda b: "met" if b else "MISSED"
    print(f"| `toolgate serve`: spawn → first `tools/list` with 20 components (median of 10) | "
          f"{result['startup_ms']:.1f} ms | ≤ 50 ms: {ok(result['startup_ms'] <= 50)} |")
    print(f"| trivial stdio MCP servers, spawn → first `tools/list`: Rust (rmcp) / Python (median of 10 / 5) | "
          f"{result['rust_trivial_startup_ms']:.1f} / {result['trivial_startup_ms']:.1f} ms | reference |")
    for t, name in (("stdio", "stdio"), ("http", "Streamable HTTP")):
        print(f"| {name}, per call: `toolgate serve` in-memory / durable journal / trivial Rust server "
              f"(median of {calls} each) | {ms[f'{t}_toolgate_call_ms']:.3f} / "
              f"{ms[f'{t}_toolgate_durable_call_ms']:.3f} / {ms[f'{t}_rust_call_ms']:.3f} ms | |")
        print(f"| {name}, per-call cost above the trivial Rust server, in memory: median of {calls} "
              f"paired differences (calls alternating between the two) | {result[f'{t}_overhead_ms']:+.3f} ms | "
              f"≤ 0.05 ms: {ok(result[f'{t}_overhead_ms'] <= 0.05)} |")
        print(f"| {name}, the same from the medians above: in-memory (durable) | "
              f"{result[f'{t}_overhead_unpaired_ms']:+.3f} ms ({result[f'{t}_durable_overhead_ms']:+.3f} ms) | |")
    if "floor_trivial" in pairs:
        print(f"| stdio, a fresh wasmtime instance per call (the floor server) above the trivial Rust server: "
              f"median of {calls} paired differences | {result['floor_above_trivial_ms']:+.3f} ms | the engine's share |")
        print(f"| stdio, `toolgate serve` in memory above the floor server: median of {calls} paired differences | "
              f"{result['toolgate_above_floor_ms']:+.3f} ms | toolgate's own share |")
    print(f"| stdio, per call through the trivial Python server | {ms['stdio_python_call_ms']:.3f} ms | "
          f"toolgate {result['overhead_vs_python_ms']:+.3f} ms |")
    print(f"| fsync/fdatasync per call, durable journal, one sequential client (strace, 200 calls) | "
          f"{fsyncs:.2f} | one is the floor |")
    print(f"| stdio, per call with `durability = \"process\"` (fsync at checkpoints): call / above the trivial Rust server | "
          f"{ms['stdio_toolgate_process_call_ms']:.3f} ms / "
          f"{ms['stdio_toolgate_process_call_ms'] - ms['stdio_rust_call_ms']:+.3f} ms | |")
    print(f"| fsync/fdatasync per call, `durability = \"process\"` (strace, 200 calls) | "
          f"{fsyncs_process:.2f} | below one |")


if __name__ == "__main__":
    asyncio.run(main())
