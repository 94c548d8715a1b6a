"""The explicit job API: START then COMPLETE or FAIL, parents, facets, decorator."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from datetime import datetime, timezone

import pytest

from producer import LineageProducer, events, job
from producer.job import current_run, lineage_job
from tests.producer.support import decode
from tests.support.kafka import read_topic
from tests.support.spec import validator

pytestmark = pytest.mark.kafka


@pytest.fixture
def producer(kafka, tmp_path):
    p = LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=kafka.new_topic("job"),
                        journal_dir=tmp_path, namespace="team")
    yield p
    p.close()


def _events(kafka, producer, expected: int) -> list[dict]:
    assert producer.flush(10) == 0
    docs = [decode(r.value) for r in read_topic(kafka.bootstrap_servers, producer.config.topic,
                                                expected=expected)]
    assert len(docs) == expected
    v = validator()
    for doc in docs:
        v.validate(doc)
    return sorted(docs, key=lambda d: d["eventTime"])


def test_context_manager_emits_start_and_complete_with_everything(kafka, producer):
    src = events.dataset("s3://raw", "orders")
    out = events.dataset("postgres://db:5432", "public.orders")
    custom = events.custom_facet({"owner": "me"}, schema_url="https://example.com/owner.json")
    start = datetime(2026, 11, 22, 10, tzinfo=timezone.utc)
    with lineage_job("nightly.load", producer=producer, inputs=[src], nominal_time=(start, 1795400000.0),
                     job_type="JOB", run_facets={"owner": custom}) as run:
        assert current_run() is run
        run.add_output(out)
    assert current_run() is None
    first, last = _events(kafka, producer, 2)
    assert (first["eventType"], last["eventType"]) == ("START", "COMPLETE")
    assert first["run"]["runId"] == last["run"]["runId"] == run.run_id
    assert uuid.UUID(run.run_id).version == 7
    assert first["job"] == last["job"] and first["job"]["namespace"] == "team"
    assert first["job"]["facets"]["jobType"]["jobType"] == "JOB"
    assert first["run"]["facets"]["nominalTime"]["nominalStartTime"] == "2026-11-22T10:00:00.000000Z"
    assert "nominalEndTime" in first["run"]["facets"]["nominalTime"]
    assert first["run"]["facets"]["owner"]["owner"] == "me"
    assert first["inputs"] == [src] and first["outputs"] == []
    assert last["inputs"] == [src] and last["outputs"] == [out]


def test_an_exception_emits_fail_with_the_stack_trace_and_propagates(kafka, producer):
    with pytest.raises(ZeroDivisionError):
        with lineage_job("bad.job", producer=producer):
            1 / 0
    _, fail = _events(kafka, producer, 2)
    assert fail["eventType"] == "FAIL"
    error = fail["run"]["facets"]["errorMessage"]
    assert error["message"] == "ZeroDivisionError: division by zero"
    assert error["programmingLanguage"] == "python"
    assert "1 / 0" in error["stackTrace"] and "Traceback" in error["stackTrace"]


def test_decorator_makes_one_run_per_call_and_nests_as_parent_and_root(kafka, producer):
    @lineage_job(producer=producer, job_type="TASK")
    def step(x):
        return x * 2

    @lineage_job(producer=producer, namespace="etl")
    async def pipeline():
        return step(1) + step(2)

    with lineage_job("dag", producer=producer) as dag:
        assert asyncio.run(pipeline()) == 6
    docs = _events(kafka, producer, 8)
    runs = {}
    for doc in docs:
        runs.setdefault(doc["run"]["runId"], []).append(doc)
    assert len(runs) == 4 and all(len(v) == 2 for v in runs.values())
    name = f"{__name__}.test_decorator_makes_one_run_per_call_and_nests_as_parent_and_root.<locals>"
    steps = [v[0] for v in runs.values() if v[0]["job"]["name"] == f"{name}.step"]
    [pipe] = [v[0] for v in runs.values() if v[0]["job"]["name"] == f"{name}.pipeline"]
    assert pipe["job"]["namespace"] == "etl"
    assert pipe["run"]["facets"]["parent"]["run"]["runId"] == dag.run_id
    assert len(steps) == 2
    for s in steps:
        parent = s["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == pipe["run"]["runId"]
        assert parent["root"]["run"]["runId"] == dag.run_id
        assert parent["root"]["job"] == {"namespace": "team", "name": "dag"}


def test_parent_comes_from_the_orchestrator_environment(kafka, producer, monkeypatch):
    parent_id, root_id = events.new_run_id(), events.new_run_id()
    monkeypatch.setenv("OPENLINEAGE_PARENT_ID", f"airflow/dag.task/{parent_id}")
    monkeypatch.setenv("OPENLINEAGE_ROOT_PARENT_ID", f"airflow/dag/{root_id}")
    with lineage_job("spawned", producer=producer):
        pass
    explicit = events.new_run_id()
    with lineage_job("explicit", producer=producer, parent=f"sched/job/{explicit}"):
        pass
    docs = _events(kafka, producer, 4)
    env_parent = docs[0]["run"]["facets"]["parent"]
    assert env_parent["job"] == {"namespace": "airflow", "name": "dag.task"}
    assert env_parent["run"]["runId"] == parent_id and env_parent["root"]["run"]["runId"] == root_id
    assert docs[2]["run"]["facets"]["parent"]["run"]["runId"] == explicit
    assert "root" not in docs[2]["run"]["facets"]["parent"]


@pytest.fixture
def default_from(monkeypatch, tmp_path):
    """A process whose lineage config is the test's OPENLINEAGE_* variables alone, and no
    default producer yet (closed at the end)."""
    for var in [v for v in os.environ if v.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(job, "_default", None)

    def configure(**env: str) -> None:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    yield configure
    if job._default is not None:
        job._default.close(0)


def _kafka_env(kafka, topic, tmp_path) -> dict[str, str]:
    return {"OPENLINEAGE__TRANSPORT__TYPE": "kafka", "OPENLINEAGE__TRANSPORT__TOPIC": topic,
            "OPENLINEAGE__TRANSPORT__PROPERTIES__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "OPENLINEAGE__TRANSPORT__JOURNAL_DIR": str(tmp_path / "journal")}


def test_other_transports_variables_do_not_cost_the_default_producer(kafka, tmp_path, default_from):
    """OPENLINEAGE_URL makes openlineage-python write OPENLINEAGE__TRANSPORT__TRANSPORTS__*
    into the process's environment; HTTP auth comes as OPENLINEAGE__TRANSPORT__AUTH__*."""
    topic = kafka.new_topic("job-env")
    default_from(**_kafka_env(kafka, topic, tmp_path),
                 OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP__TYPE="http",
                 OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP__URL="http://marquez:5000",
                 OPENLINEAGE__TRANSPORT__AUTH__TYPE="api_key", OPENLINEAGE__TRANSPORT__AUTH__API_KEY="k")
    with lineage_job("env.job"):
        pass
    assert job.default_producer().flush(10) == 0
    records = read_topic(kafka.bootstrap_servers, topic, expected=2)
    assert [decode(r.value)["eventType"] for r in records] == ["START", "COMPLETE"]


