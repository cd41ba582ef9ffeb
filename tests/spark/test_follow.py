"""pipeline.ProgressReader and follow: every batch reported once, in order, reading all of a
query's progress reports only after a gap (each report is a py4j answer that stalls ~44 ms when
it is large; docs/spark.md, "Offsets")."""

from dcpflow.spark.pipeline import ProgressReader, follow


def report(batch_id: int, t: int, rows: int | None = None) -> dict:
    return {"batchId": batch_id, "timestamp": f"2026-11-25T00:00:{t:02d}.000Z",
            "numInputRows": 10 * (batch_id + 1) if rows is None else rows,
            "durationMs": {"triggerExecution": 1500}, "sources": [{"endOffset": None, "latestOffset": None}]}


class ScriptedQuery:
    """A streaming query whose progress moves on by one step per isActive check."""

    def __init__(self, steps: list[list[dict]]):
        self.steps = steps  # per poll: the reports so far
        self.poll = 0
        self.recent_reads = 0

    @property
    def isActive(self) -> bool:
        self.poll += 1
        return self.poll < len(self.steps)

    def _reports(self) -> list[dict]:
        return self.steps[min(max(self.poll, 1), len(self.steps)) - 1]

    @property
    def lastProgress(self):
        reports = self._reports()
        return reports[-1] if reports else None

    @property
    def recentProgress(self):
        self.recent_reads += 1
        return list(self._reports())

    def awaitTermination(self):
        return None

    def exception(self):  # the query ended well
        return None


def test_follow_reports_each_batch_once_in_order_reading_everything_only_after_a_gap():
    b = {i: report(i, i) for i in range(3, 9)}
    # polls see: nothing, batch 3 (a resumed query's first), 4, 4 again, 5-7 at once; batch 8 only
    # after the query ended
    q = ScriptedQuery([[], [b[3]], [b[3], b[4]], [b[3], b[4]], [b[i] for i in range(3, 8)],
                       [b[i] for i in range(3, 9)]])
    seen = []
    reports = follow(q, "changelog", seen.append, poll=0)
    assert [r.batch_id for r in reports] == [3, 4, 5, 6, 7, 8] == [r.batch_id for r in seen]
    assert [r.rows for r in reports] == [40, 50, 60, 70, 80, 90]
    assert reports[0].seconds == 1.5 and reports[0].lag is None and reports[0].query == "changelog"
    assert q.recent_reads == 2  # the first report (were there earlier ones?) and the gap 5-7


def test_a_batch_reported_idle_then_with_rows_is_not_lost():
    """A live query reports an idle trigger under the next batch's id (no rows), then the batch
    itself under the same id."""
    idle, real, after = report(6, 10, rows=0), report(6, 11), report(7, 12)
    q = ScriptedQuery([[report(5, 9)], [report(5, 9), idle], [report(5, 9), idle, real],
                       [report(5, 9), idle, real, after]])
    reader = ProgressReader(q)
    got = []
    for step in range(1, 5):
        q.poll = step
        got += [(p["batchId"], p["numInputRows"]) for p in reader.new()]
        assert reader.new() == []  # nothing new until the query moves on
    assert got == [(5, 60), (6, 0), (6, 70), (7, 80)]
    assert [r.batch_id for r in follow(ScriptedQuery(q.steps), "live", poll=0)] == [5, 6, 7]


def test_the_batch_behind_an_idle_report_is_read_when_the_next_one_is_already_there():
    """The idle report of batch 6 was the newest seen; by the next poll batch 6 ran and batch 7
    too, so `lastProgress` (7) follows the id seen (6) and yet batch 6's real report lies between."""
    idle, real, after = report(6, 10, rows=0), report(6, 11), report(7, 12)
    q = ScriptedQuery([[report(5, 9), idle], [report(5, 9), idle, real, after]])
    reader = ProgressReader(q, "live")
    q.poll = 1
    assert [r.batch_id for r in reader.batches()] == [5]
    q.poll = 2
    assert [(r.batch_id, r.rows) for r in reader.batches()] == [(6, 70), (7, 80)]


def test_reports_that_came_through_spark_connect_count_their_rows_per_source():
    """Over Spark Connect a progress report's top-level `numInputRows` is None (the JSON carries
    it per source only); the reader must still see the batch and its rows."""
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    def connect_report(batch_id, t, rows):
        j = dict(report(batch_id, t, rows), id="00000000-0000-0000-0000-000000000001",
                 runId="00000000-0000-0000-0000-000000000002", name="q", batchDuration=1500, stateOperators=[],
                 sink={"description": "FileSink", "numOutputRows": -1, "metrics": {}})
        del j["numInputRows"]
        j["sources"] = [{"description": "dcp", "startOffset": None, "endOffset": None, "latestOffset": None,
                         "numInputRows": rows, "inputRowsPerSecond": 1.0, "processedRowsPerSecond": 1.0,
                         "metrics": {}}]
        return StreamingQueryProgress.fromJson(j)

    reports = [connect_report(0, 1, 40), connect_report(1, 2, 0), connect_report(2, 3, 25)]
    assert reports[0]["numInputRows"] is None and reports[0].numInputRows == 40
    got = follow(ScriptedQuery([reports[:1], reports[:2], reports]), "changelog", poll=0)
    assert [(r.batch_id, r.rows) for r in got] == [(0, 40), (2, 25)]


def test_failure_line_names_the_reason_in_one_line():
    from py4j.protocol import Py4JError, Py4JNetworkError

    from dcpflow.spark.pipeline import failure_line, transient

    spark_error = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_"
                   "RUNTIME_ERROR] Failed when Python streaming data source perform latestOffset: Traceback (most "
                   "recent call last):\n  File \"x.py\", line 1, in run\n    call()\n"
                   "dcpflow.client.errors.ConnectionLostError: closed\n\nDuring handling of the above exception, "
                   "another exception occurred:\n\nTraceback (most recent call last):\n  File \"y.py\", line 2\n"
                   "dcpflow.client.errors.ConnectError: could not bootstrap: connection refused\n"
                   "=== Streaming Query ===\nIdentifier: dcpflow_changelog [id = 1]\n")
    line = failure_line(RuntimeError(spark_error))
    assert line == ("[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform "
                    "latestOffset: ConnectError: could not bootstrap: connection refused")
    try:
        try:
            raise Py4JNetworkError("Error while sending or receiving")
        except Py4JNetworkError as e:
            raise Py4JError("An error occurred while calling o81.isActive") from e
    except Py4JError as e:
        assert failure_line(e) == "Spark's JVM is gone (killed, or it ran out of memory)"
    assert transient(failure_line(RuntimeError("Python worker failed to connect back. === Streaming Query ===")))
    assert not transient(line)
