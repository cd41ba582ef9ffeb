"""Model-based test: the bucket against a dict through set/delete/flush/restart/crash/compact."""

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dcpflow.engine import Bucket, EngineError, VBucketState, vbucket_for_key
from dcpflow.protocol.status import Status

NUM_VB = 4
KEYS = [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]


class Clock:
    def __init__(self):
        self.now = 1_700_000_000.0

    def __call__(self):
        return self.now


class BucketMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="dcpflow-sm-")
        self.clock = Clock()
        self.bucket = self._open()
        for vb in range(NUM_VB):
            self.bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
        self.model: dict[bytes, bytes] = {}
        self.durable: dict[bytes, bytes] = {}
        self.high = dict.fromkeys(range(NUM_VB), 0)
        self.durable_high = dict(self.high)
        self.failover_len = dict.fromkeys(range(NUM_VB), 1)

    def _open(self) -> Bucket:
        return Bucket("sm", self.dir, num_vbuckets=NUM_VB, synchronous="OFF", clock=self.clock,
                      purge_interval=0, checkpoint_max_items=3)

    def _vb(self, key: bytes):
        return self.bucket.vbucket(vbucket_for_key(key, NUM_VB))

    @rule(key=st.sampled_from(KEYS), value=st.binary(max_size=6))
    def set(self, key, value):
        vb = self._vb(key)
        item = vb.set(key, value)
        self.high[vb.id] += 1
        assert item.by_seqno == self.high[vb.id]
        self.model[key] = value

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key):
        vb = self._vb(key)
        if key in self.model:
            assert vb.delete(key).deleted
            self.high[vb.id] += 1
            del self.model[key]
        else:
            try:
                vb.delete(key)
            except EngineError as e:
                assert e.status == Status.KEY_ENOENT
            else:
                raise AssertionError("delete of a missing key succeeded")

    @rule()
    def flush(self):
        self.bucket.flush_all()
        self.durable = dict(self.model)
        self.durable_high = dict(self.high)

    @rule()
    def restart_clean(self):
        self.bucket.close()
        self.bucket = self._open()
        assert self.bucket.clean_shutdown
        self.durable = dict(self.model)
        self.durable_high = dict(self.high)

    @rule()
    def crash(self):
        self.bucket.close(clean=False)
        self.bucket = self._open()
        assert not self.bucket.clean_shutdown
        self.model = dict(self.durable)
        self.high = dict(self.durable_high)
        for vbid, vb in self.bucket.vbuckets.items():
            self.failover_len[vbid] = min(self.failover_len[vbid] + 1, 25)
            # flush_all leaves complete snapshots, so the new branch starts at the persisted high seqno
            assert vb.failover.latest.seqno == self.durable_high[vbid]

    @rule()
    def compact(self):
        self.clock.now += 1
        self.bucket.compact()

    @invariant()
    def documents_match_the_model(self):
        for key in KEYS:
            vb = self._vb(key)
            if key in self.model:
                assert vb.get(key).value == self.model[key]
            else:
                try:
                    vb.get(key)
                except EngineError as e:
                    assert e.status == Status.KEY_ENOENT
                else:
                    raise AssertionError(f"{key!r} should not exist")

    @invariant()
    def seqnos_counts_and_failover_logs_match(self):
        for vbid, vb in self.bucket.vbuckets.items():
            assert vb.high_seqno == self.high[vbid]
            assert vb.num_items == sum(1 for k in self.model if vbucket_for_key(k, NUM_VB) == vbid)
            assert len(vb.failover) == self.failover_len[vbid]
            assert vb.failover.latest.seqno <= vb.high_seqno

    def teardown(self):
        if not self.bucket.closed:
            self.bucket.close(clean=False)
        shutil.rmtree(self.dir, ignore_errors=True)


BucketMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestBucketMachine = BucketMachine.TestCase
