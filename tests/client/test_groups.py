"""Consumer groups (client/groups.py): the membership rule without sockets, then real `dcpflow tail
--group` processes over a loaded bucket - static shares, and dynamic membership through the bucket
with a member killed by kill -9 (its vbuckets taken over within the lease plus a few seconds, from
the offsets it saved, nothing lost) and a fourth member joining (a rebalance)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dcpflow.client import DcpClient
from dcpflow.client.groups import BucketDocs, Membership, key_of, split
from dcpflow.client.offsets import Offset
from tests.processes import kill_group, popen

from .conftest import NUM_VBUCKETS, PASSWORD, USER, run, url, write
from .test_tail import _env


# -- the rule -------------------------------------------------------------------------------------
@pytest.mark.parametrize("vbuckets,members", [(64, 1), (64, 3), (1024, 3), (1024, 7), (5, 5), (16, 4)])
def test_split_is_even_contiguous_and_complete(vbuckets, members):
    shares = [split(vbuckets, members, i) for i in range(members)]
    assert [vb for share in shares for vb in share] == list(range(vbuckets))
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        split(vbuckets, members, members)


def test_a_join_bumps_the_generation_and_reading_waits_for_every_acknowledgement():
    a, b = Membership("a", lease=5), Membership("b", lease=5)
    doc = a.next_doc(None, 0.0)
    assert doc["generation"] == 1 and not Membership.settled(doc)
    a.acked = 1
    doc = a.next_doc(doc, 0.1)
    assert Membership.settled(doc) and a.share(doc, 8) == list(range(8))
    doc = b.next_doc(doc, 0.2)  # b joins
    assert doc["generation"] == 2 and not Membership.settled(doc)
    b.acked = 2
    doc = b.next_doc(doc, 0.3)
    assert not Membership.settled(doc)  # a still reads generation 1's share: nobody starts yet
    a.acked = 2
    doc = a.next_doc(doc, 0.4)
    assert Membership.settled(doc)
    assert a.share(doc, 8) == [0, 1, 2, 3] and b.share(doc, 8) == [4, 5, 6, 7]


def test_a_member_whose_counter_stops_for_the_lease_is_dropped_by_the_observers_clock():
    a, b = Membership("a", lease=5), Membership("b", lease=5)
    doc = b.next_doc(a.next_doc(None, 0.0), 0.0)
    gen = doc["generation"]
    # b dies; a keeps beating. a first saw b's counter at 1.0 (its clock); b stays until 5 s of
    # a's own clock have passed since then (the absolute times in two processes never meet).
    for now in (1.0, 3.0, 5.0, 6.0):
        doc = a.next_doc(doc, now)
        assert "b" in doc["members"] and doc["generation"] == gen
    doc = a.next_doc(doc, 6.01)
    assert "b" not in doc["members"] and doc["generation"] == gen + 1


def test_a_beating_member_is_never_dropped_and_one_declared_dead_rejoins_as_a_new_generation():
    a, b = Membership("a", lease=2), Membership("b", lease=2)
    doc = a.next_doc(None, 0.0)
    for t in range(1, 20):
        doc = b.next_doc(doc, t * 0.5)
        doc = a.next_doc(doc, t * 0.5 + 0.1)
    assert set(doc["members"]) == {"a", "b"}
    gen = doc["generation"]
    for t in range(1, 10):  # b paused (a long GC, a stopped VM): dropped
        doc = a.next_doc(doc, 10 + t)
    assert set(doc["members"]) == {"a"} and doc["generation"] == gen + 1
    doc = b.next_doc(doc, 100.0)  # b wakes up: it is a join, the generation moves on again
    assert set(doc["members"]) == {"a", "b"} and doc["generation"] == gen + 2


def test_a_leaving_member_removes_itself():
    a, b = Membership("a", lease=5), Membership("b", lease=5)
    doc = b.next_doc(a.next_doc(None, 0.0), 0.0)
    doc = b.next_doc(doc, 1.0, leaving=True)
    assert set(doc["members"]) == {"a"} and doc["generation"] == 3


# -- real processes ---------------------------------------------------------------------------------
#: the member processes of the running test: whatever it leaves running (a failed assertion, a stop
#: that timed out) is killed after it, not left reconnecting to its server's port for minutes
_STARTED: list["Member"] = []


@pytest.fixture(autouse=True)
def _members_end_with_their_test():
    yield
    while _STARTED:
        kill_group(_STARTED.pop().proc)


class Member:
    """A `dcpflow tail --group` process; its stdout lines and stderr `group` lines are collected
    (with the time each arrived) by two threads."""

    def __init__(self, port: int, group: str, *extra: str):
        self.proc = popen([sys.executable, "-m", "dcpflow.cli", "tail", url(port), "--group", group,
                           "--save-interval", "0.5", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        _STARTED.append(self)
        self.lines: list[dict] = []
        self.shares: list[tuple[float, dict]] = []
        self.stderr: list[str] = []
        self.lock = threading.Lock()
        self.readers = [threading.Thread(target=self._read_out, daemon=True),
                        threading.Thread(target=self._read_err, daemon=True)]
        for t in self.readers:
            t.start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append(json.loads(line))

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            with self.lock:
                self.stderr.append(line)
                if line.startswith("group {"):
                    self.shares.append((time.monotonic(), json.loads(line[6:])))

    def share(self) -> dict | None:
        with self.lock:
            return self.shares[-1][1] if self.shares else None

    def output(self) -> list[dict]:
        with self.lock:
            return list(self.lines)

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            raise AssertionError(f"member {self.proc.pid} did not stop within 60 s of signal {sig}") from None
        for t in self.readers:  # the pipes are at their end: every line has been collected
            t.join(30)


def settled(members: list["Member"], num_vbuckets: int = NUM_VBUCKETS) -> int | None:
    """The generation every member reads, if their shares are of one generation and cover every
    vbucket exactly once."""
    shares = [m.share() for m in members]
    if any(s is None for s in shares) or len({s["generation"] for s in shares}) != 1:
        return None
    vbs = sorted(vb for s in shares for vb in s["vbuckets"])
    return shares[0]["generation"] if vbs == list(range(num_vbuckets)) else None


def wait(what: str, check, members, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        for m in members:
            assert m.proc.poll() is None, f"a member exited: {''.join(m.stderr)[-2000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {[m.share() for m in members]}"
        time.sleep(0.05)


class Writer(threading.Thread):
    """Writes new documents without pause until stopped; `written` holds every key and value."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.server = server
        self.written: dict[str, str] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        with self.server.login() as c:
            i = 0
            while not self.halt.is_set():
                key, value = f"live{i}", f'{{"n":{i}}}'
                c.set(key.encode(), value.encode())
                self.written[key] = value
                i += 1
                if i % 50 == 0:
                    time.sleep(0.01)

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


