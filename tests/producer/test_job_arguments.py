"""``lineage_job``'s arguments: the parent a run_facets["parent"] names, root_parent= alone,
openlineage-python facet and dataset objects, uuid.UUID run ids."""

from __future__ import annotations

import os
import uuid

import pytest

from producer import events
from producer.job import lineage_job
from producer.keys import message_key
from tests.producer.support import JobRecorder as Recorder
from tests.support.children import exit_status
from tests.support.spec import validator

RUN_ID = "0190f1b2-6c1e-7a31-9c55-3f1e2d4c5b6a"


@pytest.fixture(autouse=True)
def _no_env_parent(monkeypatch):
    monkeypatch.delenv("OPENLINEAGE_PARENT_ID", raising=False)
    monkeypatch.delenv("OPENLINEAGE_ROOT_PARENT_ID", raising=False)


@pytest.mark.parametrize("with_root", [True, False])
def test_a_parent_facet_in_run_facets_is_the_runs_parent_for_nested_runs(with_root):
    # The outer run's events carried the facet, but nested runs took the outer run itself as
    # their root: keyed run:default/outer instead of run:airflow/dag, the tree split across
    # partitions.
    rec = Recorder()
    dag_run, task_run = events.new_run_id(), events.new_run_id()
    root = ("airflow", "dag", dag_run) if with_root else None
    facet = events.parent_facet("airflow", "dag.task", task_run, root=root)
    with lineage_job("outer", producer=rec, run_facets={"parent": facet}) as outer:
        with lineage_job("inner", producer=rec):
            with lineage_job("innermost", producer=rec):
                pass
    top = root or ("airflow", "dag.task", task_run)
    assert outer.parent == ("airflow", "dag.task", task_run) and outer.root == root
    assert rec.by_job("outer")[0]["run"]["facets"]["parent"] == facet
    assert {message_key(e) for e in rec.events} == {f"run:airflow/{top[1]}"}
    for name, parent in (("inner", outer.run_id), ("innermost", rec.by_job("inner")[0]["run"]["runId"])):
        got = rec.by_job(name)[0]["run"]["facets"]["parent"]
        assert got["run"]["runId"] == parent
        assert got["root"] == {"run": {"runId": top[2]}, "job": {"namespace": "airflow", "name": top[1]}}
    for event in rec.events:
        validator().validate(event)


def test_a_parent_facet_in_run_facets_comes_before_the_environment(monkeypatch):
    rec = Recorder()
    monkeypatch.setenv("OPENLINEAGE_PARENT_ID", f"airflow/other.task/{RUN_ID}")
    facet = events.parent_facet("airflow", "dag.task", RUN_ID, root=("airflow", "dag", RUN_ID))
    with lineage_job("j", producer=rec, run_facets={"parent": facet}) as run:
        pass
    assert run.parent == ("airflow", "dag.task", RUN_ID) and run.root == ("airflow", "dag", RUN_ID)
    assert rec.events[0]["run"]["facets"]["parent"] == facet


def test_the_parent_given_twice_or_a_root_without_parent_raises_at_construction():
    facet = events.parent_facet("airflow", "dag.task", RUN_ID)
    with pytest.raises(ValueError, match="not both"):
        lineage_job("j", producer=Recorder(), parent=("ns", "p", RUN_ID), run_facets={"parent": facet})
    with pytest.raises(ValueError, match="not both"):
        lineage_job("j", producer=Recorder(), root_parent=("ns", "r", RUN_ID), run_facets={"parent": facet})
    # root_parent= alone was silently ignored (the events had no parent facet at all)
    with pytest.raises(ValueError, match="root_parent= needs parent="):
        lineage_job("j", producer=Recorder(), root_parent=("ns", "r", RUN_ID))
    for bad in ({"job": {"namespace": "ns"}, "run": {"runId": RUN_ID}}, {"job": {"namespace": "ns", "name": "p"},
                "run": {"runId": "{{ run_id }}"}}, "ns/p/run", {**facet, "root": {"job": {}}}):
        with pytest.raises(ValueError, match=r"run_facets\['parent'\]"):
            lineage_job("j", producer=Recorder(), run_facets={"parent": bad})


