"""dcpflow.protocol: the memcached binary protocol with Couchbase's extensions, sans-I/O.

Bytes in, typed messages out; no sockets, no clocks, and no imports of the rest of dcpflow.
"""

from . import dcp, kv, meta  # noqa: F401  (importing them registers their rules)
from .errors import ProtocolError
from .frame import Frame, FrameDecoder, Magic, decode_all, request, response
from .opcodes import Opcode
from .status import Status

__all__ = ["Frame", "FrameDecoder", "Magic", "Opcode", "ProtocolError", "Status", "decode_all", "request",
           "response"]
