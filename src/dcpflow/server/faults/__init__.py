"""Fault injection: the faults a server can be made to suffer on demand, for people who test
their DCP consumers (failovers, rollbacks, stream ends, dropped connections, paused persistence,
delayed replies). The management plane serves them over HTTP (server/mgmt/faults.py) and
`dcpflow fault` from the command line.

Modules: injector (`Faults`, one per Server: every fault and the list of those in force), delays
(the rules that hold KV requests) and streams (the one module that reaches DCP connections).
"""

from .injector import END_REASONS, BucketGone, FaultError, Faults

__all__ = ["END_REASONS", "BucketGone", "FaultError", "Faults"]
