"""Replicator bookkeeping: which stream ends leave a vbucket's stream to the consumer."""

import asyncio

import pytest

from dcpflow.dcp.consumer import STREAM_ENDS_TO_RETRY
from dcpflow.protocol.dcp import DcpStreamEnd, StreamEndReason
from dcpflow.protocol.frame import decode_all
from dcpflow.replication.link import LinkError
from dcpflow.replication.replicator import CONSUMER_RETRIES, Replicator


@pytest.mark.parametrize("reason", list(StreamEndReason))
def test_a_stream_end_the_consumer_retries_keeps_the_stream(reason):
    """After SLOW, BACKFILL_FAIL or ROLLBACK the consumer requests the stream again by itself: the
    stream is still this replicator's (an ADD_STREAM now would be refused with KEY_EEXISTS, and a
    later map change must still close it). Any other end is the end of the stream."""
    heard = []
    rep = Replicator("r", ("127.0.0.1", 1), ("127.0.0.1", 2), bucket="default", user="u", password="p",
                     on_stream_end=lambda vb, why: heard.append((vb, why)))
    rep.streams.update({3, 4})
    (frame,) = decode_all(DcpStreamEnd(3, reason, opaque=7).encode())
    rep._stream_end(frame)
    assert heard == [(3, reason)]
    assert rep.streams == ({3, 4} if reason in CONSUMER_RETRIES else {4})
    assert CONSUMER_RETRIES == STREAM_ENDS_TO_RETRY  # what dcpflow's consumer does


class _LostLink:
    """A link whose connection went while a request was on its way."""

    label = "lost"

    def __init__(self):
        self.alive = True

    async def call(self, message, timeout):
        self.alive = False
        raise LinkError(f"{self.label}: connection lost (closed)")


def test_closing_a_stream_on_a_connection_that_goes_meanwhile_is_done_not_failed():
    """The connection's streams went with it (the node released them): a rebalance closing the
    replica stream to start its takeover goes on, where it used to fail on the LinkError."""
    rep = Replicator("r", ("127.0.0.1", 1), ("127.0.0.1", 2), bucket="default", user="u", password="p")
    rep.producer, rep.consumer = _LostLink(), _LostLink()
    rep.streams.add(5)
    asyncio.run(rep.close_stream(5))
    assert 5 not in rep.streams and not rep.alive


def test_a_refused_close_stream_on_a_live_connection_still_fails():
    class Refusing(_LostLink):
        async def call(self, message, timeout):
            raise LinkError("refused", 0x86)

    rep = Replicator("r", ("127.0.0.1", 1), ("127.0.0.1", 2), bucket="default", user="u", password="p")
    rep.producer, rep.consumer = Refusing(), Refusing()
    with pytest.raises(LinkError):
        asyncio.run(rep.close_stream(5))
