"""Avoiding a needless roll back to zero after tombstone purging (rollback.md "Wild card purge",
stream-request-value.md purge_seqno): a resume from below the purge seqno rolls back to 0, unless
the client sends the purge seqno it saw (V2.2 markers) or asks to ignore purged tombstones."""

import time

from dcpflow.client import DcpClient, MemoryStore, Offset, Rollback

from .conftest import PASSWORD, USER, engine_vbucket, flush_to_disk, keys_in, run, url

VB = 0


def purged_server(make_server):
    server = make_server(purge_interval=0.0, compaction_interval=0.1)
    keys = keys_in(VB, 6, prefix="p")
    with server.login() as w:
        for k in keys:
            w.set(k, b"v", vbucket=VB)
        for k in keys[:2]:
            w.delete(k, vbucket=VB)
    deadline = time.monotonic() + 60
    while engine_vbucket(server, VB, "purge_seqno") < 8:
        assert time.monotonic() < deadline, "compaction did not purge the tombstones"
        time.sleep(0.05)
    flush_to_disk(server, VB)  # a stream from below must now backfill: Disk snapshot, V2.2 marker
    return server


def test_resume_below_the_purge_seqno(make_server):
    server = purged_server(make_server)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            uuid = (await c.failover_logs([VB]))[VB][0][0]
            below = {VB: Offset.at(uuid, 3)}

            async def read(**kw):
                return [e async for e in c.events([VB], start=below, end="now", **kw)]
            plain = await read()
            ignoring = await read(ignore_purged_tombstones=True)
            # A first read from 0 learns the server's purge seqno from the V2.2 disk marker ...
            store = MemoryStore()
            [e async for e in c.events([VB], end="now", state=store)]
            saved = store.load()
            # ... and a resume that carries it is not sent back to 0.
            saved.offsets[VB] = below[VB]
            store.save(saved)
            informed = [e async for e in c.events([VB], start="saved", state=store, end="now")]
            return plain, ignoring, saved.purge_seqnos, informed
    plain, ignoring, purge, informed = run(go())
    assert [(e.vbucket, e.seqno) for e in plain if isinstance(e, Rollback)] == [(VB, 0)]
    assert not [e for e in ignoring if isinstance(e, Rollback)]
    assert purge == {VB: 8}
    assert not [e for e in informed if isinstance(e, Rollback)]
