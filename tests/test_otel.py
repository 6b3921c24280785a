"""OpenTelemetry tracing (flask_sqlqueue.otel, docs/opentelemetry.md) with the real SDK
and its in-memory exporter, and real workers on every backend: the trace context carried
from the span that enqueued a job to the attempts that ran it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace import StatusCode

from flask_sqlqueue import Call
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import current_job
from flask_sqlqueue.core.features.tags import MAX_META_BYTES
from flask_sqlqueue.exceptions import Snooze
from flask_sqlqueue.otel import instrument
from flask_sqlqueue.otel import uninstrument
from flask_sqlqueue.processes import AppLoader
from tests.conftest import install_schema
from tests.sample_app import queue_app
from tests.stores import burst
from tests.stores import store_of
from tests.waiting import wait_for
from tests.workers import run_burst

queue = SQLQueue()


@queue.task(name="otel.echo")
def echo(value: Any = None) -> dict[str, Any]:
    """Returns the span current while the task runs, and the job's metadata."""
    context = trace.get_current_span().get_span_context()
    return {
        "value": value,
        "span_id": format(context.span_id, "016x"),
        "trace_id": format(context.trace_id, "032x"),
        "meta": dict(current_job.meta),
    }


@queue.task(name="otel.fails", max_attempts=1)
def fails() -> None:
    raise RuntimeError("the printer is on fire")


@queue.task(name="otel.snoozes", max_attempts=1)
def snoozes() -> str:
    if current_job.snoozes == 0:
        raise Snooze(0.01)
    return "woke"


def create_app() -> Flask:
    """The app of a process worker's children (``SAMPLE_DATABASE_URI``)."""
    return queue_app(__name__, queue, None)


