"""A collector's headers and retry settings as users write them: what the relay accepts,
what it refuses (naming only the header's own reason), and what repr() may show."""

from __future__ import annotations

import pytest

from relay.config import build_config
from relay.errors import ConfigError


def _collector(**extra):
    return build_config({"kafka": {"bootstrap_servers": "x"},
                         "collectors": [{"name": "m", "url": "http://a", **extra}]}).collectors[0]


def _refused(**extra) -> str:
    with pytest.raises(ConfigError) as refused:
        _collector(**extra)
    return str(refused.value)


@pytest.mark.parametrize("value", ["identity", "IDENTITY", " Identity"])
def test_accept_encoding_identity_is_what_the_relay_sends_and_is_accepted(value):
    assert _collector(headers={"Accept-Encoding": value}).headers == {"Accept-Encoding": value}


@pytest.mark.parametrize("name,own,others", [
    ("Transfer-Encoding", "answer 400", ("compressed batch reply", "uncompressed;", "fixed length")),
    ("Accept-Encoding", "compressed batch reply", ("400", "fixed length")),
    ("Content-Encoding", "sends the body uncompressed", ("400", "batch reply")),
    ("content-length", "fixed length", ("400", "batch reply")),
])
def test_a_refused_header_names_only_its_own_reason(name, own, others):
    refused = _refused(headers={name: "gzip"})
    assert f"headers: {name}: the relay sets this header itself" in refused and own in refused, refused
    assert not any(other in refused for other in others), refused


def test_a_low_max_backoff_alone_lowers_the_default_initial_backoff():
    retry = _collector(retry={"max_backoff_s": 0.1}).retry
    assert (retry.initial_backoff_s, retry.max_backoff_s) == (0.1, 0.1)
    assert _collector(retry={"max_backoff_s": 5}).retry.initial_backoff_s == 0.2  # default kept under the cap
    assert "initial_backoff_s: 0.5 is above max_backoff_s" in _refused(
        retry={"initial_backoff_s": 0.5, "max_backoff_s": 0.1})


def test_repr_of_a_collector_shows_no_header_value():
    """Custom headers carry API keys; like the token they must not reach a log line via repr."""
    c = _collector(headers={"X-Api-Key": "k-hunter2"}, token="t-hunter2")
    assert c.headers == {"X-Api-Key": "k-hunter2"}
    assert "hunter2" not in repr(c) and "hunter2" not in str(c)