def union_keys(members) -> set[str]:
    return {d["key"] for m in members for d in m.output() if d["event"] == "mutation"}


def group_offsets(port: int, group: str, vbuckets) -> dict[int, Offset]:
    async def go():
        async with await DcpClient.connect(url(port), USER, PASSWORD) as c:
            docs = BucketDocs(c)
            out = {}
            for vb in vbuckets:
                got = await docs.get(key_of(group, "offset", vb))
                if got is not None:
                    out[vb] = Offset.from_json(got[0])
            return out
    return run(go())


def test_static_members_split_the_bucket_and_resume_from_the_groups_offsets(server, writer):
    docs = write(writer, 200)
    members = [Member(server.port, "static", "--member", str(i), "--of", "2") for i in range(2)]
    try:
        wait("every document", lambda: union_keys(members) >= {k.decode() for k in docs}, members)
        shares = [m.share()["vbuckets"] for m in members]
        assert shares == [list(range(32)), list(range(32, 64))]
        for m, share in zip(members, shares, strict=True):
            assert {d["vbucket"] for d in m.output()} <= set(share)
        assert not [d for m in members for d in m.output() if d["key"].startswith("_dcpflow:")]
        members[0].stop()
        assert members[0].proc.returncode == 130  # interrupted, offsets saved
        saved = group_offsets(server.port, "static", range(32))
        assert set(saved) >= {writer.vbucket_of(k) for k in docs if writer.vbucket_of(k) < 32}
        assert all(o.seqno > 0 for o in saved.values())
        new = write(writer, 100, prefix="new")
        again = Member(server.port, "static", "--member", "0", "--of", "2")
        members.append(again)
        mine = {k.decode() for k in new if writer.vbucket_of(k) < 32}
        wait("the new documents", lambda: union_keys([again]) >= mine, [again, members[1]])
        assert union_keys([again]) == mine  # resumed: nothing it had printed before
    finally:
        for m in members:
            m.stop()