def test_uuid_objects_are_accepted_as_run_ids():
    rec = Recorder()
    parent, root = uuid.UUID(RUN_ID), uuid.uuid4()
    with lineage_job("j", producer=rec, run_id=uuid.UUID(RUN_ID), parent=("ns", "p", parent),
                     root_parent=("ns", "r", root)) as run:
        pass
    assert run.run_id == RUN_ID and run.parent == ("ns", "p", RUN_ID) and run.root == ("ns", "r", str(root))
    assert rec.events[0]["run"]["facets"]["parent"]["root"]["run"]["runId"] == str(root)
    assert events.parent_facet("ns", "p", parent)["run"]["runId"] == RUN_ID
    validator().validate(rec.events[0])


def test_openlineage_python_facet_and_dataset_objects_are_converted_at_construction():
    # They went into the event as attrs objects: the JSON encoder refused them, and START and
    # COMPLETE were dropped as unencodable (the whole run lost).
    pytest.importorskip("openlineage.client.facet_v2")
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import documentation_job, parent_run, schema_dataset

    from producer.codec import encode_json

    doc = documentation_job.DocumentationJobFacet(description="loads orders")
    schema = schema_dataset.SchemaDatasetFacet(fields=[schema_dataset.SchemaDatasetFacetFields(name="id", type="int")])
    parent = parent_run.ParentRunFacet(run=parent_run.Run(runId=RUN_ID), job=parent_run.Job(namespace="airflow",
                                       name="dag.task"), root=parent_run.Root(run=parent_run.RootRun(runId=RUN_ID),
                                       job=parent_run.RootJob(namespace="airflow", name="dag")))
    rec = Recorder()
    with lineage_job("j", producer=rec, job_facets={"documentation": doc}, run_facets={"parent": parent},
                     inputs=[events.dataset("s3://b", "orders", {"schema": schema}),
                             InputDataset(namespace="s3://b", name="items", facets={"schema": schema})]) as run:
        run.add_output(OutputDataset(namespace="pg://db", name="out", facets={"schema": schema}))
        run.add_output(events.dataset("pg://db", "out2", {"schema": schema}))
        with lineage_job("inner", producer=rec):
            pass
    assert run.root == ("airflow", "dag", RUN_ID)
    start, complete = rec.by_job("j")
    assert start["job"]["facets"]["documentation"]["description"] == "loads orders"
    assert [(f["name"], f["type"]) for f in start["inputs"][0]["facets"]["schema"]["fields"]] == [("id", "int")]
    assert start["inputs"][1]["name"] == "items" and [o["name"] for o in complete["outputs"]] == ["out", "out2"]
    assert message_key(rec.by_job("inner")[0]) == "run:airflow/dag"
    for event in rec.events:
        encode_json(event)
        validator().validate(event)


def test_a_facet_that_cannot_be_sent_raises_at_construction_and_add_output_drops_it(caplog):
    with pytest.raises(ValueError, match="job_facets cannot be encoded as JSON"):
        lineage_job("j", producer=Recorder(), job_facets={"custom": {1, 2}})
    with pytest.raises(ValueError, match="inputs cannot be encoded"):
        lineage_job("j", producer=Recorder(), inputs=[{"namespace": "n", "name": "x", "facets": {"f": object()}}])
    rec = Recorder()
    with lineage_job("j", producer=rec) as run:
        run.add_output({"namespace": "n", "name": "x", "facets": {"f": object()}})   # never raises into the job
    assert rec.events[-1]["eventType"] == "COMPLETE" and rec.events[-1]["outputs"] == []
    assert "event=lineage_dataset_dropped job=j" in caplog.text


def test_an_openlineage_object_that_cannot_be_converted_raises_valueerror():
    pytest.importorskip("openlineage.client.facet_v2")
    from openlineage.client.facet_v2 import schema_dataset
    broken = schema_dataset.SchemaDatasetFacet(fields=[])
    object.__setattr__(broken, "fields", _Unconvertible())
    with pytest.raises(ValueError, match="SchemaDatasetFacet could not be converted"):
        events.dataset("s3://b", "orders", {"schema": broken})
    with pytest.raises(ValueError, match="run_facets: the openlineage-python SchemaDatasetFacet"):
        lineage_job("j", producer=Recorder(), run_facets={"schema": broken})


class _Unconvertible(list):
    def __iter__(self):
        raise RuntimeError("cannot iterate")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_fork_while_a_run_id_is_being_made_does_not_block_the_childs_run_ids():
    events._uuid_lock.acquire()   # as another thread making a run id at the fork would hold it
    try:
        pid = os.fork()
        if pid == 0:   # the child: new_run_id() must not wait for ever
            try:
                events.new_run_id()
            finally:
                os._exit(0)
    finally:
        events._uuid_lock.release()
    assert exit_status(pid, 5) == 0, "the child's new_run_id() waited on the parent's lock"
