"""Downloads that cannot be turned against the host (issue 18): every provider-supplied URL
goes through vidpoll.fetch_guard. Real HTTP over loopback (aiohttp servers), real files, a
real PostgreSQL for the delivery test; names are resolved by a resolver injected into the
guard, whose answers the guard's own address check judges."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.errors import DiskError, DownloadError, DownloadRefused
from vidpoll.fetch_guard import AccountRules, FetchLimits, FetchPolicy
from vidpoll.store import PgStore

from ..conftest import FAST_POLICY

VIDEO = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 64  # 16 KiB and a bit
SECRET = "SIG-7f3a-never-shown"


class MapResolver(AbstractResolver):
    """Names → one address each, as a DNS server under someone else's control would answer."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        address = self.names[host]
        return [{"hostname": host, "host": address, "port": port, "proto": 0,
                 "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


class Server:
    """An aiohttp server on a loopback port that records what it was asked."""

    def __init__(self, routes: Callable[[web.Application, Server], None]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.url = ""
        self.port = 0

    def seen(self, request: web.Request) -> None:
        self.requests.append((request.path_qs, dict(request.headers)))


@contextlib.asynccontextmanager
async def serving(routes: Callable[[web.Application, Server], None]) -> AsyncIterator[Server]:
    server = Server(routes)
    app = web.Application()
    routes(app, server)
    # handler_cancellation: a client that hangs up ends an endless or trickling handler too
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                           shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{server.port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def file_route(path: str, body: bytes = VIDEO) -> Callable[[web.Application, Server], None]:
    def routes(app: web.Application, server: Server) -> None:
        async def handler(request: web.Request) -> web.Response:
            server.seen(request)
            return web.Response(body=body, content_type="video/mp4")
        app.router.add_get(path, handler)
    return routes


def redirect_route(path: str, to: Callable[[], str]) -> Callable[[web.Application, Server], None]:
    def routes(app: web.Application, server: Server) -> None:
        async def handler(request: web.Request) -> web.Response:
            server.seen(request)
            raise web.HTTPFound(to())
        app.router.add_get(path, handler)
    return routes


def downloader(tmp_path: Path, origin: str, *, allow: frozenset[Any] = frozenset(),
               resolver: AbstractResolver | None = None, limits: FetchLimits | None = None,
               api_headers: dict[str, str] | None = None) -> Downloader:
    rules = AccountRules(origin, allow, api_headers=api_headers or {})
    return Downloader(tmp_path / "videos", policy=FetchPolicy(rules, limits=limits or
                                                              FetchLimits()),
                      connect_timeout_s=2, read_timeout_s=5, resolver=resolver)


def left_in(tmp_path: Path) -> list[str]:
    """Every entry under the download directory (dot files too)."""
    return sorted(str(p.relative_to(tmp_path / "videos"))
                  for p in (tmp_path / "videos").rglob("*"))


async def test_a_redirect_from_the_api_origin_to_loopback_elsewhere_is_refused(tmp_path):
    # the finding: a result URL on the provider's origin redirecting to /metrics of `serve`
    async with serving(file_route("/metrics", b"vidpoll_jobs_total 3\n")) as metrics:
        hops = {"/plain": lambda: f"{metrics.url}/metrics?token={SECRET}",
                "/tls": lambda: f"https://127.0.0.1:{metrics.port}/metrics",
                "/named": lambda: f"https://localhost:{metrics.port}/metrics"}

        def routes(app: web.Application, server: Server) -> None:
            for path, to in hops.items():
                redirect_route(path, to)(app, server)
            redirect_route("/loop", lambda: "/loop")(app, server)

        async with serving(routes) as api, downloader(tmp_path, api.url) as d:
            refusals = {}
            for path in [*hops, "/loop"]:
                with pytest.raises(DownloadRefused) as caught:
                    await d.download("v1", [f"{api.url}{path}?sig={SECRET}"])
                refusals[path] = str(caught.value)
    assert metrics.requests == []  # never reached
    assert left_in(tmp_path) == []  # nothing saved, not even an empty .part or directory
    where = f"127.0.0.1:{metrics.port}"
    assert f"plain http:// to {where}" in refusals["/plain"]
    assert f"{where} is a loopback address" in refusals["/tls"]
    assert "localhost resolves to 127.0.0.1, a loopback address" in refusals["/named"]
    assert "more than 5 redirects" in refusals["/loop"]
    for path, text in refusals.items():
        assert text.startswith(f"{api.url}{path} refused: ") and SECRET not in text
        assert path == "/loop" or ("its redirect 1 to " in text
                                   and "VIDPOLL_MEDIA_ALLOW_HOSTS" in text)


async def test_scheme_relative_and_relative_redirects_on_the_api_origin_are_followed(tmp_path):
    # `Location: //host/path` keeps the scheme of the hop it came from (RFC 3986): it was
    # refused for good as "no scheme", failing a delivery that had a good file
    port: list[int] = []

    def routes(app: web.Application, server: Server) -> None:
        file_route("/v.mp4")(app, server)
        redirect_route("/scheme-relative", lambda: f"//127.0.0.1:{port[0]}/v.mp4")(app, server)
        redirect_route("/relative", lambda: "v.mp4")(app, server)

        async def no_port(request: web.Request) -> web.Response:
            return web.Response(status=302, headers={
                "Location": "https://cdn.example:99999/v.mp4"})  # HTTPFound would refuse it
        app.router.add_get("/no-port", no_port)

    async with serving(routes) as api, downloader(tmp_path, api.url) as d:
        port.append(api.port)
        [a] = await d.download("a", [f"{api.url}/scheme-relative?sig={SECRET}"])
        [b] = await d.download("b", [f"{api.url}/relative?sig={SECRET}"])
        # a port out of range: refused, naming the hop (was a bare ValueError)
        with pytest.raises(DownloadRefused, match="its redirect 1: not a valid URL"):
            await d.download("c", [f"{api.url}/no-port"])
    assert Path(a.path).read_bytes() == Path(b.path).read_bytes() == VIDEO
    assert [path for path, _ in api.requests].count("/v.mp4") == 2


async def test_a_name_that_resolves_to_a_private_address_is_refused_at_connect(tmp_path):
    async with serving(file_route("/v.mp4")) as media, serving(file_route("/x")) as api:
        resolver = MapResolver({"cdn.test": "10.1.2.3", "rebound.test": "127.0.0.1",
                                "mapped.test": "::ffff:127.0.0.1"})
        async with downloader(tmp_path, api.url, resolver=resolver) as d:
            found = {}
            for name in resolver.names:
                with pytest.raises(DownloadRefused) as caught:
                    await d.download("v1", [f"https://{name}:{media.port}/v.mp4?sig={SECRET}"])
                found[name] = str(caught.value)
    # each name was resolved, then refused by the guard's own check of the answer
    assert sorted(resolver.asked) == sorted(resolver.names)
    assert "cdn.test resolves to 10.1.2.3, a private address" in found["cdn.test"]
    assert "rebound.test resolves to 127.0.0.1, a loopback address" in found["rebound.test"]
    assert "an IPv6 form of 127.0.0.1, a loopback address" in found["mapped.test"]
    assert media.requests == [] and left_in(tmp_path) == []
    assert all(SECRET not in text for text in found.values())


async def test_cloud_metadata_is_refused_by_its_literal_address(tmp_path):
    literal = ["http://169.254.169.254/latest/meta-data/iam",
               "https://169.254.169.254/latest/meta-data/iam",
               "https://[::ffff:169.254.169.254]/latest", "https://[fe80::1]/x",
               "https://100.64.0.1/x", "https://0.0.0.0/x", "https://224.0.0.1/x"]
    async with serving(file_route("/x")) as api, downloader(tmp_path, api.url) as d:
        started = time.monotonic()
        for url in literal:
            with pytest.raises(DownloadRefused, match="refused"):
                await d.download("v1", [url])
        assert time.monotonic() - started < 1  # refused before any connect was tried
    assert left_in(tmp_path) == []


async def test_plain_http_elsewhere_is_refused_unless_its_host_is_allow_listed(tmp_path):
    async with serving(file_route("/v.mp4")) as media, serving(file_route("/x")) as api:
        resolver = MapResolver({"media.test": "127.0.0.1"})
        url = f"http://media.test:{media.port}/v.mp4?sig={SECRET}"
        async with downloader(tmp_path, api.url, resolver=resolver) as d:
            with pytest.raises(DownloadRefused, match=f"plain http:// to media.test:"
                                                      f"{media.port}, which is neither"):
                await d.download("v1", [url])
        assert media.requests == []
        for entry in (("media.test", None), ("media.test", media.port)):
            async with downloader(tmp_path, api.url, resolver=resolver,
                                  allow=frozenset({entry})) as d:
                [f] = await d.download(f"v-{entry[1]}", [url])
            assert Path(f.path).read_bytes() == VIDEO and SECRET not in f.url
        async with downloader(tmp_path, api.url, resolver=resolver,
                              allow=frozenset({("media.test", media.port + 1)})) as d:
            with pytest.raises(DownloadRefused, match="plain http://"):
                await d.download("v-other-port", [url])
    assert len(media.requests) == 2


async def test_the_auth_header_is_sent_to_the_api_origin_only(tmp_path):
    async with serving(file_route("/v.mp4")) as media:
        resolver = MapResolver({"media.test": "127.0.0.1"})
        target = f"http://media.test:{media.port}/v.mp4?X-Amz-Signature={SECRET}"
        async with serving(redirect_route("/media/v1", lambda: target)) as api, downloader(
                tmp_path, api.url, resolver=resolver, allow=frozenset({("media.test", None)}),
                api_headers={"Authorization": "Bearer provider-token"}) as d:
            [f] = await d.download("v1", [f"{api.url}/media/v1"])
    assert Path(f.path).read_bytes() == VIDEO
    [(_, at_api)] = api.requests
    [(_, at_media)] = media.requests
    assert at_api["Authorization"] == "Bearer provider-token"
    assert "Authorization" not in at_media and "provider-token" not in str(at_media)


def endless(app: web.Application, server: Server) -> None:
    async def forever(request: web.Request) -> web.StreamResponse:
        server.seen(request)
        resp = web.StreamResponse()
        await resp.prepare(request)
        while True:  # until the client hangs up (the handler is cancelled then)
            await resp.write(b"\x00" * 65536)

    async def announced(request: web.Request) -> web.StreamResponse:
        server.seen(request)
        resp = web.StreamResponse(headers={"Content-Length": str(10 * 1024 * 1024)})
        await resp.prepare(request)
        await asyncio.Event().wait()  # never sends it: the announcement is enough
        return resp

    app.router.add_get("/endless", forever)
    app.router.add_get("/announced", announced)


async def test_an_endless_body_stops_at_the_size_limit_and_leaves_no_file(tmp_path):
    limits = FetchLimits(max_bytes=256 * 1024)
    async with serving(endless) as api, downloader(tmp_path, api.url, limits=limits) as d:
        with pytest.raises(DownloadRefused, match=r"goes past VIDPOLL_DOWNLOAD_MAX_BYTES "
                                                  r"\(262144 bytes\)"):
            await d.download("v1", [f"{api.url}/endless?sig={SECRET}"])
        assert left_in(tmp_path) == []
        with pytest.raises(DownloadRefused, match="the file is 10485760 bytes, more than"):
            await d.download("v1", [f"{api.url}/announced"])
        assert left_in(tmp_path) == []


def trickle(app: web.Application, server: Server) -> None:
    async def one_byte_then_nothing(request: web.Request) -> web.StreamResponse:
        server.seen(request)
        resp = web.StreamResponse(headers={"Content-Length": "1000"})
        await resp.prepare(request)
        await resp.write(b"x")
        await asyncio.Event().wait()  # the next byte would come a minute later, or never
        return resp

    async def fast_and_endless(request: web.Request) -> web.StreamResponse:
        server.seen(request)
        resp = web.StreamResponse()
        await resp.prepare(request)
        while True:
            await resp.write(b"\x00" * 16384)
            await asyncio.sleep(0.005)  # a server's pace, well above the minimum rate

    app.router.add_get("/trickle", one_byte_then_nothing)
    app.router.add_get("/endless", fast_and_endless)


async def test_a_trickling_body_fails_by_the_minimum_rate_and_is_resumed_later(tmp_path):
    limits = FetchLimits(min_bytes_per_s=1000, rate_window_s=0.3)
    async with serving(trickle) as api, downloader(tmp_path, api.url, limits=limits) as d:
        started = time.monotonic()
        with pytest.raises(DownloadError, match=r"1 bytes in 0.3s, slower than "
                                                r"VIDPOLL_DOWNLOAD_MIN_BYTES_PER_S") as caught:
            await d.download("v1", [f"{api.url}/trickle?sig={SECRET}"])
        elapsed = time.monotonic() - started
    assert not isinstance(caught.value, DownloadRefused)  # retried with backoff, resumed
    assert 0.3 <= elapsed < 3, elapsed
    assert left_in(tmp_path) == ["v1", "v1/.1-trickle.part"]


async def test_a_try_past_its_deadline_is_retried_not_refused(tmp_path):
    limits = FetchLimits(deadline_s=0.4)
    async with serving(trickle) as api, downloader(tmp_path, api.url, limits=limits) as d:
        with pytest.raises(DownloadError, match=r"not done within 0.4s "
                                                r"\(VIDPOLL_DOWNLOAD_DEADLINE_S\)") as caught:
            await d.download("v1", [f"{api.url}/endless"])
    assert not isinstance(caught.value, DownloadRefused)
    assert "v1/1-endless" not in left_in(tmp_path)


async def test_links_planted_in_the_download_directory_are_never_followed(tmp_path):
    precious = tmp_path / "precious"
    precious.write_bytes(b"not yours to overwrite")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    videos = tmp_path / "videos"
    async with serving(file_route("/v.mp4")) as api, downloader(tmp_path, api.url) as d:
        url = f"{api.url}/v.mp4?sig={SECRET}"
        # where the partial file goes: refused, the link's target untouched
        (videos / "part").mkdir(parents=True)
        (videos / "part" / ".1-v.mp4.part").symlink_to(precious)
        with pytest.raises(DiskError, match="it is a symbolic link, and links there are not "
                                            "followed"):
            await d.download("part", [url])
        # a hard link to another file in its place: refused too
        (videos / "hard").mkdir()
        (videos / "hard" / ".1-v.mp4.part").hardlink_to(precious)
        with pytest.raises(DiskError, match="not a plain file of its own"):
            await d.download("hard", [url])
        # where the final file goes: never taken for a finished download; the rename replaces
        # the link, never writes through it
        (videos / "final").mkdir()
        (videos / "final" / "1-v.mp4").symlink_to(precious)
        [f] = await d.download("final", [url])
        assert Path(f.path).read_bytes() == VIDEO and not Path(f.path).is_symlink()
        # the job's directory itself
        (videos / "dir").symlink_to(elsewhere, target_is_directory=True)
        with pytest.raises(DiskError, match="dir: it is a symbolic link"):
            await d.download("dir", [url])
    assert precious.read_bytes() == b"not yours to overwrite"
    assert list(elsewhere.iterdir()) == []


async def test_a_refused_url_fails_its_delivery_at_once_naming_host_and_rule(
        store: PgStore, db_url: str, tmp_path: Path) -> None:
    async with serving(file_route("/metrics", b"# metrics\n")) as metrics, serving(
            redirect_route("/media/v1", lambda: f"{metrics.url}/metrics?t={SECRET}")
            ) as api, downloader(tmp_path, api.url) as d:
        deliverer = Deliverer(store, DeliveryConfig(policy=FAST_POLICY, lease_s=3.0), d)
        await deliverer.prepare()
        await store.add_job("j1", delay_s=60)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute(
                "UPDATE video_jobs SET state = 'completed', result_state = 'fetched', "
                "result = jsonb_build_object('videos', jsonb_build_array("
                "jsonb_build_object('url', %s::text))) WHERE job_id = 'j1'",
                (f"{api.url}/media/v1?sig={SECRET}",))
        task = asyncio.create_task(deliverer.run())
        await deliverer.signals.wait_for(lambda: deliverer.stats.deliveries_failed == 1, 10)
        deliverer.stop()
        await asyncio.wait_for(task, 10)
    [row] = await store.job_deliveries("j1")
    assert row["state"] == "failed" and row["attempts"] == 1  # no retry can change it
    assert (f"its redirect 1 to {metrics.url}/metrics: plain http:// to "
            f"127.0.0.1:{metrics.port}") in row["last_error"]
    assert SECRET not in row["last_error"] and metrics.requests == []
    assert left_in(tmp_path) == []
