"""The mapping engine (YAML → compiled functions) and the bundled default mappings.

This package imports only :mod:`gateway.message`, :mod:`gateway.types` and the standard
library (an import-linter contract keeps it so): adapters and transports call into it, never
the other way round. For now it holds the default MQTT mapping as plain Python
(:mod:`mappings.mqtt`, tables in ``mappings/README.md``); a later step turns the defaults
into declarative YAML compiled by the engine.
"""
