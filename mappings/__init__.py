"""The default mappings between each protocol's wire form and core messages, and the
declarative mapping engine.

How this works. Adapters and transports call into this package, never the other way round,
and it imports only the core's message model, typed values, subjects and errors (an
import-linter contract keeps it so). :mod:`mappings.engine` compiles YAML rules into plain
functions, per destination, protocol, direction and transport. The default mappings of STOMP,
MQTT and AMQP 1.0 are such rules (``mappings/defaults/<protocol>.yaml``, one named rule per
row of the tables in ``mappings/README.md``), which a user's rule can replace or extend for
some destinations and transports; their hand-written fast paths (:mod:`mappings.stomp`,
:mod:`mappings.mqtt`, :mod:`mappings.amqp` with :mod:`mappings.amqp_fast` and
:mod:`mappings.amqp_fast_out` for the common AMQP shapes) run when the rules apply unchanged, and tests prove the two agree.
The fast paths take their names from the default rows and check on import that the rows are
the ones they are written for (:mod:`mappings.rows`), so the YAML rows are the one definition.
"""
