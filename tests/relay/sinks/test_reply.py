"""relay.sinks.reply: what a redirect's detail says of where it pointed (the detail goes
into the collector_rejected dead letter and the dead_lettered log line)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from yarl import URL

from relay.sinks.reply import ReplyTally, redirect_detail

SENT_TO = URL("https://collector.example.com/api/v1/lineage")


def detail(location: str) -> str:
    return redirect_detail(SimpleNamespace(headers={"Location": location}, url=SENT_TO))  # type: ignore[arg-type]


@pytest.mark.parametrize("location, where", [
    # An OAuth implicit grant's token is in the fragment; a session id in the path's parameters.
    ("https://login.example.com/cb#access_token=SECRETTOK&token_type=bearer", "https://login.example.com/cb"),
    ("https://login.example.com/cb;jsessionid=SECRETSESSION", "https://login.example.com/cb"),
    ("https://u:SECRETPW@login.example.com/a;jsessionid=SECRETS/b?key=SECRETQ#SECRETF",
     "https://login.example.com/a"),
    ("/login;jsessionid=SECRETSESSION?next=SECRETQ", "https://collector.example.com/login"),
    ("/api/v1/lineage/", "https://collector.example.com/api/v1/lineage/"),
    # Not a URL (yarl refuses it): as given, without userinfo, query, fragment or parameters.
    ("http://u:SECRETPW@[bad/x;SECRETS?SECRETQ#SECRETF", "[bad/x"),
    ("http://[bad/x#SECRETF", "http://[bad/x"),
])
def test_a_redirect_detail_names_where_it_points_without_what_may_be_secret(location, where):
    text = detail(location)
    assert text.startswith(f"redirected to {where}: "), text
    assert "SECRET" not in text, text


def test_an_acceptance_arriving_late_does_not_take_the_last_accepted_request_back():
    tally = ReplyTally()
    tally.accept(5)
    tally.accept(3)  # sent earlier, answered later
    record = tally.record(6)
    assert (record.last_accepted, record.accepted) == (5, 2)
