"""The /ui/ page in a real browser: Debian's headless Chromium driven by Selenium signs in, and the
page shows the node, the buckets, the vbucket map, a DCP connection with its stream's position and
lag, the event log, and charts drawn by its script - against a live server with a stream open.

Chromium and chromedriver come from Debian's packages (`.ci/run` installs them). Under CI (the
CI environment variable) their absence fails the test; elsewhere it is skipped with the reason.
Set DCPFLOW_UI_SCREENSHOT=<file.png> to keep a screenshot (docs/images/ui.png is one).
"""

import os
import shutil
import time

import pytest

from dcpflow.engine import VBucketState
from dcpflow.protocol.status import Status
from tests.dcp.client import DcpClient

from ..conftest import keys_in
from .test_ui import wait_for_event

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1100")


def _find(*names: str) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


@pytest.fixture
def browser(tmp_path):
    chromium = _find("chromium", "chromium-browser")
    driver_path = _find("chromedriver")
    if chromium is None or driver_path is None:
        message = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"the browser test must run under CI: {message}")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, condition, timeout: float = 30.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = condition(driver)
        except Exception:  # the element is being replaced by a refresh: try again
            result = None
        if result:
            return result
        assert time.monotonic() < deadline, f"the page never showed {what}"
        time.sleep(0.1)


def test_the_status_page_in_chromium(server, browser):
    from selenium.webdriver.common.by import By

    engine = server.server.buckets["default"].engine
    with server.login() as w:
        for i, k in enumerate(keys_in(3, 50)):
            w.set(k, b"x" * 1000)
            if i % 10 == 0:
                w.get(k)
    server.call(lambda: engine.set_vbucket_state(9, VBucketState.REPLICA))
    server.call(lambda: engine.set_vbucket_state(9, VBucketState.ACTIVE))  # a failover for the event log
    with DcpClient(server.port) as dcp_client:
        dcp_client.num_vbuckets = 64
        dcp_client.connect(name="browser-test-stream")
        dcp_client.controls(connection_buffer_size=2000)  # never acknowledged: the stream keeps a backlog
        assert dcp_client.stream_request(3).status == Status.SUCCESS
        wait_for_event(server, "dcp", "'browser-test-stream' opened")

        base = f"http://127.0.0.1:{server.server.mgmt.port}"
        browser.get(base + "/ui/")
        wait(browser, lambda d: d.find_element(By.ID, "user"), what="the sign-in form")
        browser.find_element(By.ID, "user").send_keys("Administrator")
        browser.find_element(By.ID, "password").send_keys("password")
        browser.find_element(By.ID, "sign-in").click()
        wait(browser, lambda d: d.current_url == base + "/ui/" and d.find_elements(By.CSS_SELECTOR, "main"),
             what="the page after signing in")

        node = browser.find_element(By.CSS_SELECTOR, "p.node").text
        assert f"KV port {server.port}" in node and f"management port {server.server.mgmt.port}" in node
        nodes = browser.find_elements(By.CSS_SELECTOR, "#nodes tr.node")
        assert len(nodes) == 1 and "this node" in nodes[0].text
        bucket = browser.find_element(By.CSS_SELECTOR, '#buckets tr.bucket[data-name="default"]').text.split()
        assert bucket[:4] == ["default", "50", "64", "0"]  # items, active and replica vbuckets
        assert len(browser.find_elements(By.CSS_SELECTOR, '.vbmap[data-bucket="default"] .vb.here')) == 64

        conn = wait(browser, lambda d: d.find_element(
            By.CSS_SELECTOR, '#dcp details.conn[data-name="browser-test-stream"]'), what="the DCP connection")
        assert "producer" in conn.text and "flow control" in conn.text
        conn.find_element(By.TAG_NAME, "summary").click()
        row = wait(browser, lambda d: d.find_element(
            By.CSS_SELECTOR, '#dcp details.conn[data-name="browser-test-stream"][open] tr.stream[data-vb="3"]'),
            what="the stream's row")
        cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        vb, _, state, start, last_sent, high, lag, queued = cells
        assert (vb, state, start, high) == ("3", "in-memory", "0", "50")
        assert int(last_sent) + int(lag) == 50 and int(queued) >= 0

        events = wait(browser, lambda d: d.find_element(By.ID, "events").text, what="events")
        assert "vb 9 became active (replica before) with a new failover entry" in events
        assert "'browser-test-stream' opened" in events

        # The script refreshes <main> and keeps the open connection open; the charts fill in.
        wait(browser, lambda d: int(d.find_element(By.ID, "chart-ops").get_attribute("data-points") or 0) >= 3,
             what="the ops chart")
        points = browser.find_element(By.CSS_SELECTOR, "#chart-backlog polyline").get_attribute("points")
        assert len(points.split()) >= 3
        assert browser.find_elements(By.CSS_SELECTOR, '#dcp details.conn[data-name="browser-test-stream"][open]')
        shot = os.environ.get("DCPFLOW_UI_SCREENSHOT")
        if shot:
            browser.save_screenshot(shot)
        assert browser.get_log("browser") == []  # no script errors, no failed requests
