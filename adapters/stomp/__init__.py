"""STOMP 1.0, 1.1 and 1.2 clients on the core: see adapters/stomp/README.md."""
