"""Pure, synchronous pipeline stages between the Kafka source and the sinks.

``decode`` turns a record value into a :class:`~relay.events.LineageEvent` or a
:class:`~relay.events.Rejection`; ``dedupe`` drops content already seen; ``sequence``
puts each run's events in START-first, one-terminal order for one collector
(``decisions``: what it decides per event); ``merge`` accumulates a run's facets and
``consolidate`` holds runs for the ``consolidated`` and ``coalesce`` delivery modes
(``run_state``: its actions and saved per-run state). No stage does I/O or reads the
clock: time is handed in as ``now`` (seconds).
"""
