"""memoryd: the dsh-memory-protocol v1 daemon (asyncio, single-writer SQLite, JSON-RPC)."""


def __getattr__(name: str) -> str:
    """``__version__``: the installed package's (``memoryd_protocol.__version__``), read on
    first use, not at import: package metadata would cost the stdio relay, which starts on
    every harness spawn, a noticeable part of its start-up."""
    if name == "__version__":
        import memoryd_protocol

        return memoryd_protocol.__version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
