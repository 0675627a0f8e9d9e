"""MQTT 3.1, 3.1.1 and 5.0 for the gateway.

``packets`` holds the packet dataclasses, packet types and reason codes; ``properties`` the
table of MQTT 5 properties; ``codec`` the sans-I/O :class:`~adapters.mqtt.codec.MqttCodec`
(bytes in, packets out, bytes to send) used by the server and, through its client side, by
the MQTT transport. The session state table and the asyncio shell live beside them.

The package itself imports nothing, so loading ``adapters.mqtt.codec`` alone stays cheap.
"""
