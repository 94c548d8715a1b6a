"""read_batch_reply: what one batch answer means for each event (pure, plain data)."""

from __future__ import annotations

import gzip
import zlib

import orjson

from relay.sinks.batch_reply import MAX_REPLY_BYTES, read_batch_reply
from relay.sinks.retry import classify


def outcomes(status: int, body: object, count: int) -> list[str]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return [o.outcome for o in read_batch_reply(status, raw, count, classify).outcomes]


def test_204_and_plain_success_deliver_every_event():
    assert outcomes(204, b"", 3) == ["delivered"] * 3
    assert outcomes(200, {"status": "success", "summary": {"received": 3, "successful": 3, "failed": 0}}, 3) \
        == ["delivered"] * 3
    assert outcomes(200, b"not json", 2) == ["delivered"] * 2


def test_partial_success_per_the_spec_retries_only_retriable_failures():
    reply = {"status": "partial_success",
             "summary": {"received": 4, "successful": 2, "failed": 2, "retriable": 1, "non_retriable": 1},
             "failed_events": [{"index": 1, "reason": "Timeout", "retriable": True},
                               {"index": 3, "reason": "Unsupported event type", "retriable": False}]}
    reading = read_batch_reply(200, orjson.dumps(reply), 4, classify)
    assert [o.outcome for o in reading.outcomes] == ["delivered", "retry", "delivered", "reject"]
    assert reading.result == "partial"
    assert "Unsupported event type" in reading.outcomes[3].detail


def test_openmetadata_spelling_and_missing_retriable_flag_is_permanent():
    reply = {"status": "partial_success", "summary": {"received": 2, "successful": 1, "failed": 1},
             "failedEvents": [{"index": 0, "reason": "cannot resolve dataset"}]}
    assert outcomes(200, reply, 2) == ["reject", "delivered"]


def test_failures_that_cannot_be_placed_send_the_rest_alone():
    assert outcomes(200, {"status": "partial_success", "summary": {"received": 2, "failed": 1}}, 2) \
        == ["single", "single"]
    reply = {"status": "partial_success", "failed_events": [{"index": 7, "retriable": True},
                                                           {"index": 0, "retriable": True}]}
    assert outcomes(200, reply, 2) == ["retry", "single"]
    # A summary counting more failures than the list names (a collector listing only the
    # first few): the unnamed failures are among the others, so they go again, alone.
    reply = {"status": "partial_success", "summary": {"received": 4, "failed": 3},
             "failed_events": [{"index": 2, "retriable": False}]}
    reading = read_batch_reply(200, orjson.dumps(reply), 4, classify)
    assert [o.outcome for o in reading.outcomes] == ["single", "single", "reject", "single"]
    assert reading.result == "unattributed" and "counts 3 failed, the list names 1" in reading.note


def test_an_index_one_past_the_last_event_places_no_failure():
    reading = read_batch_reply(200, b'{"failed_events":[{"index":2,"retriable":true}]}', 2, classify)
    assert [o.outcome for o in reading.outcomes] == ["single", "single"]
    assert reading.result == "unattributed"


def test_an_event_listed_twice_counts_as_one_failure_against_the_summary():
    reply = {"summary": {"failed": 2}, "failed_events": [{"index": 0}, {"index": 0}]}
    reading = read_batch_reply(200, orjson.dumps(reply), 3, classify)
    # The second failure is not named: no other event is known to be delivered.
    assert [o.outcome for o in reading.outcomes] == ["reject", "single", "single"]
    assert reading.result == "unattributed"


def test_whole_batch_statuses():
    assert outcomes(503, b"busy", 2) == ["retry", "retry"]
    assert outcomes(429, b"", 1) == ["retry"]
    refused = read_batch_reply(400, b"bad event in batch", 2, classify)
    assert [o.outcome for o in refused.outcomes] == ["single", "single"]
    assert refused.outcomes[0].status == 400 and refused.result == "refused"


def test_a_success_reply_too_long_to_read_delivers_every_event_and_says_so():
    """Read like a body that is not JSON: it names no failed event and the 2xx stands."""
    reading = read_batch_reply(200, None, 3, classify)
    assert [o.outcome for o in reading.outcomes] == ["delivered"] * 3
    assert reading.result == "ok" and "not read" in reading.note


def test_an_event_not_listed_as_failed_is_delivered_whatever_the_status_says():
    """OpenMetadata: events written with some datasets unresolved are counted in
    summary.partial and listed in unresolvedDatasets, never in failedEvents."""
    reply = {"status": "partial_success", "summary": {"received": 3, "successful": 1, "failed": 0, "partial": 2},
             "unresolvedDatasets": [{"eventIndex": 0, "namespace": "s3://x", "name": "t", "reason": "notFound"}]}
    reading = read_batch_reply(200, orjson.dumps(reply), 3, classify)
    assert [o.outcome for o in reading.outcomes] == ["delivered"] * 3 and reading.result == "ok"
    # Says some failed, but neither lists them in a form read here nor counts them (an
    # integer summary.failed): nothing is known delivered, so each goes alone.
    for reply in ({"status": "PARTIAL_SUCCESS"}, {"status": "partial_success", "errors": [{"index": 1}]},
                  {"status": "partial_success", "summary": {"failed": "2"}},
                  {"status": "partial_success", "failedEvents": {"index": 1}}):
        assert outcomes(200, reply, 2) == ["single"] * 2, reply
    # A list alone (the shape OpenLineage PR #4109 proposes) places what failed.
    reply = {"status": "partial_success", "failed_events": [{"index": 1, "reason": "r", "retriable": False}]}
    assert outcomes(200, reply, 2) == ["delivered", "reject"]
    # Failures counted but not listed, or a failure neither listed nor counted: not placed.
    assert outcomes(200, {"status": "partial_success", "summary": {"failed": 1}}, 2) == ["single"] * 2
    assert outcomes(200, {"status": "failure"}, 2) == ["single"] * 2
    assert outcomes(200, {"status": "failure", "summary": {"received": 2, "failed": 0, "skipped": 2}}, 2) == \
        ["delivered"] * 2


