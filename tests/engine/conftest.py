"""Shared fixtures: real buckets on disk in tmp_path, and a controllable clock."""

import pytest

from dcpflow.engine import Bucket, VBucketState


class FakeClock:
    """Wall clock in seconds that tests move by hand (expiry, delete times, purge age)."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_bucket(tmp_path):
    """make_bucket(**kwargs) -> Bucket in tmp_path (4 vbuckets unless told); closed uncleanly at teardown."""
    opened: list[Bucket] = []

    def make(name: str = "default", **kwargs) -> Bucket:
        kwargs.setdefault("num_vbuckets", 4)
        kwargs.setdefault("synchronous", "NORMAL")
        bucket = Bucket(name, tmp_path, **kwargs)
        opened.append(bucket)
        return bucket

    yield make
    for bucket in opened:
        if not bucket.closed:
            bucket.close(clean=False)


@pytest.fixture
def bucket(make_bucket, clock):
    """A rev-seqno bucket with vbucket 0 active, on the fake clock."""
    b = make_bucket(clock=clock)
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    return b
