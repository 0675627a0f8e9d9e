"""The admin HTTP API on a live broker (aiohttp client over loopback)."""

from __future__ import annotations

import aiohttp
from adminapi import basic_auth
from corehelp import Q, running_broker

from gateway import registry
from gateway.config import Listener
from gateway.message import DeliveryMode, Message


async def test_admin_views_and_purge(tmp_path):
    async with running_broker(tmp_path, queues="orders.> maxRedelivery=5\n>\n") as b:
        conn = b.connect(client_id="admin-test")
        s = conn.session()
        p = s.producer(Q("orders.eu"), delivery_mode=DeliveryMode.NON_PERSISTENT)
        for i in range(3):
            p.send(Message.text(str(i)))
        start = registry.adapter("http")
        server = await start(b, Listener("http", "127.0.0.1", 0, 0))
        host, port = server.address
        base = f"http://{host}:{port}"
        try:
            async with aiohttp.ClientSession(headers=basic_auth()) as http:
                async with http.get(base + "/health") as r:
                    assert (await r.json())["status"] == "ok"
                async with http.get(base + "/api/v1/queues") as r:
                    rows = {q["name"]: q for q in await r.json()}
                assert rows["orders.eu"]["pending"] == 3
                assert rows["orders.eu"]["properties"]["max_redelivery"] == 5
                async with http.get(base + "/api/v1/connections") as r:
                    assert any(c["client_id"] == "admin-test" for c in await r.json())
                async with http.post(base + "/api/v1/queues/orders.eu/purge") as r:
                    assert (await r.json()) == {"purged": 3}
                async with http.post(base + "/api/v1/queues/nope/purge") as r:
                    assert r.status == 404
                async with http.get(base + "/api/v1/server") as r:
                    assert (await r.json())["published"] == 3
        finally:
            await server.close()
        assert b.queues["orders.eu"].count == 0
