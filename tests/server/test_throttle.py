"""Password guessing is slowed (server/throttle.py): failed logins counted per source address and
per user lock the guesser out for a time that doubles with each failure, on the KV port and the
management port, without holding up anyone else - another address, a successful login, the test
suite's own connections from 127.0.0.1."""

import time

import pytest

from dcpflow.protocol.hello import Feature
from dcpflow.protocol.status import Status
from dcpflow.server.throttle import FIRST_LOCKOUT, FREE_FAILURES, MAX_ENTRIES, LoginThrottle

from .mgmt.rest_client import http_of


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guesses_take(throttle: LoginThrottle, clock: Clock, n: int, address: str = "10.0.0.1",
                 user: str = "Administrator") -> float:
    """Seconds `n` wrong passwords take a guesser that retries the moment it is let in."""
    start = clock.now
    for _ in range(n):
        while (wait := throttle.check(address, user)) > 0:
            clock.now += wait
        throttle.failed(address, user)
    return clock.now - start


def documented_minimum(free: int, lockout: float, n: int) -> float:
    """The docs' figure: after `free` failures, each one locks for lockout x 2^k, k capped at 6."""
    return sum(lockout * 2 ** min(f - free, 6) for f in range(free, n))


def test_twenty_guesses_take_the_documented_time():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    assert (FREE_FAILURES, FIRST_LOCKOUT) == (5, 1.0)
    assert documented_minimum(5, 1.0, 20) == 639.0  # docs/server.md: "at least 639 s"
    assert guesses_take(throttle, clock, 20) >= 639.0
    # the first five are free: a user who mistypes a few times is never held up
    clock2 = Clock()
    assert guesses_take(LoginThrottle(clock=clock2), clock2, 5) == 0.0


def test_a_guesser_does_not_hold_up_anyone_else():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    guesses_take(throttle, clock, 12)  # 10.0.0.1 guessing at Administrator
    assert throttle.check("10.0.0.1", "Administrator") > 0
    assert throttle.check("10.0.0.1", "reader") > 0  # the address is locked, whatever user it names
    assert throttle.check("10.0.0.2", "Administrator") == 0  # the administrator's own desk
    throttle.succeeded("10.0.0.2", "Administrator")
    assert throttle.check("10.0.0.1", "Administrator") > 0  # someone else's login resets nothing


def test_many_addresses_guessing_one_user_are_locked_per_user():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for i in range(FREE_FAILURES):  # five hosts, one guess each: none is locked as an address
        throttle.failed(f"10.0.1.{i}", "Administrator")
    assert throttle.check("10.0.1.0", "Administrator") > 0  # but the user is, for addresses that failed
    assert throttle.check("10.0.1.0", "reader") == 0
    assert throttle.check("10.0.1.99", "Administrator") == 0  # an address that never failed is not


def test_a_successful_login_forgets_only_its_own_failures():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(4):
        throttle.failed("10.0.0.1", "reader")
    throttle.succeeded("10.0.0.1", "reader")  # a user who mistyped and then got it right
    for _ in range(4):
        throttle.failed("10.0.0.1", "reader")
    assert throttle.check("10.0.0.1", "reader") == 0  # 4 + 4 failures, but a success between
    for _ in range(4):
        throttle.failed("10.0.0.1", "Administrator")
    throttle.succeeded("10.0.0.1", "decoy")  # logging in as one's own account resets no guesses at another's
    throttle.failed("10.0.0.1", "Administrator")
    assert throttle.check("10.0.0.1", "Administrator") > 0


def test_failures_are_forgotten_and_the_memory_is_bounded():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    guesses_take(throttle, clock, 8)
    clock.now += 901  # FORGET_AFTER after the last failure
    assert throttle.check("10.0.0.1", "Administrator") == 0
    throttle.failed("10.0.0.1", "Administrator")
    assert throttle.check("10.0.0.1", "Administrator") == 0  # counting starts again
    for i in range(3 * MAX_ENTRIES):
        throttle.failed(f"10.1.{i // 250}.{i % 250}", f"user{i}")
    assert len(throttle._pairs) <= MAX_ENTRIES
    assert len(throttle._addresses) <= MAX_ENTRIES + 1 and len(throttle._users) <= MAX_ENTRIES + 1


def test_throttling_can_be_turned_off():
    clock = Clock()
    assert guesses_take(LoginThrottle(0, clock=clock), clock, 50) == 0.0


# -- real sockets -------------------------------------------------------------------------------

FREE, LOCKOUT = 3, 0.01  # the servers below: the defaults' shape, a hundredth of their time


def test_kv_guesses_are_throttled_and_another_address_is_not(make_server):
    """20 wrong SCRAM passwords from 127.0.0.1, retried whenever refused, take at least the
    documented time; meanwhile the administrator logs in from 127.0.0.2 at the first try."""
    server = make_server(login_failures=FREE, login_lockout=LOCKOUT)
    minimum = documented_minimum(FREE, LOCKOUT, 20)
    checked = refused = 0
    started = time.monotonic()
    with server.client() as c:
        c.hello(Feature.XERROR)
        while checked < 20:
            reply = c.auth_scram("Administrator", f"guess{checked}")
            assert reply.status == Status.AUTH_ERROR
            if b"too many failed logins" in reply.value:
                refused += 1
                if refused == 1:  # the lockout is on: the administrator, elsewhere, is not held up
                    with server.client(source="127.0.0.2") as admin:
                        assert admin.auth_scram("Administrator", "password").status == Status.SUCCESS
                time.sleep(LOCKOUT / 4)
            else:
                assert b"Authentication failed" in reply.value
                checked += 1
    assert time.monotonic() - started >= minimum
    assert refused > 0 and server.call(lambda: server.server.throttle.refused) == refused


def test_http_guesses_are_throttled_with_429_and_another_address_is_not(make_server):
    server = make_server(login_failures=FREE, login_lockout=LOCKOUT)
    http = http_of(server)
    minimum = documented_minimum(FREE, LOCKOUT, 20)
    checked = refused = 0
    started = time.monotonic()
    while checked < 20:
        reply = http.as_user("Administrator", f"guess{checked}").get("/pools/default")
        if reply.status == 429:
            refused += 1
            assert int(reply.headers["retry-after"]) >= 1 and "Too many failed logins" in reply.json["message"]
            if refused == 1:
                admin = http_of(server, source="127.0.0.2")
                assert admin.get("/pools/default").status == 200
            time.sleep(LOCKOUT / 4)
        else:
            assert reply.status == 401
            checked += 1
    assert time.monotonic() - started >= minimum and refused > 0


@pytest.mark.parametrize("port", ["kv", "http"])
def test_the_defaults_leave_a_few_mistakes_alone(make_server, port):
    """With the default settings (5 free failures, the suite's servers), four wrong passwords and
    a right one, twice, from 127.0.0.1: never refused."""
    server = make_server()
    for _ in range(2):
        if port == "kv":
            with server.client() as c:
                for _ in range(4):
                    assert b"too many" not in c.auth_scram("reader", "wrong").value
                assert c.auth_scram("reader", "readpw").status == Status.SUCCESS
        else:
            http = http_of(server)
            for _ in range(4):
                assert http.as_user("reader", "wrong").get("/pools/default").status == 401
            assert http.as_user("reader", "readpw").get("/pools/default").status == 200
