"""Relay throughput against a local collector, with two baselines from the same run.

1. post ceiling: aiohttp POSTing the same pre-serialised events to the same collector,
   with the relay's concurrency, and nothing else to do (the best any relay could do);
2. relay: `Relay` consuming the events from a real Kafka-protocol broker (embedded Tansu)
   and delivering them (decode, validate, dedupe, ordering, commit included);
3. naive: the hand-rolled loop people write: consume one record, `requests` POST it.

The relay sends its requests through aiohttp's connection pool without the per-call set-up
of ``session.post()`` (``relay.sinks.posting``), which costs its process less CPU per POST
than the bare loop of 1. spends. So the single-event case also runs a *lean post ceiling*:
the bare loop sending through that same path (alternating with the relay between the same
ceiling runs), and reports the relay against it too (``ratio_vs_lean_ceiling``, the ratio
of the two paired medians): the relay's pipeline cost, with its cheaper POSTs set aside.

The batch case does the same against the spec's ``POST /lineage/batch``: the batch
ceiling POSTs the events pre-serialised as JSON arrays of ``BATCH_EVENTS`` with
``BATCH_REQUESTS`` requests in flight (the relay's batch settings), and the relay delivers
to a ``batch:`` collector.

Each relay run sits between two ceiling runs (ceiling, relay, ceiling, relay, ...,
ceiling), and its ratio is taken against the mean of those two: this machine's speed
drifts within minutes (a batch ceiling of 23,000 events/s in one run, 55,000 in another
the same hour). The ratios reported are the medians of these paired ratios; the events/s
reported are the medians of each series. The relay / naive ratio is paired the same way
(naive, relay, naive, ...; ``--naive-rounds``).

It also prints the CPU each process used per event: the relay's own process (event loop,
consumer and reader threads), its decode worker, the collector and the broker, and the
ceiling's client and the collector during the ceiling runs. All of them share the
machine's cores: on a small machine, what the relay's processes and the broker use per
event beyond what the ceiling's client uses is CPU the collector does not get. From these
figures it prints what the cores allow the relay, as a ratio to the ceiling, at the CPU
per event measured, and the same for a relay whose own process costs no more than the bare
client (decode worker, broker and collector as measured): a rough bound, for telling a
relay that wastes CPU from a machine that has too little of it. It also prints the
reverse: the CPU per event the relay's own process may use for the issues' targets (0.85
of the POST ceiling, 0.7 of the batch ceiling), the others as measured. The same figures for the
steady middle of each relay run (10% to 90% of the events delivered) leave start-up out
and add the share of the machine's CPU nobody used meanwhile (waits between the
processes); work done ahead of the deliveries (fetching, decoding) falls partly before
that window, so there the broker's and decode worker's shares read low.

With ``--workers N`` (2 by default; 0: not), each case also runs ``lineage-relay run
--workers N`` (a supervisor and N relay processes in one consumer group, each decoding on
its own thread), alternating with the in-process relay between the same ceiling runs; the
ceiling's requests in flight are shared among its workers. Its figures are the JSON's
``workers_*`` keys; the issues' keys stay those of the one in-process relay.

A last run delivers to a no-op collector kind (plugged in by dotted path) with the batch
settings: what the relay's pipeline alone (consume, decode, validate, dedupe, order,
dispatch, commit) can do, the bound on any collector.

The collector runs in its own process. A relay's events/s are those of the steady middle
of its run, from 10% to 90% of the events delivered: consumer-group join time is not
counted, nor the start, nor the tail. The tail flattered the relay: it takes records in
up to a lane's ``max_pending`` (20,000 events) ahead of their delivery, so once the topic
is read its last deliveries run without that work (30,000 events, first to last delivery:
single-event ratio 0.87-0.89; 120,000 events: 0.79-0.83). For the same reason the default
stream is long (120,000 events). A ceiling's events/s are those of its whole run (it
POSTs pre-built bodies at an even pace). Last line: one JSON object.

``--event-loop auto|uvloop|asyncio`` (default auto: uvloop when installed, as the relay's
own ``event_loop`` setting) is the loop of this process's runs, the ceiling's client and the
in-process relay alike, so both sides of a ratio run on the same loop; the ``--workers``
relay is given the same setting. The collector process runs on uvloop whenever it is
installed, whatever ``--event-loop`` says (relay/embedded/collector.py), and both sides of a
ratio share that one collector. The loop used is printed and is the JSON's ``event_loop``;
to compare loops, run the bench once with each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
import requests
import yarl
from confluent_kafka import Consumer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay import event_loop  # noqa: E402
from relay.app import Relay  # noqa: E402
from relay.config import build_config  # noqa: E402
from relay.embedded.broker import FAST_GROUP_PROPERTIES, EmbeddedBroker, free_port  # noqa: E402
from relay.embedded.sample import sample_stream  # noqa: E402
from relay.process import tune_process  # noqa: E402
from relay.sinks.kinds import CollectorKind  # noqa: E402
from relay.sinks.posting import LeanPoster  # noqa: E402
from tests.support.kafka import produce  # noqa: E402

CONCURRENCY = 32
BATCH_EVENTS = 200
BATCH_REQUESTS = 4
BATCH_PATH = "/api/v1/lineage/batch"
#: The issues' targets, as ratios to the ceilings (for the CPU budgets printed at the end).
SINGLE_TARGET = 0.85
BATCH_TARGET = 0.7


class _Noop:
    """Acknowledges every event at once: no HTTP, no collector. It calls back, as the batch
    collector does, so the pipeline is driven the way the batch case drives it."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def deliver(self, body: bytes) -> None:
        return None

    def deliver_soon(self, body: bytes, done, token) -> None:  # noqa: ANN001 - see relay.sinks.base
        asyncio.get_running_loop().call_soon(done, token, None)


