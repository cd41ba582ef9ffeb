"""A real crash: a subprocess writes, flushes some, writes more, and is killed with SIGKILL.

Reopening must find exactly the flushed writes, and (unclean warm-up of an active vbucket) a new
failover entry at the persisted snapshot end (an active vbucket's flushes always end a snapshot;
the incomplete case, a promoted replica, is in test_failover.py).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import dcpflow
from dcpflow.engine import Bucket, EngineError

WRITER = r"""
import json, sys, time
from dcpflow.engine import Bucket, VBucketState

data_dir, mode = sys.argv[1], sys.argv[2]
b = Bucket("crashy", data_dir, num_vbuckets=4, synchronous="FULL")
vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
for i in range(100):
    vb.set(b"k%d" % i, b"v1-%d" % i)
vb.delete(b"k0")
b.flush_all()                                    # persisted: seqnos 1..101, snapshot complete
if mode == "partial":
    for i in range(20):
        vb.set(b"p%d" % i, b"p")                # seqnos 102..121
    vb.checkpoint_manager.create_checkpoint()    # closed
    b.flush(max_items=5)                         # still all of it: a batch never ends inside a checkpoint
for i in range(50, 150):
    vb.set(b"k%d" % i, b"v2-%d" % i)             # acknowledged, never flushed
persisted_cas = max(it.cas for it in vb.ht.values() if it.by_seqno <= vb.persisted_seqno)
print(json.dumps({"uuid": vb.uuid, "persisted": vb.persisted_seqno, "high": vb.high_seqno,
                  "max_persisted_cas": persisted_cas}), flush=True)
time.sleep(120)
"""


def run_and_kill(data_dir: Path, mode: str) -> dict:
    env = dict(os.environ)
    src = str(Path(dcpflow.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data_dir), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode()
        info = json.loads(line)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return info


@pytest.mark.parametrize(("mode", "persisted", "entry_seqno"),
                         [("complete", 101, 101), ("partial", 121, 121)])
def test_sigkill_loses_exactly_the_unflushed_writes(tmp_path, mode, persisted, entry_seqno):
    info = run_and_kill(tmp_path, mode)
    assert info["persisted"] == persisted and info["high"] > persisted

    bucket = Bucket("crashy", tmp_path, num_vbuckets=4)
    try:
        assert not bucket.clean_shutdown
        vb = bucket.vbucket(0)
        assert vb.high_seqno == vb.persisted_seqno == persisted
        assert vb.get_meta(b"k0").deleted
        for i in range(1, 100):
            assert vb.get(b"k%d" % i).value == b"v1-%d" % i  # the v2 overwrites were never flushed
        for i in range(100, 150):
            with pytest.raises(EngineError):
                vb.get(b"k%d" % i)
        p_keys = {k for k in vb.ht if k.startswith(b"p")}
        assert p_keys == ({b"p%d" % i for i in range(20)} if mode == "partial" else set())
        assert vb.num_items == 99 + len(p_keys)

        entries = vb.failover.entries
        assert [e.seqno for e in entries] == [entry_seqno, 0]
        assert entries[1].uuid == info["uuid"] and entries[0].uuid != info["uuid"]
        assert bucket.failovers_stats(0)["vb_0:0:seq"] == entry_seqno

        assert vb.hlc.max_cas >= info["max_persisted_cas"]
        assert vb.set(b"after", b"crash").by_seqno == persisted + 1
    finally:
        bucket.close()
