"""Transports: the gateway as a client of other messaging systems (see transports/README.md)."""
