"""The hub on a three-node JetStream cluster, configured as docker-compose.yml configures it:
comma-separated server URLs and streams with three replicas."""

from __future__ import annotations

from pathlib import Path

import nats

from wingsmith.services.config import Settings
from wingsmith.services.hub.wiring import running_hub

from .conftest import nats_cluster, published, read_store, seed_deployment, stream_ids, wait_for


async def test_hub_on_a_three_node_cluster(tmp_path: Path) -> None:
    async with nats_cluster(tmp_path, 3) as url:
        env = {
            "WINGSMITH_NATS_URL": url,
            "WINGSMITH_DATA_DIR": str(tmp_path / "hub"),
            "WINGSMITH_STREAM_REPLICAS": "3",
        }
        settings = Settings.from_env(env)
        nc = await nats.connect(url.split(",")[2])
        try:
            async with running_hub(settings):
                await seed_deployment(nc)
                info = await nc.jetstream().stream_info("WINGSMITH_EVENTS")
                assert info.config.num_replicas == 3

                async def relayed() -> bool:  # admission's decision included
                    ids = await stream_ids(nc)
                    return len(ids) >= 7 and ids == published(read_store(settings.data_dir))

                await wait_for(relayed, 30, "every stored event on the replicated stream")
            assert await stream_ids(nc) == published(read_store(settings.data_dir))
        finally:
            await nc.close()
