"""``lineage-relay``: run the relay, check a configuration, run the embedded demo, or operate
(``replay``, ``dlq list|redrive``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from typing import Any

from relay import event_loop
from relay.config import RelayConfig, build_config, merge, read_config, resolve_workers
from relay.embedded import graph as lineage_graph
from relay.entrypoint import release_early_stop
from relay.errors import ConfigError
from relay.logs import log_event, set_log_context, setup_logging
from relay.ops import add_subcommands as add_ops_subcommands
from relay.source.kafka import SourceError
from relay.state.changelog import StateError
from relay.worker_link import CONFIG_COPY_ENV, WorkerLink, config_copy, read_once

log = logging.getLogger("relay.cli")


#: What each NAME=VALUE flag takes, as shown when one is malformed.
_PAIR_FORMS = {
    "--collector": "NAME=URL, e.g. --collector marquez=http://127.0.0.1:5000",
    "--collector-mode": "NAME=MODE, e.g. --collector-mode marquez=consolidated",
    "--consumer-property": "KEY=VALUE, e.g. --consumer-property session.timeout.ms=6000",
}


def _pairs(values: list[str] | None, flag: str) -> list[tuple[str, str]]:
    out = []
    for i, item in enumerate(values or [], 1):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            # Not the item: a property's value may be a password (sasl.password:hunter2).
            which = f"the {_ordinal(i)} {flag}" if len(values or []) > 1 else flag
            why = "no =" if not sep else "nothing before =" if not name.strip() else "nothing after ="
            raise ConfigError(f"{which}: expected {_PAIR_FORMS.get(flag, 'NAME=VALUE')} ({why})")
        out.append((name.strip(), value.strip()))
    return out


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def config_from_args(args: argparse.Namespace, warnings: list[str] | None = None,
                     content: bytes | None = None) -> RelayConfig:
    """The configuration of ``run``: the file's (if any; ``content``: its bytes, already
    read) under the flags. What is worth a warning though valid (a secret written in the
    file) is appended to ``warnings``."""
    if not args.config and not args.bootstrap_servers and not args.collector:
        raise ConfigError("run needs a configuration: --config relay.yaml, or at least --bootstrap-servers HOST:PORT "
                          "and --collector NAME=URL (lineage-relay run --help lists the flags)")
    data: dict[str, Any] = {}
    if args.config:
        read = read_config(args.config, content)
        data = read.data
        if warnings is not None:
            warnings.extend(read.inline_secrets)
    kafka: dict[str, Any] = {}
    if args.bootstrap_servers:
        kafka["bootstrap_servers"] = args.bootstrap_servers
    if args.topic:
        kafka["topics"] = [t.strip() for value in args.topic for t in value.split(",")]  # as in the file
    if args.group_id:
        kafka["group_id"] = args.group_id
    if args.dlq_topic:
        kafka["dlq_topic"] = args.dlq_topic
    props = dict(_pairs(args.consumer_property, "--consumer-property"))
    if props:
        kafka["consumer_properties"] = props
    override: dict[str, Any] = {}
    if kafka:
        override["kafka"] = kafka
    if args.http_port is not None:
        override["http"] = {"port": args.http_port}
    if args.log_level:
        override["log_level"] = args.log_level
    if getattr(args, "workers", None) is not None:
        override["workers"] = args.workers
    if getattr(args, "event_loop", None) is not None:
        override["event_loop"] = args.event_loop
    data = merge(data, override)
    flag_collectors = _pairs(args.collector, "--collector")
    if flag_collectors:
        by_name = {c.get("name"): dict(c) for c in data.get("collectors") or [] if isinstance(c, dict)}
        flag_names = [name for name, _url in flag_collectors]
        repeated = sorted({n for n in flag_names if flag_names.count(n) > 1})
        if repeated:
            raise ConfigError(f"--collector: names must be unique, repeated: {', '.join(repeated)}; give each "
                              "collector its own name (a --collector replaces the url of the config file's "
                              "collector of that name)")
        for name, url in flag_collectors:
            by_name.setdefault(name, {"name": name})["url"] = url
        data["collectors"] = list(by_name.values())
    for name, mode in _pairs(getattr(args, "collector_mode", None), "--collector-mode"):
        named = [c for c in data.get("collectors") or [] if isinstance(c, dict) and c.get("name") == name]
        if not named:
            raise ConfigError(f"--collector-mode {name}={mode}: no collector named {name!r}; "
                              f"add --collector {name}=URL or a collectors entry in the config file")
        named[0]["mode"] = mode
    return build_config(data)


def _add_relay_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (flags override it)")
    p.add_argument("--bootstrap-servers", help="Kafka bootstrap servers, HOST:PORT[,HOST:PORT]")
    p.add_argument("--topic", action="append", help="topic to consume (repeatable, or a,b; default openlineage)")
    p.add_argument("--group-id", help="consumer group (default lineage-relay)")
    p.add_argument("--collector", action="append", metavar="NAME=URL", help="collector base URL (repeatable)")
    p.add_argument("--collector-mode", action="append", metavar="NAME=MODE",
                   help="delivery mode of a collector: passthrough (default), consolidated or coalesce (repeatable)")
    p.add_argument("--dlq-topic", help="dead-letter topic (default openlineage.dlq)")
    p.add_argument("--http-port", type=int, help="port for /healthz, /readyz, /metrics (0 = any free port)")
    p.add_argument("--consumer-property", action="append", metavar="KEY=VALUE",
                   help="librdkafka consumer property (repeatable)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--workers", metavar="N|auto",
                   help="relay processes in this pod under one supervisor (1-64, or auto: one per CPU; default 1)")
    p.add_argument("--event-loop", choices=event_loop.EVENT_LOOPS,
                   help="event loop of the relay's processes (default auto: uvloop when installed, else asyncio)")


async def serve(config: RelayConfig, worker: WorkerLink | None = None) -> None:
    """Run one relay. As a ``worker`` of a supervisor (see :mod:`relay.workers`): its own
    ``group.instance.id`` (see :meth:`WorkerLink.relay_config`), its endpoint on 127.0.0.1
    at a free port, reported to the supervisor, a stop on SIGTERM (SIGINT is the
    supervisor's: it stops the workers) and when the supervisor is gone."""
    loop = asyncio.get_running_loop()
    relay = None

    def request_stop() -> None:  # a stop before the relay exists is taken as soon as it does
        nonlocal stop_requested
        stop_requested = True
        if relay is not None:
            relay.request_stop()

    stop_requested = False
    # First, before the imports and the relay's construction: the supervisor may stop its
    # workers at once (a stop during its start-up), and an unhandled SIGTERM kills.
    signals = (signal.SIGTERM,) if worker is not None else (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, request_stop)
    try:
        from relay.app import Relay
        from relay.process import tune_process
        from relay.server import build_app, listen

        tune_process()
        relay = Relay(worker.relay_config(config) if worker is not None else config)
        if stop_requested:
            relay.request_stop()
        runner = None
        if worker is not None:
            worker.watch_lifeline(loop, relay.request_stop)
            runner, port = await listen(build_app(relay), "127.0.0.1", 0)
            if not worker.report_port(port):
                log_event(log, logging.WARNING, "supervisor_gone", stage="reporting the port", action="stopping")
                relay.request_stop()
            log_event(log, logging.INFO, "http_listening", host="127.0.0.1", port=port)
        elif config.http.port is not None:
            runner, port = await listen(build_app(relay), config.http.host, config.http.port)
            log_event(log, logging.INFO, "http_listening", host=config.http.host, port=port)
        try:
            await relay.run()
        finally:
            if runner is not None:
                await runner.cleanup()
    finally:
        # asyncio's loop puts the default handlers back when it closes; uvloop's leaves its
        # own bound to the closed loop, and SIGINT/SIGTERM would be ignored from then on.
        for sig in signals:
            loop.remove_signal_handler(sig)


def check_files(config: RelayConfig) -> None:
    """What ``run`` reads before it starts, read now (no network): each collector's token
    (``token_env``, ``token_file``) and TLS files (``tls.ca_bundle``, ``tls.client_cert``).
    Raises :class:`ConfigError` naming the key; with several problems, each of them (as
    for the file's own keys: fixing one at a time took a run per problem)."""
    from relay.sinks.auth import TokenSource, ssl_context

    problems: list[str] = []
    for collector in config.collectors:
        for check in (TokenSource, ssl_context):
            try:
                check(collector)
            except ConfigError as err:
                problems.append(str(err))
    if len(problems) > 1:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    if problems:
        raise ConfigError(problems[0])


class _Version(argparse.Action):
    """``--version``, on one line (argparse's own wraps it), computed only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any) -> None:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``lineage-relay X (librdkafka Y, confluent-kafka Z, aiohttp W, Python V)``: what a bug
    report needs (the ``relay_started`` log line has the same fields)."""
    from relay.startup import component_versions

    v = component_versions()
    return (f"lineage-relay {v['version']} (librdkafka {v['librdkafka']}, confluent-kafka {v['confluent_kafka']}, "
            f"aiohttp {v['aiohttp']}, Python {v['python']})")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _stop_on_sigterm_as_on_interrupt() -> Any:
    """An operator command (replay, dlq) stopped by ``docker stop`` or Kubernetes ends as
    Ctrl-C ends it: releasing its redrive lease, saying what it did. Without a handler
    SIGTERM would kill it with the lease held (the next redrive waits out the takeover), and
    as a container's PID 1 it would be ignored until SIGKILL. A SIGTERM ignored by whoever
    started the process stays ignored. Returns the handler replaced (None if none was)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lineage-relay", description=__doc__)
    parser.add_argument("--version", action=_Version, nargs=0, help="print versions (relay, librdkafka, ...) and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="relay events from Kafka to the collectors")
    _add_relay_flags(run)
    check = sub.add_parser("check-config", help="validate a config file: exit 0, or name the bad key and the fix")
    check.add_argument("path")
    demo = sub.add_parser("demo", help="embedded broker + relay + local collector + sample stream")
    demo.add_argument("--runs", type=_positive_int, default=12, help="sample runs to send (default 12)")
    demo.add_argument("--no-spark", action="store_true", help="send a synthetic stream instead of a PySpark job")
    lineage_graph.add_parser(sub)  # graph: the demo's lineage as an HTML page, upstream/downstream answers
    add_ops_subcommands(sub)  # replay, dlq list|redrive: all in relay/ops
    args = parser.parse_args(argv)
    if args.command != "run":  # the start-up stop of relay/entrypoint.py is for the relay's start
        release_early_stop()
    if getattr(args, "ops_handler", None) is not None:
        previous = _stop_on_sigterm_as_on_interrupt()
        try:
            return args.ops_handler(args)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    try:
        if args.command == "check-config":
            read = read_config(args.path)
            cfg = build_config(read.data)
            check_files(cfg)
            for line in read.warnings() + [w for c in cfg.collectors for w in c.warnings()]:
                print(f"lineage-relay: warning: {line}", file=sys.stderr)
            print(f"{args.path}: OK ({len(cfg.collectors)} collector(s): {', '.join(c.name for c in cfg.collectors)})")
            return 0
        if args.command == "demo":
            from relay.embedded.broker import BrokerUnavailable
            from relay.embedded.demo import run_demo
            from relay.embedded.output_lock import DemoBusy

            try:
                return run_demo(runs=args.runs, spark=not args.no_spark)
            except (BrokerUnavailable, DemoBusy) as err:  # a part the demo needs is not installed, or
                print(f"lineage-relay demo: {err}", file=sys.stderr)  # another demo uses demo-output/
                return 2
            except TimeoutError as err:  # its message: "demo: timed out waiting for ..."
                print(f"lineage-relay {err}", file=sys.stderr)
                return 1
            except (FileExistsError, NotADirectoryError) as err:   # ./demo-output is a file
                print(f"lineage-relay demo: cannot use {err.filename} as the output directory ({err.strerror}); "
                      "fix: move it away, or run the demo from another directory", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print("lineage-relay demo: interrupted; demo-output/ is incomplete (run the demo again)",
                      file=sys.stderr)
                return 130
        if args.command == "graph":
            return lineage_graph.run(args)
        worker = WorkerLink.from_env()
        once: bytes | None = None
        if worker is None:   # a pipe read here is read for the workers too (config_copy)
            once = read_once(args.config)
        elif os.environ.get(CONFIG_COPY_ENV):
            args.config = os.environ[CONFIG_COPY_ENV]
        inline: list[str] = []
        config = config_from_args(args, inline, once)
    except ConfigError as err:
        print(f"lineage-relay: {err}", file=sys.stderr)
        return 2
    if worker is not None:  # one relay of a supervisor's: its lines say which
        set_log_context(worker=worker.index)
    setup_logging(config.log_level)
    if worker is None:  # resolved once, here: a worker runs one relay whatever the setting
        count, source = resolve_workers(config.workers)
        if config.workers == "auto" or count > 1:  # auto decodes inline even when it comes to 1
            log_event(log, logging.INFO, "workers_resolved", workers=count, setting=config.workers, source=source)
        if count > 1:
            with config_copy(once):
                return _supervise(config, list(sys.argv[1:] if argv is None else argv), count)
    for key in inline:  # once, at start-up; the key names the collector, never the value
        log_event(log, logging.WARNING, "secret_in_config_file", key=key,
                  fix="take it from an environment variable (${NAME}), or use token_env or token_file")
    for line in (w for c in config.collectors for w in c.warnings()):
        log_event(log, logging.WARNING, "config_warning", detail=line)
    try:
        event_loop.run(serve(config) if worker is None else serve(config, worker), config.event_loop)
    except (ConfigError, StateError) as err:  # found at start-up: a token or TLS file that cannot
        return _failed("config_error", err, 2)  # be read, an input topic to create first, a port taken
    except SourceError as err:  # the consumer failed for good (after the drain and last commit)
        return _failed("relay_failed", err, 1)
    except Exception as err:  # noqa: BLE001 - a bug: one JSON line (traceback inside), not a raw traceback
        log.error("relay_failed", exc_info=err, extra={"fields": {"error": f"{type(err).__name__}: {err}",
                                                                  "exit_code": 1}})
        return 1
    return 0


def _failed(event: str, err: Exception, exit_code: int) -> int:
    """``run`` ends on ``err``, after logging was set up: one JSON log line (``error``, several
    problems included, and ``exit_code``), not a plain-text line amid the JSON ones (before
    logging is set up, a flag or the file refused, the plain line is all there is)."""
    log_event(log, logging.ERROR, event, error=str(err), exit_code=exit_code)
    return exit_code


def _supervise(config: RelayConfig, argv: list[str], count: int) -> int:
    """``run`` with ``workers`` resolved to ``count`` above 1 (see :mod:`relay.workers`): what
    the workers would each find at start-up is checked here first, once (their warnings are
    theirs to log)."""
    from relay.workers import supervise

    try:
        check_files(config)
        return event_loop.run(supervise(config, argv, count), config.event_loop)
    except ConfigError as err:  # a file a worker would read, the endpoint's port taken
        return _failed("config_error", err, 2)
    except Exception as err:  # noqa: BLE001 - a bug: one JSON line (traceback inside), not a raw traceback
        log.error("supervisor_failed", exc_info=err, extra={"fields": {"error": f"{type(err).__name__}: {err}",
                                                                       "exit_code": 1}})
        return 1


if __name__ == "__main__":
    sys.exit(main())
