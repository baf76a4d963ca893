"""How long the command line takes to start: `wingsmith --help` and `wingsmith deployments list`
beside importing httpx, the one library a REST command cannot do without.

**Method.** `wingsmith up --demo` with the simulated clusters of `make run` runs in its own
process on the embedded defaults (its own nats-server, SQLite, the REST API on a free port) in a
temporary data directory, so that `deployments list` has deployments to list and finds the API
and its token where a person's shell would. Once they are listed, this process runs four fresh
processes `--repeat` times, interleaved so that the load of the machine falls on each alike:

- `python -c pass`: the interpreter alone, for scale;
- `python -c "import httpx"`: the baseline;
- `wingsmith --help`;
- `wingsmith deployments list`: a REST call to the running hub, its table printed.

Each is timed from spawning the process to its exit (output discarded); the median of each is
reported with its 10th and 90th percentiles. The children import this checkout's `wingsmith`
(it is put first on PYTHONPATH) and run the `wingsmith` script installed beside this Python
(`python -m wingsmith` if there is none).

    python bench/cli.py [--repeat 40]

The last line is `cli_start_ratio=<median --help / median import httpx>`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = ("east=2x8:NVIDIA-H100-80GB-HBM3@rack-a", "west=1x4:NVIDIA-H100-80GB-HBM3@rack-b")


def wingsmith() -> list[str]:
    """The installed script, as a person types it; else the module."""
    script = shutil.which("wingsmith", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "wingsmith"]


def environment(data_dir: Path) -> dict[str, str]:
    """A shell's environment without this machine's WINGSMITH_ settings, and this checkout
    first on the path."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WINGSMITH_")}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return clean | {
        "PYTHONPATH": path,
        "WINGSMITH_DATA_DIR": str(data_dir),
        "WINGSMITH_API_LISTEN": "127.0.0.1:0",
    }


def start_hub(env: dict[str, str], log: Path, timeout: float = 120) -> subprocess.Popen[bytes]:
    """`wingsmith up` as `make run` starts it, with the demo; ready once the demo's workload is
    created. Its output goes to `log`, which nobody need read for it to go on."""
    simulated = [arg for cluster in CLUSTERS for arg in ("--simulated", cluster)]
    with log.open("wb") as out:
        hub = subprocess.Popen(
            [*wingsmith(), "up", *simulated, "--demo"], env=env, stdout=out, stderr=out
        )
    deadline = time.monotonic() + timeout
    while "demo: workload.create: ok" not in log.read_text():
        if hub.poll() is not None or time.monotonic() > deadline:
            hub.kill()
            raise RuntimeError(f"wingsmith up did not start:\n{log.read_text()}")
        time.sleep(0.2)
    return hub


def wait_for_deployments(env: dict[str, str], timeout: float = 60) -> int:
    """The number of deployments listed, once there are any."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            [*wingsmith(), "deployments", "list"], env=env, capture_output=True, text=True
        )
        rows = done.stdout.splitlines()[1:]
        if done.returncode == 0 and rows:
            return len(rows)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no deployments listed: {done.stdout}{done.stderr}")
        time.sleep(0.5)


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed: {done.stderr.decode()}")
    return seconds


def report(name: str, seconds: list[float]) -> float:
    deciles = statistics.quantiles(seconds, n=10)
    median = statistics.median(seconds)
    print(
        f"{name:38} median {median * 1000:6.1f} ms   "
        f"p10 {deciles[0] * 1000:6.1f} ms   p90 {deciles[-1] * 1000:6.1f} ms"
    )
    return median


def main(repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = environment(Path(tmp) / "data")
        hub = start_hub(env, Path(tmp) / "hub.log")
        try:
            deployments = wait_for_deployments(env)
            runs = {
                "python -c pass": [sys.executable, "-c", "pass"],
                'python -c "import httpx"': [sys.executable, "-c", "import httpx"],
                "wingsmith --help": [*wingsmith(), "--help"],
                f"wingsmith deployments list ({deployments})": [
                    *wingsmith(),
                    "deployments",
                    "list",
                ],
            }
            seconds: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(repeat):
                for name, argv in runs.items():
                    seconds[name].append(timed(argv, env))
        finally:
            hub.terminate()
            hub.wait(30)
    medians = [report(name, times) for name, times in seconds.items()]
    _, httpx, usage, listing = medians
    print(f"deployments list / import httpx: {listing / httpx:.2f}")
    print(f"cli_start_ratio={usage / httpx:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=40)
    main(parser.parse_args().repeat)
