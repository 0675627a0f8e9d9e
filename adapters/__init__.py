"""Protocol servers; each package a sans-I/O codec, a session state table and a thin asyncio shell.

A codec (``codec.py``) turns bytes into packet events and packets into bytes and knows nothing
of sockets; a session (``session.py``) holds the protocol's state machine as tables; a shell
(``server.py``) feeds the codec from an ``asyncio.Protocol`` and dispatches its events to the
core broker. The core never imports these packages; it loads them by name through
``gateway.registry``.
"""