class Traced:
    """A tracer provider of the test's own (the global one is never set) and its spans."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = self.exporter.get_finished_spans()
        return [span for span in found if name is None or span.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.spans(name)
        return span


@pytest.fixture
def traced() -> Iterator[Traced]:
    made = Traced()
    instrument(queue, tracer_provider=made.provider)
    yield made
    uninstrument(queue)
    made.provider.shutdown()


@pytest.fixture
def otel_app(database_uri: str, tmp_path: Path) -> Iterator[Flask]:
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    app = queue_app(__name__, queue, {"SQLQUEUE_DATABASE_URI": database_uri})
    app.instance_path = str(tmp_path / "instance")
    if database_uri.startswith("sqlite"):
        queue.upgrade_database(app=app)
    yield app
    store_of(app).engine.dispose()


def _hex(value: int) -> str:
    return format(value, "016x")


def test_the_trace_goes_from_the_request_to_the_attempt(otel_app: Flask, traced: Traced) -> None:
    with otel_app.app_context():
        with traced.tracer.start_as_current_span("GET /orders", kind=SpanKind.SERVER) as request:
            job = echo.using(meta={"asked_by": "ops"}).enqueue(42)
        burst(otel_app)
        done = job.refresh()
    assert done.status == "completed"

    publish = traced.one("default publish")
    request_context = request.get_span_context()
    assert publish.kind is SpanKind.PRODUCER
    assert publish.parent is not None and publish.parent.span_id == request_context.span_id
    assert publish.context.trace_id == request_context.trace_id
    assert publish.attributes is not None
    assert dict(publish.attributes) == {
        "messaging.system": "sqlqueue",
        "messaging.operation": "publish",
        "messaging.operation.type": "publish",
        "messaging.destination.name": "default",
        "messaging.sqlqueue.task": "otel.echo",
        "messaging.message.id": str(job.id),
    }
    # The producer span's context rides in the job's metadata, beside the caller's own.
    ids = publish.context
    traceparent = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{int(ids.trace_flags):02x}"
    assert done.meta == {"asked_by": "ops", "traceparent": traceparent}

    process = traced.one("otel.echo process")
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == request_context.trace_id
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert [link.context.span_id for link in process.links] == [publish.context.span_id]
    assert process.attributes is not None
    assert dict(process.attributes) == {
        "messaging.system": "sqlqueue",
        "messaging.operation": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.id),
        "messaging.sqlqueue.task": "otel.echo",
        "messaging.sqlqueue.attempt": 1,
        "messaging.sqlqueue.max_attempts": 5,
        "messaging.sqlqueue.outcome": "succeeded",
    }
    assert process.status.status_code is StatusCode.UNSET
    # The consumer span is the current one while the task runs: its own spans nest in it.
    assert done.result["span_id"] == _hex(process.context.span_id)


def test_a_failed_attempt_is_an_error_with_its_exception(otel_app: Flask, traced: Traced) -> None:
    with otel_app.app_context():
        with traced.tracer.start_as_current_span("request"):
            job = fails.enqueue()
        burst(otel_app)
        assert job.refresh().status == "dead"

    process = traced.one("otel.fails process")
    assert process.status.status_code is StatusCode.ERROR
    assert process.status.description == "RuntimeError: the printer is on fire"
    assert process.attributes is not None
    assert process.attributes["messaging.sqlqueue.outcome"] == "failed"
    assert process.attributes["error.type"] == "RuntimeError"
    (event,) = process.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"
    assert event.attributes["exception.message"] == "the printer is on fire"
    assert "Traceback" in str(event.attributes["exception.stacktrace"])
    assert process.context.trace_id == traced.one("default publish").context.trace_id


def test_a_snooze_is_no_error(otel_app: Flask, traced: Traced) -> None:
    with otel_app.app_context():
        job = snoozes.enqueue()

        def woke() -> bool:
            burst(otel_app)  # again, until the snooze's delay has passed
            return job.refresh().status == "completed"

        wait_for(woke, "the snoozed job to run again")
        assert job.result == "woke"
    outcomes = [
        span.attributes["messaging.sqlqueue.outcome"]
        for span in traced.spans("otel.snoozes process")
        if span.attributes is not None
    ]
    assert outcomes == ["snoozed", "succeeded"]
    assert all(
        span.status.status_code is StatusCode.UNSET for span in traced.spans("otel.snoozes process")
    )


def test_jobs_without_a_trace_context_still_get_spans(otel_app: Flask) -> None:
    with otel_app.app_context():
        untraced = echo.enqueue("before")  # written before the queue was instrumented
        made = Traced()
        instrument(queue, tracer_provider=made.provider)
        try:
            rooted = echo.enqueue("no span active")
            burst(otel_app)
        finally:
            uninstrument(queue)
        assert untraced.refresh().meta == {}
        assert untraced.status == rooted.refresh().status == "completed"

    first, second = sorted(made.spans("otel.echo process"), key=_message_id)
    # No context to carry: the attempt starts a trace of its own, with no link.
    assert first.parent is None and list(first.links) == []
    # No span was active at the enqueue: the producer span is a root, the attempt its child.
    publish = made.one("default publish")
    assert publish.parent is None
    assert second.parent is not None and second.parent.span_id == publish.context.span_id
    assert second.context.trace_id == publish.context.trace_id != first.context.trace_id


def _message_id(span: ReadableSpan) -> int:
    assert span.attributes is not None
    return int(str(span.attributes["messaging.message.id"]))


def test_enqueue_many_is_one_span_whose_context_every_job_carries(
    otel_app: Flask, traced: Traced
) -> None:
    with otel_app.app_context():
        with traced.tracer.start_as_current_span("import"):
            jobs = echo.enqueue_many([Call([n]) for n in range(3)])
        burst(otel_app)
        metas = [job.refresh().meta for job in jobs]

    publish = traced.one("default publish")
    assert publish.attributes is not None
    assert publish.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in publish.attributes
    assert len({meta["traceparent"] for meta in metas}) == 1
    processes = traced.spans("otel.echo process")
    assert sorted(map(_message_id, processes)) == sorted(job.id for job in jobs)
    for process in processes:
        assert process.parent is not None and process.parent.span_id == publish.context.span_id


def test_a_callers_own_trace_context_wins(otel_app: Flask, traced: Traced) -> None:
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with otel_app.app_context():
        with traced.tracer.start_as_current_span("request"):
            job = echo.using(meta={"traceparent": own}).enqueue()
        burst(otel_app)
        assert job.refresh().meta == {"traceparent": own}

    process = traced.one("otel.echo process")
    assert _hex(process.context.trace_id).rjust(32, "0") == "0af7651916cd43dd8448eb211c80319c"
    assert process.parent is not None and _hex(process.parent.span_id) == "b7ad6b7169203331"


def test_a_context_that_does_not_fit_the_metadata_is_left_out(
    otel_app: Flask, traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    big = {"note": "x" * (MAX_META_BYTES - 20)}  # fits alone, not with a traceparent
    with otel_app.app_context(), caplog.at_level(logging.WARNING, "flask_sqlqueue.otel"):
        with traced.tracer.start_as_current_span("request"):
            job = echo.using(meta=big).enqueue()
        assert job.meta == big  # enqueued all the same, without the context
    assert "the trace context is not carried to the job" in caplog.text
    assert traced.one("default publish").attributes is not None


def test_a_bad_enqueue_is_an_error_span_and_writes_nothing(otel_app: Flask, traced: Traced) -> None:
    with otel_app.app_context():
        with pytest.raises(TypeError, match="does not take these arguments"):
            echo.enqueue(1, 2, 3)
        assert store_of(otel_app).get_job(1) is None
    publish = traced.one("default publish")
    assert publish.status.status_code is StatusCode.ERROR
    assert publish.events[0].name == "exception"


def test_uninstrumented_the_queue_adds_nothing(otel_app: Flask, traced: Traced) -> None:
    uninstrument(queue)
    assert queue.hooks.enqueue == [] and queue.hooks.attempt == []
    with otel_app.app_context():
        with traced.tracer.start_as_current_span("request"):
            job = echo.enqueue()
        burst(otel_app)
        assert job.refresh().meta == {}
    assert [span.name for span in traced.spans()] == ["request"]


def test_instrumenting_twice_makes_one_span_each(otel_app: Flask, traced: Traced) -> None:
    instrument(queue, tracer_provider=traced.provider)
    assert len(queue.hooks.enqueue) == len(queue.hooks.attempt) == 1
    with otel_app.app_context():
        echo.enqueue()
        burst(otel_app)
    assert len(traced.spans("default publish")) == len(traced.spans("otel.echo process")) == 1


def test_a_broken_hook_breaks_neither_enqueue_nor_attempt(
    otel_app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_value: Any) -> Any:
        raise RuntimeError("hook bug")

    queue.hooks.enqueue.append(broken)
    queue.hooks.attempt.append(broken)
    try:
        with otel_app.app_context(), caplog.at_level(logging.ERROR, "flask_sqlqueue.hooks"):
            job = echo.enqueue("still")
            burst(otel_app)
            assert job.refresh().result["value"] == "still"
    finally:
        queue.hooks.enqueue.remove(broken)
        queue.hooks.attempt.remove(broken)
    assert caplog.text.count("failed on entry; skipped") == 2


@pytest.mark.slow
def test_a_process_worker_spans_each_attempt_in_its_children(
    otel_app: Flask, traced: Traced, database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAMPLE_DATABASE_URI", database_uri)  # for the children's app
    with otel_app.app_context():
        with traced.tracer.start_as_current_span("request"):
            ok, bad = echo.enqueue("in a child"), fails.enqueue()
        loader = AppLoader(f"{__name__}:create_app")
        worker = queue.worker(WorkerOptions(processes=1, grace=1.0), otel_app, loader=loader)
        run_burst(worker, timeout=180)
        assert ok.refresh().status == "completed" and bad.refresh().status == "dead"

    publish_ids = {span.context.span_id for span in traced.spans("default publish")}
    # The worker's process makes the span, around the child's run of the attempt.
    process = traced.one("otel.echo process")
    assert process.parent is not None and process.parent.span_id in publish_ids
    assert process.attributes is not None
    assert process.attributes["messaging.sqlqueue.outcome"] == "succeeded"
    # In the child no span is current; the task finds the context in its metadata.
    assert ok.result["span_id"] == "0" * 16
    assert ok.result["meta"]["traceparent"].split("-")[1] == f"{process.context.trace_id:032x}"
    failed = traced.one("otel.fails process")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == "RuntimeError"  # the child's error, by name
    assert failed.status.description == "RuntimeError: the printer is on fire"
    (event,) = failed.events
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"
    stacktrace = str(event.attributes["exception.stacktrace"])
    assert "in fails" in stacktrace and "RuntimeError: the printer is on fire" in stacktrace