class NoopKind(CollectorKind):
    kind = "noop"

    @classmethod
    def build(cls, config, metrics):  # noqa: ANN001, ANN206 - the CollectorKind signature
        return _Noop(config.name)


class CollectorProcess:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "relay.embedded.collector", "--port", str(self.port),
                                      "--batch-path", BATCH_PATH],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.count()
                return
            except requests.RequestException:
                time.sleep(0.05)
        raise RuntimeError("collector did not start")

    def count(self) -> int:
        return requests.get(self.url + "/stats", timeout=2).json()["count"]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


async def _post_all(url: str, payloads: list[bytes], concurrency: int, status: int) -> float:
    """Seconds to POST every payload with ``concurrency`` requests in flight."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"}) as session:
        it = iter(payloads)

        async def worker() -> None:
            for body in it:
                async with session.post(url, data=body) as resp:
                    await resp.read()
                    assert resp.status == status, resp.status

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start


async def post_ceiling(url: str, bodies: list[bytes]) -> float:
    return len(bodies) / await _post_all(url, bodies, CONCURRENCY, 201)


async def lean_post_ceiling(url: str, bodies: list[bytes]) -> float:
    """The post ceiling through the relay's request path (relay.sinks.posting), with a session
    set up as the relay's collectors set theirs up: no cookie jar, no decompression, no
    total timeout; a 2xx answer without a body is not read (as the relay's deliveries)."""
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"},
                                     cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        send = LeanPoster(session)
        target = yarl.URL(url)
        it = iter(bodies)

        async def worker() -> None:
            for body in it:
                resp = await send(target, body)
                if not resp.content.is_eof():
                    await resp.read()
                resp.release()
                assert resp.status == 201, resp.status

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return len(bodies) / (time.perf_counter() - start)


async def batch_ceiling(url: str, bodies: list[bytes]) -> float:
    """The batch endpoint's ceiling: pre-built JSON arrays, BATCH_REQUESTS in flight."""
    batches = [b"[" + b",".join(bodies[i:i + BATCH_EVENTS]) + b"]" for i in range(0, len(bodies), BATCH_EVENTS)]
    return len(bodies) / await _post_all(url, batches, BATCH_REQUESTS, 204)


def bench_stream(events: int) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """The benches' records (key, value) and their values: ``events`` Spark-like events,
    1-3 RUNNING per run, 3.5 KB on average."""
    stream = sample_stream(max(1, events // 4), seed=1, running_per_run=(1, 3))[:events]
    return stream, [v for _, v in stream]


def load_topic(broker: EmbeddedBroker, topic: str, stream: list[tuple[bytes, bytes]]) -> None:
    """``topic`` with 4 partitions, holding ``stream``."""
    broker.create_topic(topic, partitions=4)
    produce(broker.bootstrap_servers, topic, stream)


def measured(ceiling, collector: CollectorProcess, n: int, cpu: dict[str, list[float]],  # noqa: ANN001
             loop: str) -> float:
    """Runs the coroutine ``ceiling()`` returns (a ceiling's events/s) on the event loop
    ``loop`` (an ``event_loop`` setting, the bench's ``--event-loop``) and appends the CPU
    microseconds per event its client and the collector used to ``cpu``."""
    start, collector_start = time.process_time(), cpu_seconds(collector.proc.pid)
    eps = event_loop.run(ceiling(), loop)
    cpu.setdefault("ceiling_client", []).append((time.process_time() - start) / n * 1e6)
    cpu.setdefault("ceiling_collector", []).append((cpu_seconds(collector.proc.pid) - collector_start) / n * 1e6)
    return eps


def machine_idle() -> tuple[float, float] | None:
    """(idle, total) CPU time of the whole machine so far, in clock ticks; None where there
    is no /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return float(ticks[3] + ticks[4]), float(sum(ticks))  # idle + iowait


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used; 0.0 for no
    process or one that is gone."""
    if pid is None:
        return 0.0
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def relay_eps(bootstrap: str, topic: str, collector: CollectorProcess, n: int, *, loop: str, batch: bool = False,
              noop: bool = False, broker_pid: int | None = None, cpu: dict[str, list[float]] | None = None,
              steady: dict[str, list[float]] | None = None) -> float:
    """Events/s in the steady middle of the run (see the module docstring), the relay
    running on the event loop ``loop`` (an ``event_loop`` setting). With ``cpu``,
    appends to it the CPU microseconds per event each process used from the relay's start
    to the last delivery:
    the consumer fetches and the decode worker decodes ahead of the deliveries, so a window
    from the first delivery would miss part of their work (start-up is included instead,
    ~0.2 s of CPU in all). With ``steady``, appends the same for the steady middle of the
    run (from 10% to 90% of the events delivered: no start-up, no drain; the broker's share
    is low there, as the consumer fetched ahead), and ``idle_share``: the share of the
    machine's CPU time nobody used meanwhile."""
    base = collector.count()
    target: dict = {"name": "local", "url": collector.url, "concurrency": CONCURRENCY}
    if batch or noop:
        # concurrency left to its batch default: max_events x max_requests events in flight.
        target = {"name": "local", "url": collector.url,
                  "batch": {"max_events": BATCH_EVENTS, "max_requests": BATCH_REQUESTS}}
    if noop:
        target["type"] = f"{__name__}.NoopKind"
    config = build_config({
        "kafka": {"bootstrap_servers": bootstrap, "topics": [topic], "group_id": f"bench-relay-{time.time_ns()}",
                  "dlq_topic": topic + ".dlq", "consumer_properties": dict(FAST_GROUP_PROPERTIES)},
        "collectors": [target],
        "http": {"port": None},
        "event_loop": loop,
    })

    tune_process()  # as `lineage-relay run` does
    snapshots: list[dict[str, float]] = []
    window: list[tuple[int, float, dict[str, float], tuple[float, float] | None]] = []

    def snapshot(relay: Relay) -> dict[str, float]:
        """CPU seconds used so far by each process of the run."""
        return {"relay": time.process_time(),
                "decode_worker": sum(cpu_seconds(pid) for pid in relay.decoder.pids) if relay.decoder else 0.0,
                "collector": cpu_seconds(collector.proc.pid), "broker": cpu_seconds(broker_pid)}

    async def main() -> None:
        relay = Relay(config)
        snapshots.append(snapshot(relay))  # no decode worker yet: its CPU counts from its start
        task = asyncio.create_task(relay.run())
        delivered = relay.metrics.deliveries("local")
        marks = iter((n // 10, n - n // 10))  # the steady middle: from 10% to 90% delivered
        mark = next(marks)
        deadline = time.monotonic() + 300
        # The relay's own acknowledged-delivery counter: no extra HTTP traffic during the run.
        while delivered.count < n:
            if time.monotonic() > deadline or task.done():
                raise RuntimeError(f"relay delivered {delivered.count} of {n}")
            if mark is not None and delivered.count >= mark:
                window.append((delivered.count, time.monotonic(), snapshot(relay), machine_idle()))
                mark = next(marks, None)
            await asyncio.sleep(0.005)
        snapshots.append(snapshot(relay))  # before the stop: the decode worker exits with the relay
        relay.request_stop()
        await task

    event_loop.run(main(), loop)
    eps = _figures(snapshots[0], snapshots[1], window, n, cpu, steady)
    delivered = collector.count() - base
    if delivered < n and not noop:
        raise RuntimeError(f"collector received {delivered} of {n}")
    return eps


def _figures(first: dict[str, float], last: dict[str, float], window: list, n: int,
             cpu: dict[str, list[float]] | None, steady: dict[str, list[float]] | None) -> float:
    """A relay run's events/s in its steady middle (``window``: count, time, CPU snapshot
    and machine idle at 10% and 90% delivered); appends the CPU per event of each process
    over the whole run (``first`` to ``last``) to ``cpu``, and over the middle to ``steady``
    (see :func:`relay_eps`)."""
    if cpu is not None:
        for name, start in first.items():
            cpu.setdefault(name, []).append((last[name] - start) / n * 1e6)
    if len(window) < 2 or window[1][0] <= window[0][0]:
        raise RuntimeError(f"too few events ({n}) for a steady middle")
    (count0, at0, cpu0, idle0), (count1, at1, cpu1, idle1) = window
    if steady is not None:
        for name, start in cpu0.items():
            steady.setdefault(name, []).append((cpu1[name] - start) / (count1 - count0) * 1e6)
        if idle0 is not None and idle1 is not None and idle1[1] > idle0[1]:
            steady.setdefault("idle_share", []).append((idle1[0] - idle0[0]) / (idle1[1] - idle0[1]))
    return (count1 - count0) / (at1 - at0)


def naive_eps(bootstrap: str, topic: str, url: str, n: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"naive-{time.time_ns()}",
                         "auto.offset.reset": "earliest", **FAST_GROUP_PROPERTIES})
    consumer.subscribe([topic])
    session = requests.Session()
    done = 0
    start = None
    try:
        while done < n:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            if start is None:
                start = time.perf_counter()
            session.post(url, data=msg.value(), headers={"Content-Type": "application/json"}).raise_for_status()
            done += 1
    finally:
        consumer.close()
    return (n - 1) / (time.perf_counter() - start)


def workers_eps(bootstrap: str, topic: str, collector: CollectorProcess, n: int, workers: int, *, loop: str,
                batch: bool = False, broker_pid: int | None = None, cpu: dict[str, list[float]] | None = None,
                steady: dict[str, list[float]] | None = None) -> float:
    """Events/s of ``lineage-relay run --workers N`` (a supervisor and N relay processes in
    one consumer group, each decoding on its own thread), in the steady middle of its run
    as for :func:`relay_eps`, counted at the collector (polled every
    :data:`_WORKERS_POLL_S`: a few requests a second, ~0.1% of the collector's work). The
    ceiling's requests in flight are shared among the workers (``CONCURRENCY`` / N POSTs,
    ``BATCH_REQUESTS`` / N batches each), so the collector sees the load it sees from the
    ceiling and the in-process relay. ``cpu``/``steady`` as for :func:`relay_eps`, the
    relay's share being all the supervisor's processes together; its whole-run figure
    includes the start-up of N + 1 interpreters (their imports: about a second of CPU each
    on the slow machine), which the in-process relay's does not (the bench paid for its
    imports before): compare the steady-middle figures."""
    base = collector.count()
    target: dict = {"name": "local", "url": collector.url, "concurrency": max(1, CONCURRENCY // workers)}
    if batch:
        target = {"name": "local", "url": collector.url,
                  "batch": {"max_events": BATCH_EVENTS, "max_requests": max(1, BATCH_REQUESTS // workers)}}
    config = {"kafka": {"bootstrap_servers": bootstrap, "topics": [topic],
                        "group_id": f"bench-workers-{time.time_ns()}", "dlq_topic": topic + ".dlq",
                        "consumer_properties": dict(FAST_GROUP_PROPERTIES)},
              "collectors": [target], "http": {"port": None}, "log_level": "warning", "event_loop": loop}
    with tempfile.TemporaryDirectory() as tmp:
        config_path, log_path = Path(tmp, "relay.yaml"), Path(tmp, "relay.log")
        config_path.write_text(json.dumps(config))  # JSON is YAML
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "relay", "run", "--config", str(config_path),
                                     "--workers", str(workers)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                    start_new_session=True)
        try:
            return _workers_run(proc, log_path, collector, base, n, workers, broker_pid, cpu, steady)
        finally:
            _stop_group(proc)


#: How often :func:`workers_eps` asks the collector for its count.
_WORKERS_POLL_S = 0.25


def _workers_run(proc: subprocess.Popen, log_path: Path, collector: CollectorProcess, base: int, n: int,
                 workers: int, broker_pid: int | None, cpu: dict[str, list[float]] | None,
                 steady: dict[str, list[float]] | None) -> float:
    """The measuring part of :func:`workers_eps`, while ``proc`` runs."""

    def snapshot() -> dict[str, float]:
        """CPU seconds so far: the supervisor and its workers together, the collector, the
        broker (a worker's CPU counts from its start, so a first snapshot without it is right)."""
        try:
            tree = [psutil.Process(proc.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.Error:
            tree = []
        return {"relay": sum(cpu_seconds(p.pid) for p in tree), "decode_worker": 0.0,
                "collector": cpu_seconds(collector.proc.pid), "broker": cpu_seconds(broker_pid)}

    first = snapshot()
    marks = [n // 10, n - n // 10]
    window: list[tuple[int, float, dict[str, float], tuple[float, float] | None]] = []
    deadline = time.monotonic() + 300
    while True:
        done = collector.count() - base
        if marks and done >= marks[0]:
            window.append((done, time.monotonic(), snapshot(), machine_idle()))
            marks.pop(0)
        if done >= n:
            break
        if time.monotonic() > deadline or proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"relay with {workers} workers delivered {done} of {n} (exit {proc.poll()}); "
                               f"its log ends:\n{tail}")
        time.sleep(_WORKERS_POLL_S)
    return _figures(first, snapshot(), window, n, cpu, steady)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the supervisor (it stops its workers), then SIGKILL to its whole process
    group if it has not exited within 60 s, so no worker outlives a run."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _others(us: dict[str, float]) -> float:
    """CPU per event (µs) of everything in a relay run but the relay's own process."""
    return us["decode_worker"] + us["broker"] + us["collector"]


def cpu_bounds(us: dict[str, float], ceiling_eps: float) -> tuple[float, float]:
    """What the CPU per event allows on this machine's cores, as ratios to the ceiling: the
    events/s the cores can give the relay at its measured CPU per event (its process,
    decode worker, broker and the collector), and the same with a relay process that costs
    no more than the ceiling's bare client. The relay's CPU is counted from its start
    (start-up included), so both are slight underestimates; and both move with the
    machine's speed, as the ceiling does."""
    cores, others = os.cpu_count() or 1, _others(us)
    relay, lean = us["relay"] + others, min(us["relay"], us["ceiling_client"]) + others
    return cores * 1e6 / relay / ceiling_eps, cores * 1e6 / lean / ceiling_eps


def relay_budget(us: dict[str, float], ceiling_eps: float, target: float) -> float:
    """The relay process's CPU per event (µs) at which this machine's cores, with the decode
    worker, broker and collector as measured, would allow exactly ``target`` x the ceiling:
    how far the relay's own process is from what the target needs (negative: the others
    alone use more than the cores have)."""
    return (os.cpu_count() or 1) * 1e6 / (target * ceiling_eps) - _others(us)


def steady_figures(steady: dict[str, list[float]]) -> dict[str, float]:
    """Medians over the rounds of what :func:`relay_eps` gathered in ``steady``."""
    return {name: round(statistics.median(values), 3 if name == "idle_share" else 1)
            for name, values in steady.items() if values}


def describe_steady(us: dict[str, float]) -> str:
    cpu = ", ".join(f"{name} {value}" for name, value in us.items() if name != "idle_share")
    idle = f"; machine CPU idle {us['idle_share']:.0%}" if "idle_share" in us else ""
    return f"CPU per event (medians, µs) {cpu}{idle}"


def paired_ratios(ceilings: list[float], relays: list[float]) -> list[float]:
    """Each relay round against the mean of the ceilings measured right before and right
    after it (``ceilings`` has one more entry than ``relays``): this machine's speed drifts
    within minutes, and a ratio of two medians taken at different moments carries the drift."""
    return [relay / ((before + after) / 2) for relay, before, after in zip(relays, ceilings, ceilings[1:])]


def alternate(rounds: int, ceiling, relay, label: str,  # noqa: ANN001
              baseline: str = "ceiling") -> tuple[list[float], list[float], list[float]]:
    """ceiling, relay, ceiling, ..., ceiling (or another baseline in the ceiling's place):
    the figures of each and the paired ratios."""
    ceilings, by_variant = alternate_variants(rounds, ceiling, {"relay": relay}, label, baseline)
    relays, ratios = by_variant["relay"]
    return ceilings, relays, ratios


def alternate_variants(rounds: int, ceiling, variants: dict, label: str,  # noqa: ANN001
                       baseline: str = "ceiling") -> tuple[list[float], dict[str, tuple[list[float], list[float]]]]:
    """ceiling, variant 1, ceiling, variant 2, ceiling, variant 1, ... (``rounds`` runs of
    each variant), each run paired with the baseline runs right before and after it: the
    baseline's figures, and per variant its figures and paired ratios."""
    ceilings: list[float] = [ceiling()]
    runs: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in variants}
    for r in range(rounds):
        for name, relay in variants.items():
            eps = relay()
            ceilings.append(ceiling())
            ratio = paired_ratios(ceilings[-2:], [eps])[0]
            runs[name][0].append(eps)
            runs[name][1].append(ratio)
            print(f"{label} round {r + 1}, {name}: {baseline} {ceilings[-2]:,.0f} -> {name} {eps:,.0f} -> "
                  f"{baseline} {ceilings[-1]:,.0f} events/s; ratio {ratio:.3f}")
    return ceilings, runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=120_000)
    parser.add_argument("--naive-events", type=int, default=5_000)
    parser.add_argument("--naive-rounds", type=int, default=3,
                        help="relay runs each between two naive runs, for the relay / naive ratio")
    parser.add_argument("--rounds", type=int, default=5,
                        help="relay runs per case, each between two ceiling runs; medians reported")
    parser.add_argument("--workers", type=int, default=2,
                        help="also run `lineage-relay run --workers N` in each case, alternating with the "
                             "in-process relay (0: not)")
    parser.add_argument("--event-loop", choices=event_loop.EVENT_LOOPS, default="auto",
                        help="event loop of the ceiling's client and the relays (default auto: uvloop when "
                             "installed, else asyncio)")
    args = parser.parse_args()
    loop = event_loop.resolve(args.event_loop)  # uvloop asked for and missing: ImportError here, at once

    stream, bodies = bench_stream(args.events)
    n = len(stream)
    avg = sum(len(v) for v in bodies) / n
    print(f"events: {n}, average size {avg:.0f} bytes, concurrency {CONCURRENCY}, cpus {os.cpu_count()}, "
          f"event loop {loop} (--event-loop {args.event_loop})")
    with EmbeddedBroker() as broker:
        topic = "bench-openlineage"
        load_topic(broker, topic, stream)
        collector = CollectorProcess()
        try:
            target = collector.url + "/api/v1/lineage"
            single_cpu: dict[str, list[float]] = {}
            single_steady: dict[str, list[float]] = {}

            single_w_cpu: dict[str, list[float]] = {}
            single_w_steady: dict[str, list[float]] = {}
            variants = {"relay": lambda: relay_eps(broker.bootstrap_servers, topic, collector, n, loop=loop,
                                                   broker_pid=broker.pid, cpu=single_cpu, steady=single_steady)}
            if args.workers:
                variants["workers"] = lambda: workers_eps(broker.bootstrap_servers, topic, collector, n, args.workers,
                                                          loop=loop, broker_pid=broker.pid, cpu=single_w_cpu,
                                                          steady=single_w_steady)
            lean_cpu: dict[str, list[float]] = {}
            variants["lean_ceiling"] = lambda: measured(lambda: lean_post_ceiling(target, bodies), collector, n,
                                                        lean_cpu, loop)
            ceilings, single_runs = alternate_variants(
                args.rounds, lambda: measured(lambda: post_ceiling(target, bodies), collector, n, single_cpu, loop),
                variants, "single")
            relays, ratios = single_runs["relay"]
            ceiling, relay, ratio = (statistics.median(x) for x in (ceilings, relays, ratios))
            print(f"post ceiling: {ceiling:,.0f} events/s, relay {relay:,.0f} events/s (medians); "
                  f"ratio {ratio:.3f} (median of the paired rounds)")
            leans, lean_ratios = single_runs["lean_ceiling"]
            lean, lean_ratio = statistics.median(leans), statistics.median(lean_ratios)
            ratio_vs_lean = ratio / lean_ratio
            lean_us = {name.replace("ceiling_", "lean_"): round(statistics.median(values), 1)
                       for name, values in lean_cpu.items()}
            print(f"lean post ceiling: {lean:,.0f} events/s (median), {lean_ratio:.3f} x the post ceiling (median of "
                  f"the paired rounds); relay / lean ceiling {ratio_vs_lean:.3f}; CPU per event (µs): "
                  + ", ".join(f"{name} {us}" for name, us in lean_us.items()))
            single_us = {name: round(statistics.median(values), 1) for name, values in single_cpu.items()}
            print("single case, CPU per event (median of the rounds, µs): "
                  + ", ".join(f"{name} {us}" for name, us in single_us.items()))
            single_steady_us = steady_figures(single_steady)
            print("single case, steady middle of the relay runs: " + describe_steady(single_steady_us))

            batch_target = collector.url + BATCH_PATH
            batch_cpu: dict[str, list[float]] = {}
            batch_steady: dict[str, list[float]] = {}
            batch_w_cpu: dict[str, list[float]] = {}
            batch_w_steady: dict[str, list[float]] = {}
            variants = {"relay": lambda: relay_eps(broker.bootstrap_servers, topic, collector, n, loop=loop,
                                                   batch=True, broker_pid=broker.pid, cpu=batch_cpu,
                                                   steady=batch_steady)}
            if args.workers:
                variants["workers"] = lambda: workers_eps(broker.bootstrap_servers, topic, collector, n, args.workers,
                                                          loop=loop, batch=True, broker_pid=broker.pid, cpu=batch_w_cpu,
                                                          steady=batch_w_steady)
            batch_ceilings, batch_runs = alternate_variants(
                args.rounds,
                lambda: measured(lambda: batch_ceiling(batch_target, bodies), collector, n, batch_cpu, loop),
                variants, "batch")
            batch_relays, batch_ratios = batch_runs["relay"]
            batch_ceiling_eps, batch_relay, batch_ratio = (
                statistics.median(x) for x in (batch_ceilings, batch_relays, batch_ratios))
            print(f"batch ceiling: {batch_ceiling_eps:,.0f} events/s ({BATCH_EVENTS} events per POST, "
                  f"{BATCH_REQUESTS} in flight), relay {batch_relay:,.0f} events/s (medians); "
                  f"ratio {batch_ratio:.3f} (median of the paired rounds)")
            cpu_us = {name: round(statistics.median(values), 1) for name, values in batch_cpu.items()}
            print("batch case, CPU per event (median of the rounds, µs): "
                  + ", ".join(f"{name} {us}" for name, us in cpu_us.items()))
            batch_steady_us = steady_figures(batch_steady)
            print("batch case, steady middle of the relay runs: " + describe_steady(batch_steady_us))
            workers_figures: dict[str, object] = {}
            if args.workers:
                for case, runs, w_cpu, w_steady in (("single", single_runs, single_w_cpu, single_w_steady),
                                                    ("batch", batch_runs, batch_w_cpu, batch_w_steady)):
                    eps, w_ratios = runs["workers"]
                    prefix = "batch_" if case == "batch" else ""
                    against = "batch_ceiling" if case == "batch" else "ceiling"
                    w_us = {name: round(statistics.median(v), 1) for name, v in w_cpu.items()}
                    print(f"{case} case, {args.workers} workers: {statistics.median(eps):,.0f} events/s (median); "
                          f"ratio {statistics.median(w_ratios):.3f} (median of the paired rounds); CPU per event "
                          "(median of the rounds, µs, the relay being all its processes): "
                          + ", ".join(f"{name} {us}" for name, us in w_us.items() if name != "decode_worker")
                          + "; steady middle: " + describe_steady(steady_figures(w_steady)))
                    workers_figures.update({
                        f"{prefix}workers_relay_eps": round(statistics.median(eps), 1),
                        f"ratio_workers_vs_{against}": round(statistics.median(w_ratios), 3),
                        f"ratios_workers_vs_{against}": [round(r, 3) for r in w_ratios],
                        f"{prefix}workers_cpu_us_per_event": w_us})
            pipeline = relay_eps(broker.bootstrap_servers, topic, collector, n, loop=loop, noop=True)
            print(f"pipeline alone (no-op collector, batch settings): {pipeline:,.0f} events/s, "
                  f"{pipeline / batch_ceiling_eps:.3f} x the batch ceiling")
            # Paired too: one naive run is short, and a median of relay runs against it would
            # carry the machine's drift (one run of this bench measured 4.8x that way).
            naives, naive_relays, naive_ratios = alternate(
                args.naive_rounds, lambda: naive_eps(broker.bootstrap_servers, topic, target,
                                                     min(n, args.naive_events)),
                lambda: relay_eps(broker.bootstrap_servers, topic, collector, n, loop=loop), "naive",
                baseline="naive")
            naive, naive_ratio = statistics.median(naives), statistics.median(naive_ratios)
            print(f"naive loop:   {naive:,.0f} events/s, relay {statistics.median(naive_relays):,.0f} events/s "
                  f"(medians); relay / naive {naive_ratio:.2f} (median of the paired rounds)")
        finally:
            collector.stop()
    single_bound, single_limit = cpu_bounds(single_us, ceiling)
    batch_bound, batch_limit = cpu_bounds(cpu_us, batch_ceiling_eps)
    print(f"what {os.cpu_count()} cores allow at the CPU per event measured, against the ceilings: single "
          f"{single_bound:.3f} ({single_limit:.3f} with a relay process as cheap as the bare client), batch "
          f"{batch_bound:.3f} ({batch_limit:.3f})")
    # Against the lean ceiling: a relay whose process did nothing but POSTs as cheap as the
    # lean loop's, with the decode worker, broker and collector as measured.
    lean_limit = (os.cpu_count() or 1) * 1e6 / (lean_us["lean_client"] + _others(single_us)) / lean
    print(f"against the lean post ceiling, {os.cpu_count()} cores allow at most {lean_limit:.3f} (a relay process "
          f"costing only its POSTs, {lean_us['lean_client']} µs per event, the others as measured)")
    single_budget = relay_budget(single_us, ceiling, SINGLE_TARGET)
    batch_budget = relay_budget(cpu_us, batch_ceiling_eps, BATCH_TARGET)
    print(f"the relay's process may use, for the targets with the others as measured: single {single_budget:.1f} "
          f"µs per event for {SINGLE_TARGET} (measured {single_us['relay']}), batch {batch_budget:.1f} for "
          f"{BATCH_TARGET} (measured {cpu_us['relay']})")
    figures = {"relay_eps": round(relay, 1), "post_ceiling_eps": round(ceiling, 1), "naive_eps": round(naive, 1),
               "ratio_vs_ceiling": round(ratio, 3), "ratio_vs_naive": round(naive_ratio, 2),
               "batch_relay_eps": round(batch_relay, 1), "batch_ceiling_eps": round(batch_ceiling_eps, 1),
               "ratio_vs_batch_ceiling": round(batch_ratio, 3),
               "lean_post_ceiling_eps": round(lean, 1), "ratio_vs_lean_ceiling": round(ratio_vs_lean, 3),
               "ratios_lean_vs_ceiling": [round(r, 3) for r in lean_ratios], "lean_cpu_us_per_event": lean_us,
               "ratios_vs_ceiling": [round(r, 3) for r in ratios],
               "ratios_vs_batch_ceiling": [round(r, 3) for r in batch_ratios],
               "ratios_vs_naive": [round(r, 2) for r in naive_ratios],
               "pipeline_eps": round(pipeline, 1), "single_cpu_us_per_event": single_us,
               "batch_cpu_us_per_event": cpu_us,
               "single_steady_cpu_us_per_event": single_steady_us, "batch_steady_cpu_us_per_event": batch_steady_us,
               "ratio_pipeline_vs_batch_ceiling": round(pipeline / batch_ceiling_eps, 3),
               "cpu_bound_ratio_vs_ceiling": round(single_bound, 3),
               "cpu_bound_limit_vs_ceiling": round(single_limit, 3),
               "cpu_bound_ratio_vs_batch_ceiling": round(batch_bound, 3),
               "cpu_bound_limit_vs_batch_ceiling": round(batch_limit, 3),
               "cpu_bound_limit_vs_lean_ceiling": round(lean_limit, 3),
               "relay_us_budget_single": round(single_budget, 1), "relay_us_budget_batch": round(batch_budget, 1),
               "workers": args.workers, "event_loop": loop, **workers_figures}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
