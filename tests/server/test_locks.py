"""GET_LOCKED (0x94) and UNLOCK_KEY (0x95) over the wire: the lock's CAS, CAS -1 for readers of a
locked document, Locked/NotLocked (ETmpfail without XError), lock times and the request rules."""

from dcpflow.protocol import kv
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.kv import GETL_DEFAULT_TIMEOUT, LOCKED_CAS


def get_locked(c, key: bytes, lock_time: int = 0, **kwargs):
    return c.call(Opcode.GET_LOCKED, key=c.key(key), vbucket=c.vbucket_of(key),
                  extras=lock_time.to_bytes(4, "big") if lock_time else b"", **kwargs)


def unlock(c, key: bytes, cas: int):
    return c.call(Opcode.UNLOCK_KEY, key=c.key(key), vbucket=c.vbucket_of(key), cas=cas)


def test_get_locked_returns_the_document_with_the_lock_cas(admin):
    stored = admin.set(b"doc", b'{"a":1}', flags=3, datatype=1)
    reply = get_locked(admin, b"doc", 10)
    assert reply.status == Status.SUCCESS
    got = kv.GetResponse.from_frame(reply)
    assert (got.value, got.flags, got.datatype) == (b'{"a":1}', 3, 1)
    assert got.cas not in (0, stored.cas, LOCKED_CAS)
    # readers see CAS -1 while it is locked (Document.md), the real one afterwards
    assert admin.get(b"doc").cas == LOCKED_CAS
    assert unlock(admin, b"doc", got.cas).status == Status.SUCCESS
    assert admin.get(b"doc").cas == got.cas


def test_locked_document_refuses_writes_without_its_cas(admin):
    admin.set(b"doc", b"v1")
    lock_cas = get_locked(admin, b"doc").cas
    assert admin.set(b"doc", b"v2").status == Status.LOCKED
    assert admin.delete(b"doc").status == Status.LOCKED
    assert get_locked(admin, b"doc").status == Status.LOCKED
    assert admin.call(Opcode.APPEND, key=b"doc", value=b"x", vbucket=admin.vbucket_of(b"doc")).status \
        == Status.LOCKED
    assert admin.call(Opcode.INCREMENT, key=b"doc", vbucket=admin.vbucket_of(b"doc"),
                      extras=bytes(20)).status == Status.LOCKED
    assert admin.get(b"doc").value == b"v1"
    reply = admin.set(b"doc", b"v2", cas=lock_cas)
    assert reply.status == Status.SUCCESS  # the lock's CAS gets through, and releases the lock
    assert admin.set(b"doc", b"v3").status == Status.SUCCESS


def test_unlock_statuses(admin):
    admin.set(b"doc", b"v1")
    assert unlock(admin, b"missing", 1).status == Status.KEY_ENOENT
    assert unlock(admin, b"doc", 1).status == Status.NOT_LOCKED
    lock_cas = get_locked(admin, b"doc").cas
    assert unlock(admin, b"doc", lock_cas + 1).status == Status.LOCKED
    assert unlock(admin, b"doc", lock_cas).status == Status.SUCCESS


def test_clients_without_xerror_get_etmpfail(server, admin):
    admin.set(b"doc", b"v1")
    with server.login(features=()) as legacy:
        assert unlock(legacy, b"doc", 1).status == Status.ETMPFAIL  # NotLocked
        lock_cas = get_locked(legacy, b"doc").cas
        assert legacy.set(b"doc", b"v2").status == Status.ETMPFAIL  # Locked
        assert unlock(legacy, b"doc", lock_cas).status == Status.SUCCESS
    assert admin.set(b"doc", b"v2").status == Status.SUCCESS


def test_lock_time_zero_or_too_long_takes_the_default(server, admin):
    admin.set(b"a", b"1")
    admin.set(b"b", b"1")
    get_locked(admin, b"a", 0)
    get_locked(admin, b"b", 3600)  # above the maximum (30 s)

    def until() -> dict:
        engine = server.server.buckets["default"].engine
        return {k: engine.vbucket(admin.vbucket_of(k)).locks[k][1] for k in (b"a", b"b")}

    times = server.call(until)
    now = server.call(lambda: server.server.buckets["default"].engine.vbucket(0)._clock())
    for t in times.values():
        assert GETL_DEFAULT_TIMEOUT - 2 < t - now <= GETL_DEFAULT_TIMEOUT


def test_request_rules(admin):
    admin.set(b"doc", b"v1")
    bad = admin.call(Opcode.GET_LOCKED, key=b"doc", vbucket=admin.vbucket_of(b"doc"), value=b"x")
    assert bad.status == Status.EINVAL
    bad = admin.call(Opcode.GET_LOCKED, key=b"doc", vbucket=admin.vbucket_of(b"doc"), extras=bytes(8))
    assert bad.status == Status.EINVAL
    assert admin.call(Opcode.UNLOCK_KEY, key=b"doc", vbucket=admin.vbucket_of(b"doc")).status == Status.EINVAL
    assert get_locked(admin, b"doc").status == Status.SUCCESS  # the bad requests locked nothing
