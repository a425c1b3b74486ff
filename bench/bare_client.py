"""The client limit: the same GETs vidpoll makes, at the same concurrency, with no database.
`concurrency` tasks loop over job ids for `seconds`, one shared aiohttp session. LOOP (asyncio,
the default, or uvloop) is the event loop it runs on: compare it with vidpoll on the same one.

    python bench/bare_client.py BASE_URL KEY CONCURRENCY SECONDS JOBS [LOOP]
"""

import asyncio
import sys
import time

import aiohttp


async def main(base: str, key: str, concurrency: int, seconds: float, jobs: int) -> None:
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=15)) as http:
        async def loop(i: int) -> None:
            n = i
            while time.monotonic() < deadline:
                async with http.get(f"{base}/v1/jobs/b{n % jobs + 1}/status") as resp:
                    await resp.read()
                n += concurrency

        await asyncio.gather(*(loop(i) for i in range(concurrency)))


if __name__ == "__main__":
    factory = None
    if len(sys.argv) > 6 and sys.argv[6] == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                        int(sys.argv[5])))
