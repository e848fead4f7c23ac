"""A remote MCP tool through toolgate's MCP adapter against the same tool
called directly, with a delay proxy adding DELAY_MS to every request that
reaches the remote (issue #16's measure): per-call latency of each and the
HTTP requests the remote receives per call.

Usage: bench_adapter.py TOOLGATE_BIN [CALLS] [DELAY_MS]   (scripts/bench runs it).
Starts `tests/mcp/remote_server.py` and the proxy on 127.0.0.1, imports the
adapter through the proxy (`toolgate mcp import`), then times CALLS calls of
`add` with the official Python client: directly over Streamable HTTP (one
session, the client's legacy mode: its fastest against this server), and
through `toolgate serve` over stdio (the adapter's calls leave
through the proxy). Prints Markdown table rows.
"""

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "bench-remote-token-0123456789"
MODE = os.environ.get("MCP_MODE", "auto")


def delay_proxy(target_port: int, delay: float) -> int:
    """A TCP proxy to the remote, on its own thread and event loop, that
    delays each *request* by `delay`: the first chunk a client sends after the
    previous response began (a request's later chunks, e.g. a body sent apart
    from its headers, are not delayed again). Returns its port."""
    ready = threading.Event()
    port = []

    async def serve():
        async def handle(reader, writer):
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
            waiting = [False]  # a request is out and its response has not begun

            async def to_remote():
                try:
                    while data := await reader.read(65536):
                        if not waiting[0]:
                            waiting[0] = True
                            await asyncio.sleep(delay)
                        up_writer.write(data)
                        await up_writer.drain()
                except ConnectionError:
                    pass
                finally:
                    up_writer.close()

            async def to_client():
                try:
                    while data := await up_reader.read(65536):
                        waiting[0] = False
                        writer.write(data)
                        await writer.drain()
                except ConnectionError:
                    pass
                finally:
                    writer.close()

            await asyncio.gather(to_remote(), to_client(), return_exceptions=True)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await asyncio.Event().wait()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    ready.wait(10)
    return port[0]


def stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/stats") as r:
        return json.load(r)


async def timed(session, tool: str, calls: int, remote_port: int) -> tuple[list[float], float]:
    for _ in range(5):  # warm-up (the adapter's first call compiles it)
        res = await session.call_tool(tool, {"a": 1, "b": 2})
        assert not res.is_error, res
    before = stats(remote_port)["authorized"]
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        res = await session.call_tool(tool, {"a": 1, "b": 2})
        out.append(time.perf_counter() - t)
        assert not res.is_error, res
    return out, (stats(remote_port)["authorized"] - before) / calls


async def main() -> None:
    binary = os.path.abspath(sys.argv[1])
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    delay = (float(sys.argv[3]) if len(sys.argv) > 3 else 20.0) / 1e3
    env = dict(os.environ, REMOTE_TOKEN=TOKEN, CALC_TOKEN=TOKEN)
    remote = subprocess.Popen([sys.executable, os.path.join(HERE, "remote_server.py")],
                              stdout=subprocess.PIPE, env=env, text=True)
    try:
        port = int(remote.stdout.readline().split()[1])
        proxy_port = delay_proxy(port, delay)
        url = f"http://127.0.0.1:{proxy_port}/mcp"
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "plugins"))
            with open(os.path.join(d, "toolgate.toml"), "w") as f:
                f.write(f'''plugins = "plugins"
store = ":memory:"
cache = "cache"
[credentials.calc]
source = {{ env = "CALC_TOKEN" }}
destinations = ["http://127.0.0.1:{proxy_port}"]
apply = {{ header = {{ name = "Authorization", format = "Bearer {{}}" }} }}
[[grants]]
tools = "mcp__calc__*"
hosts = ["http://127.0.0.1:{proxy_port}"]
credentials = ["calc"]
[agents.default]
visible = ["mcp__*"]
default = "allow"
''')
            imported = await asyncio.to_thread(
                subprocess.run, [binary, "mcp", "import", url, "--name", "calc", "--credential", "calc", "-o", "plugins/calc.wasm"],
                cwd=d, env=env, capture_output=True, text=True)
            assert imported.returncode == 0, imported.stderr
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
            # The direct baseline is the fastest way this client calls the remote: one
            # 2025-11-25 session (its 2026-07-28 stateless mode costs ~45 ms a call
            # against this server, with or without the proxy).
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as s:
                direct, direct_requests = await timed(s, "add", calls, port)
            params = StdioServerParameters(command=binary, args=["--config", os.path.join(d, "toolgate.toml"), "serve"],
                                           env=env, cwd=d)
            async with Client(params, mode=MODE) as s:
                adapter, adapter_requests = await timed(s, "mcp__calc__add", calls, port)
    finally:
        remote.kill()
        remote.wait()
    d_ms, a_ms = statistics.median(direct) * 1e3, statistics.median(adapter) * 1e3
    print(f"| remote `add`, {delay * 1e3:.0f} ms per request to the remote, median of {calls}: direct client / "
          f"through toolgate's adapter | {d_ms:.1f} / {a_ms:.1f} ms | adapter {a_ms / d_ms:.2f}× direct (target ≤ 1.2×) |")
    print(f"| HTTP requests the remote receives per call: direct / adapter | "
          f"{direct_requests:.1f} / {adapter_requests:.1f} | |")


asyncio.run(main())
