"""The default mappings between each protocol's wire form and core messages, and the
declarative mapping engine.

How this works. Adapters and transports call into this package, never the other way round,
and it imports only the core's message model, typed values, subjects and errors (an
import-linter contract keeps it so). The default mappings are plain Python, one module per
protocol (:mod:`mappings.mqtt`, :mod:`mappings.amqp` with :mod:`mappings.amqp_fast`,
:mod:`mappings.stomp`), their tables in ``mappings/README.md``. :mod:`mappings.engine`
compiles YAML rules into functions applied on top of them, per destination, protocol and
transport.
"""