def test_openlineage_disabled_sends_nothing(kafka, tmp_path, default_from, monkeypatch):
    topic = kafka.new_topic("job-disabled")
    default_from(**_kafka_env(kafka, topic, tmp_path), OPENLINEAGE_DISABLED="true")
    with lineage_job("disabled.job"):
        pass
    job.default_producer().close(10)
    assert not (tmp_path / "journal").exists()   # no producer was built
    monkeypatch.delenv("OPENLINEAGE_DISABLED")
    with LineageProducer(bootstrap_servers=kafka.bootstrap_servers, topic=topic,
                         journal_dir=tmp_path / "marker") as marker:
        marker.emit(events.run_event("START", run_id=events.new_run_id(), job_namespace="t", job_name="marker"))
    # One partition: anything the disabled job had sent would be ahead of the marker.
    records = read_topic(kafka.bootstrap_servers, topic, expected=1)
    assert [decode(r.value)["job"]["name"] for r in records] == ["marker"]


def test_a_successful_sys_exit_inside_the_run_is_complete(kafka, producer):
    # A CLI (click, a dbt-like tool) ends a successful command with sys.exit(0): the process
    # and its scheduler see success, so must the lineage.
    for status in (0, None):
        with pytest.raises(SystemExit):
            with lineage_job("cli.success", producer=producer):
                raise SystemExit(status)
    with pytest.raises(SystemExit):
        with lineage_job("cli.failure", producer=producer):
            raise SystemExit(3)
    got = _events(kafka, producer, 6)
    assert [e["eventType"] for e in got if e["job"]["name"] == "cli.success"] == ["START", "COMPLETE"] * 2
    failed = [e for e in got if e["job"]["name"] == "cli.failure"]
    assert [e["eventType"] for e in failed] == ["START", "FAIL"]
    assert failed[1]["run"]["facets"]["errorMessage"]["message"] == "SystemExit: 3"


