"""The mapping engine (YAML → compiled functions) and the bundled default mappings; this package imports only gateway.message and gateway.types.

How this works. Adapters and transports call into this package, never the other way round,
and it imports nothing but :mod:`gateway.message`, :mod:`gateway.types` and the standard
library (an import-linter contract keeps it so). For now it holds the default MQTT mapping as
plain Python (:mod:`mappings.mqtt`; its tables are in ``mappings/README.md``); a later step
turns the defaults into declarative YAML compiled by the engine.
"""
