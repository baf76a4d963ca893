"""The REST API's HTTP edge against the real server over raw sockets: slow clients are cut off
while others are served, the connection limit answers 503 and recovers, a client that leaves
mid-body is one quiet log line, and `/docs` loads nothing from another origin."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from wingsmith.services.api.server import running_api
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import Hub

from .conftest import wait_for
from .test_api import PROBLEM, WRITER, bearer, stored

PATIENCE = 20.0  # a generous bound on how long the server may take to close a slow client


@contextlib.asynccontextmanager
async def api_with(hub: Hub, tmp_path: Path, **limits: float) -> AsyncIterator[str]:
    """The API's base URL, served with these `api_*` limits."""
    settings = replace(
        Settings.from_env({"WINGSMITH_DATA_DIR": str(tmp_path / "api")}),
        nats_url=hub.nats_url,
        api_listen=("127.0.0.1", 0),
        api_tokens={WRITER: "tests"},
        **{f"api_{name}": value for name, value in limits.items()},  # type: ignore[arg-type]
    )
    settings.data_dir.mkdir(parents=True)
    async with running_api(settings) as api:
        yield api.url


async def dribble(url: str, head: bytes, then: bytes) -> bytes:
    """Send `head` at once, then `then` a byte every 50 ms (cycling), until the server closes
    the connection; what the server answered."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    answer = b""
    try:
        writer.write(head)
        async with asyncio.timeout(PATIENCE):
            for i in range(10**6):
                with contextlib.suppress(OSError):  # the server may close between two bytes
                    writer.write(then[i % len(then) : i % len(then) + 1])
                    await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        chunk = await reader.read(65536)
                        if not chunk:
                            return answer
                        answer += chunk
    except OSError:  # reset, or a broken pipe on the last byte sent: closed all the same
        return answer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    raise AssertionError("unreachable")


HEAD = b"GET /v1/clusters HTTP/1.1\r\nHost: wingsmith\r\n"
SLOW_PUT = (
    b"PUT /v1/projects/p/quotas/H100 HTTP/1.1\r\nHost: wingsmith\r\n"
    b"Authorization: Bearer " + WRITER.encode() + b"\r\n"
    b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
)


async def test_slow_clients_are_cut_off_while_others_are_served(hub: Hub, tmp_path: Path) -> None:
    """Forty connections dribble their head and twenty their body, a byte every 50 ms, for
    ever; each is closed with a 408 within a bounded wait, and a normal client is answered
    all along."""
    before = await stored(hub)
    async with api_with(hub, tmp_path, header_timeout=1.0, body_timeout=1.0) as url:
        slow = [asyncio.create_task(dribble(url, HEAD, b"X-Slow: a\r\n")) for _ in range(40)]
        slow += [asyncio.create_task(dribble(url, SLOW_PUT, b'{"devices": 8')) for _ in range(20)]
        async with httpx.AsyncClient(base_url=url, headers=bearer(WRITER)) as http:
            answered = 0
            while not all(task.done() for task in slow):
                assert (await http.get("/v1/clusters")).status_code == 200
                answered += 1
                await asyncio.sleep(0.1)
        answers = await asyncio.gather(*slow)  # each ended: the server closed it
    assert answered > 0
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert PROBLEM.encode() in answer and b'"code":"request_timeout"' in answer
    assert await stored(hub) == before  # no slow body reached the hub


async def test_a_silent_connection_is_closed_too(hub: Hub, tmp_path: Path) -> None:
    async with api_with(hub, tmp_path, header_timeout=0.5) as url:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        async with asyncio.timeout(PATIENCE):
            assert await reader.read() == b""  # closed, and nothing to answer
        writer.close()


async def test_over_the_connection_limit_requests_are_503_until_connections_close(
    hub: Hub, tmp_path: Path
) -> None:
    async with api_with(hub, tmp_path, max_connections=4, header_timeout=60.0) as url:
        parts = urlsplit(url)
        held = [await asyncio.open_connection(parts.hostname, parts.port) for _ in range(4)]
        async with httpx.AsyncClient(base_url=url, headers=bearer(WRITER)) as http:
            refused = await http.get("/v1/clusters")
            assert refused.status_code == 503, refused.text
            assert refused.headers["content-type"] == PROBLEM
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["code"] == "unavailable"
            for _, writer in held:
                writer.close()

            async def served() -> bool:
                return (await http.get("/v1/clusters")).status_code == 200

            await wait_for(served, PATIENCE, "a request within the limit again")


async def test_a_client_leaving_mid_body_is_one_quiet_line(
    hub: Hub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = await stored(hub)
    caplog.set_level(logging.DEBUG)
    async with api_with(hub, tmp_path) as url:
        parts = urlsplit(url)
        _, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(SLOW_PUT + b'{"devices": 8')
        await writer.drain()
        await asyncio.sleep(0.2)  # the handler is reading the body
        writer.close()

        async def logged() -> bool:
            return any("went away" in r.getMessage() for r in caplog.records)

        await wait_for(logged, PATIENCE, "the departure to be logged")
        await asyncio.sleep(0.3)  # anything the handler would log after it
    api_records = [
        r for r in caplog.records if r.name.startswith(("wingsmith.services.api", "uvicorn"))
    ]
    departures = [r for r in api_records if "went away" in r.getMessage()]
    assert len(departures) == 1 and departures[0].levelno == logging.INFO
    assert "PUT /v1/projects/p/quotas/H100" in departures[0].getMessage()
    assert [r for r in api_records if r.levelno >= logging.WARNING] == []
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    assert await stored(hub) == before


class References(HTMLParser):
    """Every URL a page loads or links to (src and href)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


async def test_docs_and_everything_they_load_come_from_the_api(hub: Hub, tmp_path: Path) -> None:
    async with api_with(hub, tmp_path) as url, httpx.AsyncClient(base_url=url) as anonymous:
        page = await anonymous.get("/docs")  # no token: it shows the API's shape, no data
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self';" in policy
        references = References()
        references.feed(page.text)
        assert len(references.urls) >= 4  # stylesheet, icon, Swagger UI, its start
        for reference in references.urls:
            absolute = urljoin(f"{url}/docs", reference)
            assert urlsplit(absolute).netloc == urlsplit(url).netloc, reference
            loaded = await anonymous.get(absolute)
            assert loaded.status_code == 200 and loaded.content, reference
        start = (await anonymous.get("/docs/start.js")).text
        assert "://" not in start and '"/openapi.json"' in start
        assert (await anonymous.get("/openapi.json")).status_code == 200
        missing = await anonymous.get("/docs/assets/redoc.standalone.js")
        assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM
