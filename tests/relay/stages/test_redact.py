"""Redactor on hostile input: every pattern is bounded, so a megabyte of text built to make
a regex backtrack is redacted in about the time it takes to read it (what it removes is
tested through the Rewriter, in test_rewrite.py)."""

from __future__ import annotations

import time

import pytest

from relay.stages.redact import Redactor

MB = 1_000_000

HOSTILE = {
    "braced values never closed": "&password={" * (MB // 11),
    "one braced value never closed": "?password={" + "x" * MB,
    "many '@' after userinfo": "postgres://u:p" + "@" * MB,
    "a URL after every userinfo": "a://u:p@" * (MB // 8),
    "odd hosts": "a://b:c@d!" * (MB // 10),
    "quoted URLs with quoted e-mails": "'a://u:p@x'" * (MB // 11),
    "long names holding secret words": ("&" + "tok" * 42 + "=") * (MB // 128),
    "long names with no secret word": ("&" + "a" * 127 + "=") * (MB // 129),
    "a name longer than any looked at": "?" + "token" * (MB // 5),
    "fragments of secrets": "#access_token=x&" * (MB // 16),
    "Oracle URLs": "jdbc:oracle:thin:a/b@" * (MB // 21),
    "Oracle password of '@'s": "jdbc:oracle:thin:a/" + "b@" * (MB // 2),
    "colons and '@'": "a://" + ":@" * (MB // 2),
    "passwords holding '://'": "a://u:p://@" * (MB // 11),
    "a password holding '://' in every URL, one '@' at the end": "a://u:p" * (MB // 7) + "@db",
    "host:port lists of URLs": "a://h:1,b://u:p" * (MB // 15) + "@db",
    "quotes in a secret value": "?password=" + "a'" * (MB // 2),
    "secret values ending in quotes": "?password=a'" * (MB // 12),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_text_is_redacted_in_bounded_time(text: str) -> None:
    redactor = Redactor()
    # This thread's CPU time, not the wall clock: waiting for a core that other test workers
    # hold is not the redactor's time (6 s of wall clock for 0.3 s of work, seen under load).
    began = time.thread_time()
    redactor.text(text)
    # At most ~1 s here (100,000 URLs in a megabyte); the quadratic case this guards against
    # ("&password={" repeated, before its values were bounded) took 47 s.
    assert time.thread_time() - began < 5.0
