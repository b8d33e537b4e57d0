"""memoryd: the dsh-memory-protocol v1 daemon (asyncio, single-writer SQLite, JSON-RPC)."""

from memoryd_protocol import __version__ as __version__