def test_a_4xx_listing_failed_events_gives_per_event_verdicts():
    """The newest OpenMetadata answers 400 with failedEvents when every event failed."""
    reply = {"status": "failure", "summary": {"received": 2, "failed": 2},
             "failedEvents": [{"index": 0, "reason": "no such table", "retriable": False},
                              {"index": 1, "reason": "timeout", "retriable": True}]}
    reading = read_batch_reply(400, orjson.dumps(reply), 2, classify)
    assert [(o.outcome, o.status) for o in reading.outcomes] == [("reject", 400), ("retry", 400)]
    assert "no such table" in reading.outcomes[0].detail and reading.result == "partial"
    # One it does not name: a refusal says nothing of it, so it goes alone.
    reply = {"status": "failure", "failedEvents": [{"index": 1, "reason": "bad", "retriable": False}]}
    assert outcomes(400, reply, 3) == ["single", "reject", "single"]
    # A 4xx body without a list is a batch refused whole, as before.
    assert outcomes(400, {"message": "Invalid batch format"}, 2) == ["single", "single"]


def test_a_batch_url_answering_404_405_or_501_has_no_batch_endpoint():
    for status in (404, 405, 501):
        reading = read_batch_reply(status, b"Not Found", 2, classify)
        assert [o.outcome for o in reading.outcomes] == ["single", "single"] and reading.result == "unsupported"
    assert outcomes(503, b"", 1) == ["retry"] and outcomes(500, b"", 1) == ["retry"]


def test_a_reply_status_quoted_in_part_is_scrubbed_before_it_is_cut():
    """The status is quoted cut to 40 characters: cut first, a token it echoes was no longer
    whole when scrubbed, and its first part reached the note (logged) and each detail."""
    token = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
    reply = {"status": f"failure: bad token {token}"}
    reading = read_batch_reply(200, orjson.dumps(reply), 2, classify, scrub=lambda text: text.replace(token, "***"))
    quoted = [reading.note] + [o.detail for o in reading.outcomes]
    assert reading.result == "unattributed"
    assert all("eyJhbGci" not in text for text in quoted), quoted
    assert "failure: bad token ***" in reading.note


PARTIAL = orjson.dumps({"status": "partial_success", "failed_events": [{"index": 0, "retriable": True}]})


def test_a_reply_with_a_bom_or_compressed_is_read_as_it_says():
    """A 2xx listing failures is not taken as all delivered because it starts with a UTF-8
    BOM, or is compressed though the relay asked for identity (gzip known by its first
    bytes even without the header)."""
    for body, encoding in ((b"\xef\xbb\xbf" + PARTIAL, None), (gzip.compress(PARTIAL), None),
                           (gzip.compress(PARTIAL), "gzip"), (zlib.compress(PARTIAL), "deflate"),
                           (zlib.compress(PARTIAL)[2:-4], "deflate"),  # raw deflate, as some servers send
                           (gzip.compress(PARTIAL[:20]) + gzip.compress(PARTIAL[20:]), "x-gzip"),
                           (PARTIAL, "identity")):
        reading = read_batch_reply(200, body, 2, classify, encoding=encoding)
        assert [o.outcome for o in reading.outcomes] == ["retry", "delivered"], (body[:10], encoding)
    listed = orjson.dumps({"failedEvents": [{"index": 1, "reason": "bad"}]})
    refused = read_batch_reply(400, gzip.compress(listed), 2, classify, encoding="gzip")
    assert [o.outcome for o in refused.outcomes] == ["single", "reject"]


def test_a_compressed_reply_that_cannot_be_read_sends_its_events_alone():
    """It may list failures: none of its events is known to be delivered."""
    for body, encoding in ((gzip.compress(PARTIAL)[:-12], "gzip"), (b"\x1f\x8bnot gzip", None),
                           (PARTIAL, "br"), (b"garbage", "deflate")):
        reading = read_batch_reply(200, body, 2, classify, encoding=encoding)
        assert reading.result == "unattributed" and reading.note, (body[:10], encoding)
        assert [o.outcome for o in reading.outcomes] == ["single", "single"]


def test_a_compressed_reply_is_not_inflated_past_the_reply_limit():
    """A zip bomb: 4 MiB decompressed is the limit, as for a body that came so; past it the
    reply is not read (the 2xx stands, noted)."""
    bomb = gzip.compress(b"{" + b" " * (MAX_REPLY_BYTES + 10) + b"}")
    assert len(bomb) < 10_000
    reading = read_batch_reply(200, bomb, 2, classify, encoding="gzip")
    assert [o.outcome for o in reading.outcomes] == ["delivered", "delivered"] and "not read" in reading.note
    assert [o.outcome for o in read_batch_reply(400, bomb, 2, classify, encoding="gzip").outcomes] == ["single"] * 2
