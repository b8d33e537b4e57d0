"""memoryd: the dsh-memory-protocol v1 daemon (asyncio, single-writer SQLite, JSON-RPC)."""

__version__ = "0.1.0"
