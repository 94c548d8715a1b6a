"""A producer inherited through fork() (multiprocessing's default start method on Linux):
the child's events are delivered, the parent's too, and nothing is lost without a word."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from producer import LineageProducer, events
from producer.job import lineage_job
from tests.producer.support import decode
from tests.support.kafka import read_topic

pytestmark = pytest.mark.kafka


def _event(job_name: str) -> dict:
    return events.run_event("START", run_id=events.new_run_id(), job_namespace="fork", job_name=job_name)


def _worker(producer: LineageProducer, n: int) -> None:
    # No flush, no close: the worker just returns, as a multiprocessing task does.
    with lineage_job(f"worker.{n}", producer=producer):
        producer.emit(_event(f"worker.{n}.extra"))


def test_a_multiprocessing_fork_child_delivers_through_the_inherited_producer(kafka, tmp_path):
    topic = kafka.new_topic("fork")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    try:
        producer.emit(_event("parent.before"))
        assert producer.flush(10) == 0
        children = [multiprocessing.get_context("fork").Process(target=_worker, args=(producer, n))
                    for n in range(2)]
        for child in children:
            child.start()
        for child in children:
            child.join(30)
        assert [c.exitcode for c in children] == [0, 0]
        producer.emit(_event("parent.after"))
        assert producer.flush(10) == 0
    finally:
        producer.close()
    records = read_topic(kafka.bootstrap_servers, topic, expected=8, timeout_s=30)
    names = sorted(decode(r.value)["job"]["name"] for r in records)
    assert names == sorted(["parent.before", "parent.after", "worker.0", "worker.0", "worker.0.extra",
                            "worker.1", "worker.1", "worker.1.extra"])
    # The children's records went straight to Kafka: the parent's journal holds nothing.
    assert producer.stats.journaled == 0


def test_an_os_fork_child_flushes_its_events_to_kafka(kafka, tmp_path):
    topic = kafka.new_topic("osfork")
    producer = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic, journal_dir=tmp_path)
    try:
        pid = os.fork()
        if pid == 0:  # the child: os._exit, so pytest does not run on in it
            code = 0
            try:
                producer.emit(_event("osfork.child"))
                code = 0 if producer.flush(20) == 0 else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's flush left its event pending"
    finally:
        producer.close()
    records = read_topic(kafka.bootstrap_servers, topic, expected=1, timeout_s=30)
    assert [decode(r.value)["job"]["name"] for r in records] == ["osfork.child"]