def test_dynamic_group_survives_kill9_and_rebalances_when_a_member_joins(server, writer):
    lease = 3.0
    write(writer, 300)
    loader = Writer(server)
    members = [Member(server.port, "dyn", "--lease", str(lease)) for _ in range(3)]
    try:
        gen = wait("three members to settle", lambda: settled(members), members)
        loader.start()
        wait("output from every member", lambda: all(len(m.output()) > 20 for m in members), members)
        victim, survivors = members[1], [members[0], members[2]]
        victim_vbs = victim.share()["vbuckets"]
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        victim.proc.wait(10)
        saved = group_offsets(server.port, "dyn", victim_vbs)  # what it saved last: nobody else writes them yet

        gen2 = wait("the survivors to take over", lambda: (g := settled(survivors)) and g > gen and g, survivors,
                    timeout=lease + 60)
        took = max(next(t for t, s in m.shares if s["generation"] == gen2) for m in survivors) - killed
        assert took <= lease + 5.0, f"takeover took {took:.1f}s (lease {lease}s)"
        for m in survivors:
            share = next(s for _, s in m.shares if s["generation"] == gen2)
            for vb in set(share["vbuckets"]) & set(victim_vbs):
                start = share["starts"][str(vb)]
                assert start <= saved.get(vb, Offset()).seqno, (vb, start, saved.get(vb))

        fourth = Member(server.port, "dyn", "--lease", str(lease))
        members.append(fourth)
        group = survivors + [fourth]
        gen3 = wait("a rebalance when a member joins", lambda: (g := settled(group)) and g > gen2 and g,
                    group)
        assert sorted(len(m.share()["vbuckets"]) for m in group) == [21, 21, 22]
        assert all(m.share()["generation"] == gen3 for m in group)
        loader.stop()
        want = set(loader.written) | {f"doc{i}" for i in range(300)}
        wait("every change in the union of the outputs", lambda: union_keys(members) >= want, group)
        for m in group:  # each member printed only vbuckets it was given, in each generation
            given = {vb for _, s in m.shares for vb in s["vbuckets"]}
            assert {d["vbucket"] for d in m.output()} <= given
    finally:
        if loader.is_alive():
            loader.stop()
        for m in members:
            m.stop()
    for m in survivors + [fourth]:
        assert m.proc.returncode == 130, "".join(m.stderr)[-2000:]


def test_static_members_with_until_now_drain_their_shares_and_exit(server, writer):
    docs = write(writer, 150)
    members = [Member(server.port, "drain", "--member", str(i), "--of", "3", "--until", "now") for i in range(3)]
    for m in members:
        m.proc.wait(60)
        m.stop()
        assert m.proc.returncode == 0, "".join(m.stderr)[-2000:]
    assert union_keys(members) >= {k.decode() for k in docs}
    bad = subprocess.run([sys.executable, "-m", "dcpflow.cli", "tail", url(server.port), "--group", "g", "--until",
                          "now"], capture_output=True, text=True, env=_env(), timeout=60)
    assert bad.returncode == 1 and "static membership" in bad.stderr


