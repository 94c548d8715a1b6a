"""librdkafka's own log lines, as the relay's structured log events.

Without a logger, librdkafka writes its lines (``%3|1764100000.123|FAIL|rdkafka#consumer-1|
[thrd:...]: ...``) straight to stderr, between the relay's JSON lines, where a log pipeline
parsing one JSON object a line drops or mangles them. Every Kafka client the relay makes
gets ``"logger": KafkaLog(...)`` in its configuration (:func:`with_log`): confluent-kafka
then calls ``log(level, "%s [%s] %s", facility, client, message)`` when the client is
served (a consumer in ``consume``/``poll``, a producer in ``poll``/``flush``), and the line
becomes event ``librdkafka`` with its ``facility``, ``client``, ``thread`` (librdkafka's
``[thrd:...]`` prefix of the message, unless ``log.thread.name`` is off) and ``message``.

One line gets an event of its own. A fetch from an offset the partition no longer holds
(``Offset out of range``) makes librdkafka reset the position where ``auto.offset.reset``
says (the relay's default: the earliest record) and say so in one line. It happens when
retention removed records before the relay read them (those records are lost: nothing
else says so) or when the topic was deleted and recreated. That line becomes
``offset_reset``, a warning with the topic, partition and offsets (``cause``
``out_of_range``: the line does not say which; ``records_lost`` when the position moves
forward, over records removed unread), counted in
``lineage_relay_offset_resets_total``. The relay checks the committed offsets of the
partitions it is assigned itself (:class:`relay.source.kafka.KafkaSource`), so this line
comes from resets while it consumes: retention overtaking a lagging relay.

Repeats are logged in proportion. While a broker is unreachable librdkafka logs a line at
every connection attempt (``Connect to ipv4#10.0.0.7:9092 failed: Connection refused``),
several a second per client and a burst of ~100 whenever metadata is asked for: ~470 lines
in 20 s against one down broker, burying the relay's own ``broker_unreachable``. A kind of
line (per client: its facility, the broker its message names and its text with numbers left
out, :func:`producer.librdkafka_log.line_kind`) is logged at its level at most once every
:data:`REPEAT_EVERY_S`; the repeats in between go to DEBUG, and the next line logged at its
level says how many there were (``repeated``). An outage of an hour is ~60 lines per client
and cause, not ~85,000. At most :data:`_MAX_KINDS` kinds are remembered at once; beyond
them a new kind goes to DEBUG until an old one has been quiet for the interval. Offset
resets are never held back: each is its own warning and counted.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from producer.librdkafka_log import line_kind
from relay.logs import log_event

_log = logging.getLogger("relay.librdkafka")

#: ``openlineage [0]: offset reset (at offset 1200 (leader epoch 3), broker 1) to offset
#: BEGINNING (leader epoch -1): fetch failed due to requested offset not available on the
#: broker: Broker: Offset out of range``; with the log start cached from a fetch, ``to
#: cached BEGINNING offset offset 17 (leader epoch -1)``; librdkafka 1.x writes ``to
#: BEGINNING`` and no leader epochs.
_RESET = re.compile(r"^(?P<topic>\S+) \[(?P<partition>\d+)\]: offset reset \(at (?:offset )?(?P<at>-?\d+)"
                    r"(?: \(leader epoch -?\d+\))?(?:, broker -?\d+)?\) to (?:cached \S+ offset )?(?:offset )?"
                    r"(?P<to>\S+)"
                    r"(?: \(leader epoch -?\d+\))?: (?P<reason>.*)$")

#: librdkafka begins each message with the thread that logged it (``log.thread.name``,
#: on by default): ``[thrd:main]: ``, ``[thrd:kafka:9092/1]: ``.
_THREAD = re.compile(r"\[thrd:(?P<thread>[^\]]*)\]: ")

OffsetReset = Callable[[str, int], None]

#: A kind of line is logged at its level at most once in this many seconds (see above).
REPEAT_EVERY_S = 60.0
#: How many kinds of line are remembered at once.
_MAX_KINDS = 256


class KafkaLog:
    """What confluent-kafka calls with librdkafka's log lines (its ``logger``); see the
    module docstring. ``on_offset_reset(topic, partition)`` is called for each offset
    reset, on the thread serving the client."""

    def __init__(self, on_offset_reset: OffsetReset | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._on_offset_reset = on_offset_reset
        self._clock = clock
        #: kind -> [when a line of it was last logged at its level, repeats since then]
        self._kinds: dict[tuple[str, ...], list] = {}
        self._lock = threading.Lock()  # lines come from every thread serving a client

    def log(self, level: int, _fmt: str, facility: str = "", client: str = "", message: str = "",
            *_rest: Any) -> None:
        """confluent-kafka's call: ``log(level, "%s [%s] %s", facility, client, message)``,
        ``level`` already a :mod:`logging` level."""
        thread = _THREAD.match(message)
        if thread is not None:
            message = message[thread.end():]
        if facility == "OFFSET" and "offset reset" in message:
            reset = _RESET.match(message)
            if reset is not None:
                self.offset_reset(reset, client)
                return
        if not _log.isEnabledFor(level):
            return
        fields = {"facility": facility, "client": client,
                  "thread": thread["thread"] if thread is not None else None, "message": message}
        repeated = self._repeats_before(client, facility, message)
        if repeated is None:
            if _log.isEnabledFor(logging.DEBUG):
                log_event(_log, logging.DEBUG, "librdkafka", **fields, level_was=logging.getLevelName(level))
            return
        log_event(_log, level, "librdkafka", **fields, **({"repeated": repeated} if repeated else {}))

    def _repeats_before(self, client: str, facility: str, message: str) -> int | None:
        """None when a line of this kind was logged at its level less than
        :data:`REPEAT_EVERY_S` ago (or too many kinds are remembered); else how many lines of
        the kind came since that one."""
        kind = (client, *line_kind(facility, message))
        now = self._clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < REPEAT_EVERY_S:
                seen[1] += 1
                return None
            if seen is None and len(self._kinds) >= _MAX_KINDS:
                for old in [k for k, (at, _) in self._kinds.items() if now - at >= REPEAT_EVERY_S]:
                    del self._kinds[old]
                if len(self._kinds) >= _MAX_KINDS:
                    return None
            repeated = seen[1] if seen is not None else 0
            self._kinds[kind] = [now, 0]
            return repeated

    def offset_reset(self, reset: re.Match[str], client: str) -> None:
        topic, partition, at, to = reset["topic"], int(reset["partition"]), int(reset["at"]), reset["to"]
        to_offset = int(to) if to.isdigit() else to
        # Forward (retention removed what lay between), the records skipped are known.
        lost = {"records_lost": to_offset - at} if isinstance(to_offset, int) and to_offset > at >= 0 else {}
        log_event(_log, logging.WARNING, "offset_reset", topic=topic, partition=partition,
                  from_offset=at, to_offset=to_offset, cause="out_of_range", **lost,
                  client=client, reason=reset["reason"],
                  hint="the partition no longer holds that offset: retention removed records before "
                       "they were read (they are lost; raise the topic's retention.ms, or add relay "
                       "capacity), or the topic was deleted and recreated")
        if self._on_offset_reset is not None:
            self._on_offset_reset(topic, partition)


#: For clients whose resets need no count (producers, admin and ops clients).
DEFAULT = KafkaLog()


def with_log(conf: dict[str, Any], logger: KafkaLog = DEFAULT) -> dict[str, Any]:
    """``conf`` with ``logger`` as its librdkafka logger."""
    return {**conf, "logger": logger}