def test_one_instance_entered_by_two_threads_gives_each_its_own_run(kafka, producer):
    # A module-level `load = lineage_job("load")` used as `with load:` by worker threads.
    shared = lineage_job("shared.load", producer=producer)
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()
    runs: dict[str, str] = {}
    errors: list[BaseException] = []

    def worker(name: str, entered: threading.Event, wait_for: threading.Event, before: threading.Event | None):
        try:
            if before is not None:
                assert before.wait(10)
            with shared as run:
                runs[name] = run.run_id
                entered.set()
                assert wait_for.wait(10)
                assert current_run() is run
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)
        finally:
            entered.set()
            if name == "a":
                a_left.set()

    threads = [threading.Thread(target=worker, args=("a", a_inside, b_inside, None)),
               threading.Thread(target=worker, args=("b", b_inside, a_left, a_inside))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    got = _events(kafka, producer, 4)
    by_run = {rid: [e["eventType"] for e in got if e["run"]["runId"] == rid] for rid in runs.values()}
    assert len(by_run) == 2 and all(types == ["START", "COMPLETE"] for types in by_run.values()), by_run


class _Recorder:
    """A producer stand-in that keeps (job name, event type, run id) of every event."""

    config = None

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.events: list[dict] = []

    def emit(self, event: dict) -> None:
        self.seen.append((event["job"]["name"], event["eventType"], event["run"]["runId"]))
        self.events.append(event)


def test_a_generator_paused_inside_its_own_run_does_not_take_the_callers_end():
    # A streaming reader written as `with lineage_job("read"): yield rows`, partly consumed
    # inside another job: the caller's exit ends the caller's run, not the reader's.
    rec = _Recorder()
    outer, inner = lineage_job("outer", producer=rec), lineage_job("inner", producer=rec)

    def rows():
        with inner:
            yield 1
            yield 2

    with outer as outer_run:
        reader = rows()
        next(reader)
        inner_run = current_run()
    assert rec.seen[-1] == ("outer", "COMPLETE", outer_run.run_id)
    assert current_run() is inner_run, "the reader's run is still open"
    reader.close()
    # closed early: a GeneratorExit through its `with`, the run stopped, not failed: ABORT
    assert rec.seen[-1][:2] == ("inner", "ABORT") and rec.seen[-1][2] == inner_run.run_id
    assert current_run() is None


def test_enter_and_exit_in_different_tasks_inside_a_run_never_raise_into_the_job():
    # pytest-asyncio runs an async fixture's setup and teardown in different tasks, both
    # inside the session's run: the exit must end the fixture's run, and raise nothing.
    rec = _Recorder()
    fixture = lineage_job("fixture", producer=rec)

    async def main() -> None:
        with lineage_job("session", producer=rec):
            await asyncio.create_task(_call(fixture.__enter__))
            await asyncio.create_task(_call(fixture.__exit__, None, None, None))
            assert current_run().job_name == "session"

    async def _call(f, *args):
        f(*args)

    asyncio.run(main())
    assert [(name, kind) for name, kind, _ in rec.seen] == [
        ("session", "START"), ("fixture", "START"), ("fixture", "COMPLETE"), ("session", "COMPLETE")]
    assert rec.seen[1][2] == rec.seen[2][2]


@pytest.mark.parametrize(("status", "exit_status"), [
    (None, 0), (0, 0), (False, 0), (256, 0), (0.0, 1), ("0", 1), ("", 1), (True, 1), (2, 2), (1 << 64, 255)])
@pytest.mark.skipif(os.name == "nt", reason="POSIX exit statuses")
def test_sys_exit_is_complete_exactly_when_the_process_exits_with_status_0(status, exit_status):
    # What the scheduler sees is the process's exit status: CPython prints anything but
    # None or an int and exits with 1 (sys.exit(0.0) fails), and the OS keeps the low byte.
    rec = _Recorder()
    with pytest.raises(SystemExit):
        with lineage_job("cli", producer=rec):
            raise SystemExit(status)
    assert rec.seen[-1][1] == ("COMPLETE" if exit_status == 0 else "FAIL")


def test_a_huge_exception_message_still_emits_fail_capped(kafka, producer):
    """The FAIL event of a ValueError carrying a whole payload was too large for Kafka and
    dropped: message and stack trace are capped (the stack keeps its tail)."""
    with pytest.raises(ValueError):
        with lineage_job("huge.error", producer=producer):
            raise ValueError("x" * 2_000_000)
    assert producer.flush(10) == 0 and producer.stats.dropped == {}
    _, fail = _events(kafka, producer, 2)
    error = fail["run"]["facets"]["errorMessage"]
    assert fail["eventType"] == "FAIL"
    assert error["message"].startswith("ValueError: xxx") and "more characters]" in error["message"]
    assert len(error["message"]) <= job.MAX_ERROR_MESSAGE_CHARS + 100
    assert len(error["stackTrace"]) <= job.MAX_STACK_TRACE_CHARS + 100
    assert "Traceback" in error["stackTrace"] and 'raise ValueError("x" * 2_000_000)' in error["stackTrace"]


def test_a_deep_stack_keeps_its_innermost_frames():
    def recurse(n):   # two functions in turn: traceback collapses only repeats of one line
        if n == 0:
            raise RuntimeError("at the bottom")
        other(n - 1)

    def other(n):
        recurse(n)

    rec = _Recorder()
    with pytest.raises(RuntimeError):
        with lineage_job("deep", producer=rec):
            recurse(400)
    stack = rec.events[-1]["run"]["facets"]["errorMessage"]["stackTrace"]
    assert stack.startswith("[... ") and stack.endswith("RuntimeError: at the bottom\n")
    assert len(stack) <= job.MAX_STACK_TRACE_CHARS + 100


def test_the_decorator_without_parentheses(kafka, producer, monkeypatch):
    monkeypatch.setattr(job, "_default", producer)   # no producer= argument without parentheses

    @lineage_job
    def refresh(x):
        """Refreshes."""
        return x + 1

    assert refresh(41) == 42 and refresh.__name__ == "refresh" and refresh.__doc__ == "Refreshes."
    start, complete = _events(kafka, producer, 2)
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["job"]["name"] == f"{__name__}.test_the_decorator_without_parentheses.<locals>.refresh"


def _by_run(rec) -> list[tuple[str, str]]:
    return [(e["job"]["name"], e["eventType"]) for e in rec.events]


def test_a_decorated_generator_run_spans_its_iteration():
    rec = _Recorder()

    @lineage_job("rows", producer=rec)
    def rows(n):
        got = yield 0
        assert current_run().job_name == "rows"
        with lineage_job("inside", producer=rec):
            for i in range(1, n):
                yield i + (got or 0)
        return "done"

    reader = rows(3)
    assert rec.events == [], "no run before the first item is asked for"
    assert next(reader) == 0
    assert _by_run(rec) == [("rows", "START")]
    assert current_run() is None, "the generator's run is never the consumer's"
    assert reader.send(10) == 11
    assert current_run() is None
    with lineage_job("consumer", producer=rec) as consumer:
        assert next(reader) == 12
        assert current_run() is consumer
    with pytest.raises(StopIteration) as stop:
        next(reader)
    assert stop.value.value == "done"
    assert _by_run(rec) == [("rows", "START"), ("inside", "START"), ("consumer", "START"), ("consumer", "COMPLETE"),
                            ("inside", "COMPLETE"), ("rows", "COMPLETE")]
    rows_id = rec.events[0]["run"]["runId"]
    assert rec.events[1]["run"]["facets"]["parent"]["run"]["runId"] == rows_id
    assert "parent" not in rec.events[2]["run"]["facets"]
    assert rec.events[-1]["run"]["runId"] == rows_id
    for event in rec.events:
        validator().validate(event)


def test_a_decorated_generator_that_raises_fails_and_one_closed_early_aborts():
    rec = _Recorder()

    @lineage_job("gen", producer=rec)
    def gen(fail_at=None):
        for i in range(5):
            if i == fail_at:
                raise RuntimeError("fails during iteration")
            yield i

    with pytest.raises(RuntimeError):
        for _ in gen(fail_at=2):
            pass
    assert _by_run(rec) == [("gen", "START"), ("gen", "FAIL")]
    assert rec.events[-1]["run"]["facets"]["errorMessage"]["message"] == "RuntimeError: fails during iteration"
    for _ in gen():
        break   # the consumer stops early: closed, ABORT (the run stopped before its work was done)
    assert _by_run(rec)[2:] == [("gen", "START"), ("gen", "ABORT")]
    thrown = gen()
    next(thrown)
    with pytest.raises(KeyError):
        thrown.throw(KeyError("from the consumer"))
    assert _by_run(rec)[4:] == [("gen", "START"), ("gen", "FAIL")]
    assert list(gen()) == [0, 1, 2, 3, 4] and _by_run(rec)[6:] == [("gen", "START"), ("gen", "COMPLETE")]
    gen().close()   # never started: no run
    assert len(rec.events) == 8 and current_run() is None
    for event in rec.events:
        validator().validate(event)


def test_a_decorated_async_generator_run_spans_its_iteration():
    rec = _Recorder()

    @lineage_job("stream", producer=rec)
    async def stream(fail=False):
        for i in range(3):
            await asyncio.sleep(0)   # ok: a suspension point inside the body, not a wait
            assert current_run().job_name == "stream"
            yield i
        if fail:
            raise RuntimeError("stream broke")

    async def main() -> None:
        agen = stream()
        assert await agen.__anext__() == 0
        assert _by_run(rec) == [("stream", "START")] and current_run() is None
        assert [i async for i in agen] == [1, 2]
        assert _by_run(rec) == [("stream", "START"), ("stream", "COMPLETE")]
        with pytest.raises(RuntimeError):
            async for _ in stream(fail=True):
                pass
        early = stream()
        await early.__anext__()
        await early.aclose()

    asyncio.run(main())
    assert _by_run(rec)[2:] == [("stream", "START"), ("stream", "FAIL"), ("stream", "START"), ("stream", "ABORT")]
    for event in rec.events:
        validator().validate(event)


def test_a_generatorexit_thrown_into_a_decorated_generator_reaches_its_body_as_undecorated():
    """throw(GeneratorExit) is not close(): a body that catches it and yields goes on (and
    ends as it ends); ABORT when the GeneratorExit propagates out of the body."""
    rec = _Recorder()

    def body():
        while True:
            try:
                yield 1
            except GeneratorExit:
                yield "caught"
                return

    plain, decorated = body(), lineage_job("ge", producer=rec)(body)()
    assert (next(plain), next(decorated)) == (1, 1)
    assert plain.throw(GeneratorExit) == decorated.throw(GeneratorExit) == "caught"
    assert _by_run(rec) == [("ge", "START")]
    with pytest.raises(StopIteration):
        next(decorated)                      # the body went on, then ended normally
    assert _by_run(rec) == [("ge", "START"), ("ge", "COMPLETE")]

    @lineage_job("ge2", producer=rec)
    def uncaught():
        yield 1
        yield 2

    propagated = uncaught()
    next(propagated)
    with pytest.raises(GeneratorExit):
        propagated.throw(GeneratorExit)
    assert _by_run(rec)[2:] == [("ge2", "START"), ("ge2", "ABORT")] and current_run() is None


def test_a_decorated_generators_arguments_are_bound_at_the_call():
    rec = _Recorder()

    @lineage_job("bound", producer=rec)
    def gen(a):
        yield a

    @lineage_job("abound", producer=rec)
    async def agen(a):
        yield a

    with pytest.raises(TypeError):
        gen()
    with pytest.raises(TypeError):
        agen()
    it = gen(1)
    assert rec.events == []                  # START at the first item asked for, as before
    assert list(it) == [1] and _by_run(rec) == [("bound", "START"), ("bound", "COMPLETE")]
