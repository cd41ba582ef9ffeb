"""What the fault tests share: the REST client of the server under test, a vbucket's seqnos, and
the application side of tests/client/test_resilience.py (a Mirror that honours rollbacks, a
Follower that reads into it in the background)."""

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.kv import SEQNO_PERSISTENCE_TIMEOUT
from tests.client.test_resilience import Follower, Mirror, caught_up, raw, wait_persisted  # noqa: F401
from tests.server.mgmt.rest_client import http_of  # noqa: F401

USER, PASSWORD = "Administrator", "password"


def engine_of(server_thread, bucket: str = "default"):
    return server_thread.server.buckets[bucket].engine


def vb_state(server_thread, vb: int, bucket: str = "default") -> dict:
    """high seqno, persisted seqno, uuid and failover log of a vbucket, read on the server's thread."""
    def read():
        v = engine_of(server_thread, bucket).vbucket(vb)
        return {"high": v.high_seqno, "persisted": v.persisted_seqno, "uuid": v.uuid,
                "log": [(e.uuid, e.seqno) for e in v.failover.entries]}
    return server_thread.call(read)


def high_seqnos(client) -> dict[int, int]:
    return kvproto.GetAllVbSeqnosResponse.from_frame(client.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()


def persisted(client, vb: int, seqno: int) -> None:
    """SEQNO_PERSISTENCE: returns once vbucket `vb` has `seqno` on disk. The server answers
    ETMPFAIL after its own SEQNO_PERSISTENCE_TIMEOUT (30 s), so the socket waits longer than that:
    a flush slowed by a busy machine is waited for, and a flush that never comes fails on the
    server's answer, not on a client timeout that says nothing."""
    before = client.sock.gettimeout()
    client.sock.settimeout(SEQNO_PERSISTENCE_TIMEOUT + 10)
    try:
        reply = client.call(Opcode.SEQNO_PERSISTENCE, extras=seqno.to_bytes(8, "big"), vbucket=vb)
    finally:
        client.sock.settimeout(before)
    assert reply.status == Status.SUCCESS, reply
