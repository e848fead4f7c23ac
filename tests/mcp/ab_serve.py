"""A/B of two `toolgate serve` builds per call, through the official Python
SDK over stdio: both servers open at once on the same CONFIG, calls
alternating a, b, a, b…, the median of the paired differences — and the
same with the order reversed, since the first call of a pair reads a little
higher (~0.01 ms here). Half the difference of the two medians cancels
that order effect; a build against itself gave +0.0025 and -0.0005 ms
(2,000 pairs, idle machine; under a build, 300 pairs read -0.011 ms).

Usage: ab_serve.py TOOLGATE_A TOOLGATE_B CONFIG [CALLS [ROUNDS]]
(e.g. CONFIG = target/scale/dir20/toolgate.toml, made by the `scale` bench;
build the older revision in a `git worktree` and copy its binary aside).
"""

import asyncio
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serve  # noqa: E402

TOOL = "text.upper"


async def main() -> None:
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    a, b, config = sys.argv[1:4]
    calls = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    server_a = bench_serve.stdio([a, "--config", config, "serve"])
    server_b = bench_serve.stdio([b, "--config", config, "serve"])
    results = []
    for r in range(rounds):
        ab = statistics.median(await bench_serve.paired(server_a, TOOL, server_b, TOOL, calls))
        ba = statistics.median(await bench_serve.paired(server_b, TOOL, server_a, TOOL, calls))
        results.append((ab - ba) / 2)
        print(f"round {r + 1}: a first {ab * 1e3:+.4f} ms, b first {ba * 1e3:+.4f} ms "
              f"=> a above b {results[-1] * 1e3:+.4f} ms", flush=True)
    print(f"a above b per call, mean of {rounds} rounds of {calls} pairs each way: "
          f"{statistics.mean(results) * 1e3:+.4f} ms")


if __name__ == "__main__":
    asyncio.run(main())
