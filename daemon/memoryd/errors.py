"""The daemon's own errors: why it cannot start (or go on), each said in one line.

Every one derives from :class:`DaemonError`; ``memoryd`` (cli.py) prints its message as
``memoryd: <message>`` and exits with its ``exit_code``, never with a traceback. Errors
that cross the wire are the protocol's (``memoryd_protocol.errors``), not these.

Stdlib only: the stdio relay imports it on every harness spawn.
"""

from __future__ import annotations


class DaemonError(Exception):
    """A reason the daemon refuses to start or to go on; the message is one line."""

    #: the exit status of ``memoryd`` when this stops it
    exit_code: int = 1