def test_a_group_member_with_rollback_mitigation_saves_only_released_offsets(server, writer):
    """client.group() over a mitigated client: with persistence paused nothing is handed out and
    the group's saved offsets stay where they were; once it resumes, everything arrives and the
    offsets saved in the bucket cover it."""
    import asyncio

    from tests.server.faults.helpers import high_seqnos, http_of

    http = http_of(server)
    assert http.post("/faults/buckets/default/persistence/pause").status == 200
    try:
        docs = write(writer, 40)

        async def go():
            async with await DcpClient.connect(url(server.port), USER, PASSWORD, mitigate_rollbacks=True,
                                               persistence_poll_interval=0.01) as c:
                reader = c.group("safe", member=0, of=1, save_interval=0.05)
                got = []

                async def read():
                    async for ev in reader:
                        got.append(ev)
                task = asyncio.ensure_future(read())
                while reader.stats["saves"] < 5 or reader.stream is None or reader.stream.gate is None:
                    assert not task.done(), task
                    await asyncio.sleep(0.01)
                before = len(got)
                offsets_paused = dict(reader.stream.offsets)
                resumed = await asyncio.to_thread(http.post, "/faults/buckets/default/persistence/resume")
                assert resumed.status == 200
                while len({ev.key for ev in got}) < len(docs):
                    assert not task.done(), task
                    await asyncio.sleep(0.01)
                await reader.aclose()
                return before, offsets_paused, got

        before, offsets_paused, got = run(go(), 60)
    finally:
        http.post("/faults/buckets/default/persistence/resume")
    assert before == 0 and all(o.seqno == 0 for o in offsets_paused.values())
    assert {ev.key for ev in got} == set(docs)
    saved = group_offsets(server.port, "safe", range(NUM_VBUCKETS))
    highs = high_seqnos(writer)
    for key in docs:
        vb = writer.vbucket_of(key)
        assert saved[vb].seqno >= 1 and saved[vb].seqno <= highs[vb]


def test_a_member_that_cannot_renew_its_heartbeat_stops_reading_then_rejoins(server, writer):
    """The bucket stops answering the member's writes (SET replies delayed): after 0.75 x the lease
    without a heartbeat written it stops reading on its own - before the others could declare it
    dead and take its vbuckets over - and once the writes go through again it reads again."""
    import asyncio
    import logging
    import time as clock

    from tests.server.mgmt.rest_client import http_of

    http = http_of(server)
    write(writer, 20)
    lease = 4.0

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            reader = c.group("fence", lease=lease, save_interval=0.2)
            got = []

            async def read():
                async for ev in reader:
                    got.append(ev)
            task = asyncio.ensure_future(read())
            while reader.stream is None or len(got) < 20:
                assert not task.done(), task
                await asyncio.sleep(0.01)
            first = reader.generation
            cut = clock.monotonic()
            delayed = await asyncio.to_thread(http.post, "/faults/delays", {"opcode": "set", "seconds": "30"})
            assert delayed.status == 200
            while reader.stream is not None:
                assert not task.done(), task
                await asyncio.sleep(0.01)
            stopped = clock.monotonic() - cut
            cleared = await asyncio.to_thread(http.delete, "/faults/delays")
            assert cleared.status == 200
            while reader.stream is None:
                assert not task.done(), task
                await asyncio.sleep(0.01)
            again = reader.generation
            await reader.aclose()
            return stopped, first, again

    logging.getLogger("dcpflow.client").setLevel(logging.ERROR)
    try:
        stopped, first, again = run(go(), 90)
    finally:
        http.delete("/faults/delays")
    # It fenced itself 0.75 x the lease after its last heartbeat (written at most lease / 5 before
    # the cut): within the lease, before any other member may declare it dead.
    assert stopped < lease, stopped
    assert again is not None and again >= first
