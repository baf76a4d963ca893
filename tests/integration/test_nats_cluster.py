"""The hub on a three-node JetStream cluster, configured as docker-compose.yml configures it:
comma-separated server URLs and streams with three replicas."""

from __future__ import annotations

from pathlib import Path

import nats

from wingsmith.adapters.nats_server import EmbeddedNatsServer, free_port
from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub

from .conftest import published, read_store, seed_deployment, stream_ids, wait_for


async def test_hub_on_a_three_node_cluster(tmp_path: Path) -> None:
    routes = [free_port() for _ in range(3)]
    servers = [
        EmbeddedNatsServer(
            tmp_path / f"nats-{i}",
            extra_args=(
                "--name",
                f"nats-{i}",
                "--cluster_name",
                "wingsmith",
                "--cluster",
                f"nats://127.0.0.1:{routes[i]}",
                "--routes",
                ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i),
            ),
        )
        for i in range(3)
    ]
    for server in servers:
        await server.start()
    try:
        url = ",".join(s.url for s in servers)
        env = {
            "WINGSMITH_NATS_URL": url,
            "WINGSMITH_DATA_DIR": str(tmp_path / "hub"),
            "WINGSMITH_STREAM_REPLICAS": "3",
        }
        settings = Settings.from_env(env)
        nc = await nats.connect(servers[2].url)
        try:

            async def meta_leader_elected() -> bool:
                try:
                    await nc.jetstream().account_info()
                except Exception:
                    return False
                return True

            await wait_for(meta_leader_elected, 30, "a JetStream meta leader")
            async with running_hub(settings):
                await seed_deployment(nc)
                info = await nc.jetstream().stream_info("WINGSMITH_EVENTS")
                assert info.config.num_replicas == 3

                async def relayed() -> bool:
                    return len(await stream_ids(nc)) >= 6  # and admission's decision

                await wait_for(relayed, 30, "events on the replicated stream")
            assert await stream_ids(nc) == published(read_store(settings.data_dir))
        finally:
            await nc.close()
    finally:
        for server in servers:
            await server.stop()
