"""Message keys must equal the official openlineage-python KafkaTransport's."""

from __future__ import annotations

import pytest
from openlineage.client import event_v2
from openlineage.client.facet_v2 import parent_run
from openlineage.client.transport.kafka import KafkaTransport
from openlineage.client.uuid import generate_new_uuid

from producer import events
from producer.keys import message_key


def _official_key(event) -> str | None:
    # The official key logic, called without building a librdkafka producer.
    return KafkaTransport._get_message_key(object.__new__(KafkaTransport), event)


def _pair(parent: tuple | None, root: tuple | None):
    run_id = str(generate_new_uuid())
    facets_v2, facets = {}, {}
    if parent:
        root_v2 = None
        if root:
            root_v2 = parent_run.Root(run=parent_run.RootRun(runId=root[2]),
                                      job=parent_run.RootJob(namespace=root[0], name=root[1]))
        facets_v2["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent[2]), job=parent_run.Job(namespace=parent[0], name=parent[1]),
            root=root_v2)
        facets["parent"] = events.parent_facet(*parent, root=root)
    official = event_v2.RunEvent(eventType=event_v2.RunState.START, eventTime=events.utc_now_iso(),
                                 run=event_v2.Run(runId=run_id, facets=facets_v2),
                                 job=event_v2.Job(namespace="spark", name="app.stage"), producer="p")
    ours = events.run_event("START", run_id=run_id, job_namespace="spark", job_name="app.stage",
                            run_facets=facets)
    return official, ours


@pytest.mark.parametrize("parent, root, expected", [
    (None, None, "run:spark/app.stage"),
    (("airflow", "dag.task", str(generate_new_uuid())), None, "run:airflow/dag.task"),
    (("airflow", "dag.task", str(generate_new_uuid())), ("airflow", "dag", str(generate_new_uuid())),
     "run:airflow/dag"),
])
def test_run_event_keys_match_the_official_transport(parent, root, expected):
    official, ours = _pair(parent, root)
    assert message_key(ours) == _official_key(official) == expected


def test_job_and_dataset_event_keys_match_the_official_transport():
    job = event_v2.JobEvent(eventTime=events.utc_now_iso(), producer="p",
                            job=event_v2.Job(namespace="ns", name="job"))
    ds = event_v2.DatasetEvent(eventTime=events.utc_now_iso(), producer="p",
                               dataset=event_v2.StaticDataset(namespace="s3://b", name="t"))
    assert message_key(events.job_event(job_namespace="ns", job_name="job")) == _official_key(job) == "job:ns/job"
    assert message_key(events.dataset_event(events.dataset("s3://b", "t"))) == _official_key(ds) == "dataset:s3://b/t"


def test_malformed_events_get_no_key_instead_of_an_error():
    assert message_key({"eventTime": "x"}) is None
    assert message_key("not a dict") is None  # type: ignore[arg-type]
    assert message_key({"run": {"facets": {"parent": "x"}}, "job": {"namespace": "n", "name": "j"}}) == "run:n/j"
