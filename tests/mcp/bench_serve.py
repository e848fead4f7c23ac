"""`toolgate serve` through a real MCP client (the official Python SDK):
start-up (process spawn to the first `tools/list` answer) with a directory of
generated components, and the per-call cost above a trivial stdio MCP server
driven by the same client on the same machine.

Usage: bench_serve.py TOOLGATE_BIN CONFIG CALLS RUST_TRIVIAL_BIN   (run by
scripts/bench, after the `scale` bench generated target/scale/dir20). Two
baselines: `host/examples/trivial_mcp_server.rs` (the same Rust SDK as
toolgate, one in-process tool: the stricter comparison, used for the target)
and `trivial_server.py` (the Python SDK). Prints Markdown table rows and
writes JSON next to CONFIG.
"""

import asyncio
import json
import os
import statistics
import sys
import time

from mcp import Client, StdioServerParameters

HERE = os.path.dirname(os.path.abspath(__file__))
# The SDK's default: `server/discover`, then 2026-07-28 (the handshake on older servers).
MODE = os.environ.get("MCP_MODE", "auto")


async def startup(params: StdioServerParameters, expect_tools: int) -> float:
    t = time.perf_counter()
    async with Client(params, mode=MODE) as s:
        tools = await s.list_tools()
        elapsed = time.perf_counter() - t
        assert len(tools.tools) == expect_tools, len(tools.tools)
    return elapsed


async def per_call(params: StdioServerParameters, tool: str, calls: int) -> list[float]:
    async with Client(params, mode=MODE) as s:
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


async def main() -> None:
    binary, config = sys.argv[1], sys.argv[2]
    calls = int(sys.argv[3])
    toolgate = StdioServerParameters(command=binary, args=["--config", config, "serve"])
    trivial = StdioServerParameters(command=sys.executable, args=[os.path.join(HERE, "trivial_server.py")])
    rust = StdioServerParameters(command=sys.argv[4], args=[])

    starts = [await startup(toolgate, 60) for _ in range(10)]
    trivial_starts = [await startup(trivial, 1) for _ in range(5)]
    rust_starts = [await startup(rust, 1) for _ in range(10)]
    # Interleaved rounds, so drift on a shared machine hits all three alike.
    tg, tr, ru = [], [], []
    for _ in range(4):
        tg += await per_call(toolgate, "text.upper", calls // 4)
        ru += await per_call(rust, "upper", calls // 4)
        tr += await per_call(trivial, "upper", calls // 4)

    med = statistics.median
    result = {
        "startup_ms": med(starts) * 1e3,
        "trivial_startup_ms": med(trivial_starts) * 1e3,
        "toolgate_call_ms": med(tg) * 1e3,
        "trivial_call_ms": med(tr) * 1e3,
        "toolgate_call_mean_ms": statistics.mean(tg) * 1e3,
        "trivial_call_mean_ms": statistics.mean(tr) * 1e3,
        "rust_trivial_startup_ms": med(rust_starts) * 1e3,
        "rust_trivial_call_ms": med(ru) * 1e3,
    }
    result["overhead_ms"] = result["toolgate_call_ms"] - result["rust_trivial_call_ms"]
    result["overhead_vs_python_ms"] = result["toolgate_call_ms"] - result["trivial_call_ms"]
    with open(os.path.join(os.path.dirname(config), "serve.json"), "w") as f:
        json.dump(result, f, indent=2)
    ok = lambda b: "met" if b else "MISSED"
    print(f"| `toolgate serve`: spawn → first `tools/list` with 20 components (median of 10) | "
          f"{result['startup_ms']:.1f} ms | ≤ 50 ms: {ok(result['startup_ms'] <= 50)} |")
    print(f"| trivial stdio MCP servers, spawn → first `tools/list`: Rust (rmcp) / Python (median of 10 / 5) | "
          f"{result['rust_trivial_startup_ms']:.1f} / {result['trivial_startup_ms']:.1f} ms | reference |")
    print(f"| per call through `toolgate serve` / trivial Rust server / trivial Python server (median of {calls} each) | "
          f"{result['toolgate_call_ms']:.3f} / {result['rust_trivial_call_ms']:.3f} / {result['trivial_call_ms']:.3f} ms | |")
    print(f"| per-call cost above the trivial Rust server (same SDK) | {result['overhead_ms']:+.3f} ms | "
          f"≤ 0.05 ms: {ok(result['overhead_ms'] <= 0.05)} |")
    print(f"| per-call cost above the trivial Python server | {result['overhead_vs_python_ms']:+.3f} ms | |")


asyncio.run(main())
