"""gateway: a protocol gateway between messaging systems, around a JMS-style core broker.

The core's public pieces: :class:`gateway.message.Message` and
:class:`gateway.message.Destination`, the client seam in :mod:`gateway.client`,
:class:`gateway.broker.Broker`, and :class:`gateway.server.Gateway` which assembles a
running gateway from a configuration directory (:func:`gateway.config.load_config`).
"""

__version__ = "0.1.0"
