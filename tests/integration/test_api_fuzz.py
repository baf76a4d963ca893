"""A schema-driven fuzz of the REST API: schemathesis generates requests from /openapi.json
(valid and invalid bodies, paths and queries) against `wingsmith up` with a simulated cluster,
and no response may be a server error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

TOKEN = "fuzz-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    env = os.environ | {
        "WINGSMITH_DATA_DIR": str(data_dir),
        "WINGSMITH_API_LISTEN": "127.0.0.1:0",  # any free port: `up` writes it to api.url
        "WINGSMITH_API_TOKENS": f"fuzz:{TOKEN}",
    }
    env.pop("WINGSMITH_NATS_URL", None)  # its own embedded nats-server
    with open(data_dir / "up.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "wingsmith", "up", "--simulated", "east=2x8:H100"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield _wait_ready(data_dir / "api.url", process)
    finally:
        process.terminate()
        process.wait(30)
    server_errors = (data_dir / "up.log").read_text()
    assert "Traceback" not in server_errors, server_errors[-4000:]


def _wait_ready(url_file: Path, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "wingsmith up exited"
        try:
            url = url_file.read_text()
            if httpx.get(f"{url}/readyz").status_code == 200:
                return url
        except (OSError, httpx.TransportError):
            pass
        time.sleep(0.2)
    raise AssertionError("the API did not become ready")


SEED = {
    "workload_id": "fuzz-llama",
    "project": "fuzz",
    "device_class": "H100",
    "replicas": 1,
    "serving": {"model": "m", "backend": "vllm", "engine_version": "1", "devices_per_replica": 1},
}
CONFIG = """
[dictionaries.refs]
values = ["fuzz-llama", "fuzz-llama--east", "fuzz-llama/east", "east", "fuzz"]

[parameters]
"path.ref" = { dictionary = "refs", probability = 0.5 }
"path.project" = { dictionary = "refs", probability = 0.5 }
"""


def test_no_request_makes_a_server_error(base_url: str, tmp_path: Path) -> None:
    """Coverage, fuzzing and stateful phases; half the generated refs name things that exist."""
    seeded = [
        httpx.put(f"{base_url}/v1/projects/fuzz/quotas/H100", json={"devices": 8}, headers=AUTH),
        httpx.post(f"{base_url}/v1/workloads", json=SEED, headers=AUTH),
    ]
    assert [r.status_code for r in seeded] == [200, 201], [r.text for r in seeded]
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
         f"{base_url}/openapi.json", "--header", f"Authorization: Bearer {TOKEN}",
         "--checks", "not_a_server_error,response_schema_conformance", "--max-examples", "25"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
