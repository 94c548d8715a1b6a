"""Run state that survives: a compacted Kafka changelog of what consolidated/coalesce
collectors hold open.

A ``consolidated`` or ``coalesce`` collector holds runs open for minutes or hours
(:class:`~relay.stages.consolidate.RunConsolidator`): captured events, the merged view, whether
the START went out. That state, its undelivered output and its dedupe memory live in memory
and in a changelog topic, so that ``kill -9`` and partition moves between replicas lose
nothing and do not start a run twice.

Layout
    Topic ``kafka.state_topic`` (default ``<group_id>.run-state``), ``cleanup.policy=compact``,
    created at start-up with as many partitions as the input topic. Co-partitioned: the state
    of a run first seen on input partition ``p`` lives in state partition ``p``, so whoever
    owns input partition ``p`` owns its state. Key ``<collector>/<run_id>``; value JSON
    ``{"v": 1, "state": <RunConsolidator.to_state>, "seen": <hex digests>, "outbox": [...]}``
    (:mod:`relay.state.records`); a tombstone once the run is forgotten.

Write-ahead, then send
    An event a collector must receive for a held run (the START, a built terminal, a merged
    RUNNING...) goes into the run's ``outbox`` and is handed to the dispatcher only once a
    state record containing it is acknowledged by the broker (``acks=all``, idempotent
    producer). A run's record is rewritten after its outbox is delivered (at the next commit,
    unless a terminal waits for it, see below). So the changelog
    never claims "START sent" for a START that could be lost; after a crash the new owner
    re-sends the outbox (at-least-once: duplicates of the last outputs). A terminal event
    waits until a written outbox holds nothing before it, so a re-sent outbox never puts a
    START or RUNNING after a terminal the collector already has.

Offsets
    An event captured in state (:class:`~relay.stages.run_state.Release`) keeps its offset
    ticket until a state record holding it is acknowledged; a forwarded one until it is
    delivered (it was durable before it was sent). The commit (:meth:`Relay.commit`) first
    writes every dirty run and waits for the acknowledgements, so a committed offset never
    runs ahead of the state that absorbed it. A re-read event after a restart is recognised
    by its digest in the run's ``seen`` list (the dedupe memory of held runs, durable with
    the state), or merged again, which changes nothing.

Rebalancing
    On assignment, before any record of the partition is processed, the partition's state
    is read from the beginning to the end of state partition ``p`` (its own consumer, no
    group) and restored; timers restart as if each run's last event came at restore time.
    On revocation, dirty runs are written and acknowledged, the partition's runs are taken
    back, and once the revocation has waited for their deliveries under way, the records of
    those whose output was delivered meanwhile are written again and acknowledged (the new
    owner does not send that output again), all before the final offset commit; then the
    partition's runs are forgotten. On a lost partition (session timeout) nothing is
    written: another member may already own it.

Mode changes
    A record of an open run saved in another mode than its collector's now (consolidated and
    coalesce either way, or either to passthrough) is taken over when it is restored
    (``run_state_mode_changed`` logged, per collector and partition): its outbox is sent, then
    what its state held, flushed as an expired run's (its START if none went out; the
    consolidated terminal if one was seen, else the merged view as a RUNNING; the held events
    and the merged RUNNING), and the run goes on in the new mode (no second START; finished
    after a terminal). Its record is written again in the new mode; a passthrough
    collector's (:attr:`~relay.lane.CollectorLane.former`) is tombstoned once its output is
    delivered.

Not guaranteed
    Runs whose events arrive on several input partitions are owned by the first one's
    partition only. When that partition is revoked, the run's events read from another
    partition go with its record if a write holding them was acknowledged; one that no
    acknowledged write holds (the revocation's writes timed out) holds its partition's
    commits until that partition is read again (a restart, a rebalance).

    A record larger than the producer's ``message.max.bytes`` (100 MB unless set) or the
    state topic's ``max.message.bytes`` (counted as ``run_state_writes_total{result=
    "too_large"}``) is written again without the run's merged facets, and if still too large,
    with its outbox left out as well (:mod:`relay.state.records`): the events read from the
    run's partition are marked (digest, offset) and their offsets not committed before they
    are delivered and a later record of the run (without the marks) is acknowledged, so the
    new owner sends their copies read again, in their places; those the run built (a
    consolidated terminal, a merged RUNNING) are kept without their facets. A restore then
    builds the run's events without the facets merged before that record. One too large
    even so is kept in memory only; a restart goes back to the run's last record written.
    Adding input partitions needs the same number added to the state topic.

    The state topic is read only while some collector is consolidated/coalesce: with the
    last of them switched to passthrough, the output its open runs had still to send stays
    on the topic, unsent. A passthrough collector's ordering does not learn that a run's
    START went out from such a record: the run's later events wait for it up to
    ``ordering.hold_timeout_s``.

    No fencing: a replica that lost a partition without knowing it yet (cut off from the
    group coordinator while still reaching the partition leaders, or frozen for longer than
    ``session.timeout.ms``) goes on writing the partition's runs until librdkafka reports the
    loss; a write of its that lands after the new owner's record of the same run replaces it
    in the compacted topic, and the next owner restores that older state. Kafka
    transactions (a transactional producer fenced by the consumer group's generation) would
    fence it; not used.
"""
