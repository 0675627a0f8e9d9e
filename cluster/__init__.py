"""Several gateway processes acting as one gateway, over NATS (``cluster`` in gateway.conf).

Each node is a whole gateway; the nodes share what crosses between them through NATS
servers, never through a protocol of their own: NATS subjects route topic messages by
interest. See :mod:`cluster.link`.
"""
