"""The /ui/ page over plain HTTP: sign-in, the session cookie's limits, escaping, the event log
(failover, rollback, stream ends with reasons) and the chart series."""

import re
import time

from dcpflow.engine import VBucketState
from dcpflow.protocol.status import Status
from tests.dcp.client import DcpClient

from ..conftest import keys_in
from .rest_client import Http, http_of


def sign_in(server) -> tuple[Http, str]:
    http = http_of(server, user=None)
    reply = http.post("/uilogin", {"user": "Administrator", "password": "password"})
    assert reply.status == 303 and reply.headers["location"] == "/ui/"
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    return http, cookie.split(";")[0]


def wait_for_event(server, kind: str, words: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        events = server.call(lambda: list(server.server.mgmt.observer.events))
        found = [e for e in events if e.kind == kind and words in e.text]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {kind} event with {words!r}: {events}"
        time.sleep(0.05)


def test_sign_in_and_the_cookies_limits(server):
    anonymous = http_of(server, user=None)
    assert anonymous.get("/ui/").status == 303
    wrong = anonymous.post("/uilogin", {"user": "Administrator", "password": "nope"})
    assert wrong.status == 401 and "Wrong user name or password" in wrong.text
    http, cookie = sign_in(server)
    page = http.get("/ui/", headers={"Cookie": cookie})
    assert page.status == 200 and "<main" in page.text and 'id="chart-ops"' in page.text
    assert http.get("/pools/default", headers={"Cookie": cookie}).status == 200
    # The cookie reads; it never changes anything (a page elsewhere cannot use a signed-in browser).
    flush = http.post("/pools/default/buckets/default", {"flushEnabled": "1"}, headers={"Cookie": cookie})
    assert flush.status == 401
    assert http.post("/uilogout", headers={"Cookie": cookie}).status == 303
    assert http.get("/ui/main", headers={"Cookie": cookie}).status == 401


def test_the_page_escapes_what_clients_name(server):
    name = '<script>alert("x")</script>'
    with DcpClient(server.port) as c:
        c.num_vbuckets = 64
        c.connect(name=name)
        assert c.stream_request(2).status == Status.SUCCESS
        body = http_of(server).get("/ui/main").text
    assert name not in body and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in body


def test_events_and_series(server):
    http = http_of(server)
    engine = server.server.buckets["default"].engine
    with server.login() as w:
        for k in keys_in(4, 3):
            w.set(k, b"v")
    with DcpClient(server.port) as c:
        c.num_vbuckets = 64
        c.connect(name="events-test")
        assert c.stream_request(4).status == Status.SUCCESS
        wait_for_event(server, "dcp", "'events-test' opened")
        samples = server.call(lambda: len(server.server.mgmt.observer.samples))
        deadline = time.monotonic() + 60
        while server.call(lambda: len(server.server.mgmt.observer.samples)) < samples + 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.call(lambda: engine.set_vbucket_state(4, VBucketState.REPLICA))  # the stream ends: STATE_CHANGED
        wait_for_event(server, "stream-end", "'events-test' vb 4: stream ended (STATE_CHANGED)")
    server.call(lambda: engine.set_vbucket_state(4, VBucketState.ACTIVE))
    failover = wait_for_event(server, "failover", "vb 4 became active (replica before) with a new failover entry")
    assert re.search(r"uuid \d+ at seqno 3", failover.text)

    bucket = server.server.buckets["default"]
    bucket.persistence_paused = True  # no flush batch in flight while the vbucket rolls back
    deadline = time.monotonic() + 60
    while server.call(lambda: engine.flusher.in_flight) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with server.login() as w:
        w.set(keys_in(4, 4)[-1], b"extra")
    server.call(lambda: engine.rollback(4, 3))
    bucket.persistence_paused = False
    wait_for_event(server, "rollback", "vb 4 rolled back to seqno 3")
    assert server.call(lambda: server.server.mgmt.observer.rollbacks["default"]) == 1

    page = http.get("/ui/main").text
    for words in ("STATE_CHANGED", "became active", "rolled back to seqno 3", "events-test"):
        assert words in page, words
    series = http.get("/ui/series.json").json
    assert len(series["t"]) == len(series["ops"]) == len(series["backlog"]) >= 2
