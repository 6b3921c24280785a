"""Typed task arguments (docs/arguments.md): encoded at enqueue by the task's annotations,
stored as plain JSON, decoded in the worker, on every backend.

The tasks are in ``tests/typed_app.py``; each returns the ``repr`` of what it was called
with, so a test compares values and their types exactly, in whichever process ran it.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import os
import re
from collections.abc import Iterator
from datetime import UTC
from datetime import date
from datetime import datetime
from datetime import time
from datetime import timedelta
from datetime import timezone
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import JobStatus
from flask_sqlqueue import PayloadError
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.features.arguments import codec_for
from flask_sqlqueue.processes import AppLoader
from flask_sqlqueue.testing import assert_enqueued
from flask_sqlqueue.testing import assert_not_enqueued
from flask_sqlqueue.testing import drain
from flask_sqlqueue.testing import enqueue_periodic
from tests import sample_app
from tests import typed_app as tasks
from tests.conftest import query
from tests.sample_app import queue_app
from tests.stores import burst
from tests.typed_app import Level
from tests.typed_app import Line
from tests.typed_app import Order
from tests.typed_app import Parcel
from tests.typed_app import Tier
from tests.workers import run_burst

ID = UUID("6f1c2e4a-9b3d-4c5e-8f70-112233445566")
OTHER = UUID("00000000-0000-4000-8000-000000000001")
PARIS = timezone(timedelta(hours=2))
ORDER = Order(
    id=ID,
    placed=datetime(2024, 5, 1, 9, 30, 15, 123456, tzinfo=PARIS),
    lines=[Line("tea", Decimal("3.10")), Line("cup", Decimal("12.00"), quantity=2)],
    tier=Tier.PRO,
    note=None,
    tags=["gift"],
)
#: The arguments of ``everything``, and what they are stored as.
VALUES = [
    datetime(2024, 5, 1, 9, 30, 0, 5),  # naive, and stays naive
    date(2024, 2, 29),
    time(23, 59, 59, 999999, tzinfo=UTC),
    ID,
    Decimal("-0.000100"),  # exact: neither rounded nor normalised
    Tier.FREE,
    Level.HIGH,
    ORDER,
]
STORED_ORDER = {
    "id": str(ID),
    "placed": "2024-05-01T09:30:15.123456+02:00",
    "lines": [
        {"sku": "tea", "price": "3.10", "quantity": 1},
        {"sku": "cup", "price": "12.00", "quantity": 2},
    ],
    "tier": "pro",
    "note": None,
    "tags": ["gift"],
}
STORED = [
    "2024-05-01T09:30:00.000005",
    "2024-02-29",
    "23:59:59.999999+00:00",
    str(ID),
    "-0.000100",
    "free",
    2,
    STORED_ORDER,
]


@pytest.fixture
def typed(make_app: Any, database_uri: str) -> Iterator[Flask]:
    """The typed app on the test's database (the schema put there by ``make_app``)."""
    make_app()
    app = tasks.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def payload(database_uri: str, job_id: int) -> Any:
    """The job's payload as the database holds it, read past the queue's own code."""
    ((text,),) = query(database_uri, "SELECT payload FROM sqlqueue_jobs WHERE id = :id", id=job_id)
    return json.loads(text)


def job_count(database_uri: str) -> int:
    ((count,),) = query(database_uri, "SELECT COUNT(*) FROM sqlqueue_jobs")
    return int(count)


# -- through a real worker ----------------------------------------------------------------------


def test_every_type_round_trips_through_a_thread_worker(typed: Flask, database_uri: str) -> None:
    paris = datetime(2024, 7, 1, 9, 0, tzinfo=ZoneInfo("Europe/Paris"))
    with typed.app_context():
        full = tasks.everything.enqueue(*VALUES, maybe=paris, plain={"n": [1, 2]})
        bare = tasks.everything.enqueue(*VALUES)
        nested = tasks.containers.enqueue(
            [ORDER, dataclasses.replace(ORDER, id=OTHER, lines=[], tags=[])],
            (date(2024, 1, 1), date(2024, 12, 31)),
            {"tea": Decimal("3.10"), "big": Decimal("1E+30")},
            (OTHER, 7),
            {"a": [Decimal("1.5"), None], "b": []},
            ID,
            OTHER,
            first=Tier.PRO,
            second=Tier.FREE,
        )

    # The rows hold plain JSON: ISO text, the UUID's and the Decimal's text, the member's
    # value, an object of the dataclass's fields.
    assert payload(database_uri, full.id) == {
        "args": STORED,
        "kwargs": {"maybe": "2024-07-01T09:00:00+02:00", "plain": {"n": [1, 2]}},
    }
    assert payload(database_uri, nested.id) == {
        "args": [
            [STORED_ORDER, {**STORED_ORDER, "id": str(OTHER), "lines": [], "tags": []}],
            ["2024-01-01", "2024-12-31"],
            {"tea": "3.10", "big": "1E+30"},
            [str(OTHER), 7],
            {"a": ["1.5", None], "b": []},
            str(ID),
            str(OTHER),
        ],
        "kwargs": {"first": "pro", "second": "free"},
    }
    # What a Job reads back is what is stored.
    with typed.app_context():
        read = tasks.queue.get_job(full.id)
    assert read is not None
    assert (read.args, read.kwargs["maybe"]) == (STORED, "2024-07-01T09:00:00+02:00")

    burst(typed)

    for job in (full, bare, nested):
        assert job.refresh().status is JobStatus.COMPLETED, job.last_error
    # An aware datetime keeps its offset (a fixed offset: the zone's name is not stored).
    summer = datetime(2024, 7, 1, 9, 0, tzinfo=PARIS)
    assert full.result == repr([*VALUES, summer, {"n": [1, 2]}])
    assert bare.result == repr([*VALUES, None, None])
    assert nested.result == repr(
        [
            [ORDER, dataclasses.replace(ORDER, id=OTHER, lines=[], tags=[])],
            (date(2024, 1, 1), date(2024, 12, 31)),
            {"tea": Decimal("3.10"), "big": Decimal("1E+30")},
            (OTHER, 7),
            {"a": [Decimal("1.5"), None], "b": []},
            (ID, OTHER),
            {"first": Tier.PRO, "second": Tier.FREE},
        ]
    )


def test_an_isolated_attempt_decodes_in_its_child_process(
    typed: Flask, database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAMPLE_DATABASE_URI", database_uri)  # for the children's app
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    with typed.app_context():
        good = tasks.in_child.enqueue(ORDER, when)
        bad = tasks.in_child.enqueue(ORDER, when)
    # Edited by hand: the parent refuses it before any child is asked to run it.
    stored = payload(database_uri, bad.id)
    stored["args"][0]["tier"] = "gold"
    query(
        database_uri,
        "UPDATE sqlqueue_jobs SET payload = :p WHERE id = :id",
        p=json.dumps(stored),
        id=bad.id,
    )
    worker = tasks.queue.worker(
        WorkerOptions(processes=1, grace=1.0), typed, loader=AppLoader("tests.typed_app:create_app")
    )
    run_burst(worker, timeout=180)

    good.refresh()
    assert good.status is JobStatus.COMPLETED, good.last_error
    assert good.result["repr"] == repr([ORDER, when])
    assert good.result["pid"] != os.getpid()
    bad.refresh()
    assert (bad.status, bad.attempts) == (JobStatus.DEAD, 1)
    assert bad.last_error == (
        "MalformedPayload: args[0].tier = 'gold' cannot be decoded as a Tier member such as "
        "Tier.FREE for parameter 'order' (Order): no Tier member has this value "
        "(they have ['free', 'pro'])."
    )


def test_a_stored_value_that_does_not_decode_fails_its_job_with_a_clear_error(
    typed: Flask, database_uri: str
) -> None:
    with typed.app_context():
        jobs = [tasks.everything.enqueue(*VALUES) for _ in range(4)]
        good = tasks.everything.enqueue(*VALUES)
    edits = [
        (0, "2024-13-45"),
        (4, 12.5),  # a Decimal stored as a number: it would not be exact
        (6, 3),  # no Level has the value 3
        (7, {**STORED_ORDER, "lines": [{"sku": "tea"}]}),
    ]
    for job, (index, value) in zip(jobs, edits, strict=True):
        args = [*STORED]
        args[index] = value
        text = json.dumps({"args": args, "kwargs": {}})
        query(
            database_uri, "UPDATE sqlqueue_jobs SET payload = :p WHERE id = :id", p=text, id=job.id
        )
    burst(typed)

    assert good.refresh().status is JobStatus.COMPLETED
    for job in jobs:
        job.refresh()
        assert (job.status, job.attempts) == (JobStatus.DEAD, 1)
        assert job.payload_error is None  # the JSON itself is fine: Job shows it
    assert [job.last_error for job in jobs] == [
        "MalformedPayload: args[0] = '2024-13-45' cannot be decoded as a datetime for "
        "parameter 'when' (datetime): month must be in 1..12.",
        "MalformedPayload: args[4] = 12.5 cannot be decoded as a finite Decimal for "
        "parameter 'amount' (Decimal): it is a number, and a finite Decimal is stored as "
        'its text, like "12.50".',
        "MalformedPayload: args[6] = 3 cannot be decoded as a Level member such as Level.LOW "
        "for parameter 'level' (Level): no Level member has this value (they have [1, 2]).",
        "MalformedPayload: args[7].lines[0] = {'sku': 'tea'} cannot be decoded as a Line for "
        "parameter 'order' (Order): its field 'price' is missing.",
    ]


# -- refused at enqueue ---------------------------------------------------------------------------


@dataclasses.dataclass
class SpecialOrder(Order):
    pass


class Pair(enum.Enum):
    ONE = (1, 2)


@dataclasses.dataclass
class Window:
    size: int
    scale: dataclasses.InitVar[float]


WRONG = [
    (
        ["2024-05-01T09:30:00", *VALUES[1:]],
        "args[0] = '2024-05-01T09:30:00' is a str, not a datetime: parameter 'when' is "
        "annotated datetime, so pass a datetime.",
    ),
    (
        [VALUES[0], VALUES[0], *VALUES[2:]],
        "args[1] = datetime.datetime(2024, 5, 1, 9, 30, 0, 5) is a datetime, not a date: "
        "parameter 'day' is annotated date, so pass a date.",
    ),
    (
        [*VALUES[:3], str(ID), *VALUES[4:]],
        f"args[3] = '{ID}' is a str, not a UUID: parameter 'ident' is annotated UUID, so "
        "pass a UUID.",
    ),
    (
        [*VALUES[:4], 0.1, *VALUES[5:]],
        "args[4] = 0.1 is a float, not a finite Decimal: parameter 'amount' is annotated "
        "Decimal, so pass a finite Decimal.",
    ),
    (
        [*VALUES[:4], Decimal("NaN"), *VALUES[5:]],
        "args[4] = Decimal('NaN') is a Decimal, not a finite Decimal: parameter 'amount' is "
        "annotated Decimal, so pass a finite Decimal.",
    ),
    (
        [*VALUES[:5], Level.LOW, *VALUES[6:]],
        "args[5] = <Level.LOW: 1> is a Level, not a Tier member such as Tier.FREE: "
        "parameter 'tier' is annotated Tier, so pass a Tier member such as Tier.FREE.",
    ),
    (
        [*VALUES[:6], 2, *VALUES[7:]],
        "args[6] = 2 is an int, not a Level member such as Level.LOW: parameter 'level' is "
        "annotated Level, so pass a Level member such as Level.LOW.",
    ),
    (
        [*VALUES[:7], dataclasses.replace(ORDER, placed="2024-05-01")],
        "args[7].placed = '2024-05-01' is a str, not a datetime: parameter 'order' is "
        "annotated Order, so pass a datetime there.",
    ),
    (
        [*VALUES[:7], dataclasses.replace(ORDER, lines=[Line("tea", 3.1)])],
        "args[7].lines[0].price = 3.1 is a float, not a finite Decimal: parameter 'order' is "
        "annotated Order, so pass a finite Decimal there.",
    ),
    (
        [*VALUES[:7], SpecialOrder(**dataclasses.asdict(ORDER))],
        "is a SpecialOrder, not an Order: parameter 'order' is annotated Order, so pass an Order.",
    ),
    (
        [*VALUES[:7], {"id": str(ID)}],
        "args[7] = {'id': '6f1c2e4a-9b3d-4c5e-8f70-112233445566'} is a dict, not an Order: "
        "parameter 'order' is annotated Order, so pass an Order.",
    ),
]


def test_refusals_write_nothing_on_any_backend(typed: Flask, database_uri: str) -> None:
    with typed.app_context():
        for args, message in WRONG:
            with pytest.raises(PayloadError, match=re.escape(message)):  # a TypeError
                tasks.everything.enqueue(*args)
        with pytest.raises(
            TypeError, match=r"^args\[1\] = \[datetime.date\(.* is a list, not a tuple"
        ):
            tasks.containers.enqueue([], [date(2024, 1, 1)], {}, (ID, 1), {})
        with pytest.raises(TypeError, match=r"^kwargs\['pair'\] = .* it has 3 items, not 2"):
            tasks.containers.enqueue([], (), {}, pair=(ID, 1, 2), nested={})
        with pytest.raises(TypeError, match=r"^args\[2\] = \{1: Decimal.* has the key 1, which"):
            tasks.containers.enqueue([], (), {1: Decimal(1)}, (ID, 1), {})
        with pytest.raises(TypeError, match=r"^args\[5\] = 'x' is a str, not a UUID: "):
            tasks.containers.enqueue([], (), {}, (ID, 1), {}, "x")
        with pytest.raises(TypeError, match=r"^kwargs\['other'\] = 'pro' .* 'extra' is "):
            tasks.containers.enqueue([], (), {}, (ID, 1), {}, other="pro")
        with pytest.raises(TypeError, match=r"^calls\[1\]: args\[0\] = 'today' is a str"):
            tasks.daily.enqueue_many([([date(2024, 1, 1)], {}), (["today"], {})])
        with pytest.raises(TypeError, match=r"^args\[0\] = 'today' is a str, not a date"):
            tasks.queue.enqueue("tests.typed_app.daily", ["today"])
    assert job_count(database_uri) == 0


def test_enums_and_dataclasses_that_cannot_be_stored_say_why() -> None:
    def uses(pair: Pair | None = None, window: Window | None = None) -> None: ...

    codec = codec_for(uses, inspect.signature(uses))
    assert codec is not None
    with pytest.raises(TypeError, match=re.escape(
        "kwargs['pair'] = <Pair.ONE: (1, 2)> cannot be stored: Pair.ONE has the value (1, 2), "
        "which is not plain JSON: parameter 'pair' is annotated Pair | None, so give Pair "
        "plain JSON values (str, int...)."
    )):  # fmt: skip
        codec.encode([], {"pair": Pair.ONE})
    with pytest.raises(TypeError, match=re.escape(
        "kwargs['window'] = Window(size=1) cannot be stored: Window() needs 'scale', which is "
        "not one of its fields: parameter 'window' is annotated Window | None, so give "
        "'scale' a default, or make it a field."
    )):  # fmt: skip
        codec.encode([], {"window": Window(1, 2.0)})


def test_parameters_without_such_an_annotation_are_plain_json_as_before(
    typed: Flask, database_uri: str
) -> None:
    # No codec at all: an unannotated, int or Any parameter costs nothing and changes nothing.
    assert sample_app.add.codec is None and sample_app.echo.codec is None
    assert tasks.untyped.codec is None
    when = datetime(2024, 5, 1, tzinfo=UTC)
    with typed.app_context():
        with pytest.raises(TypeError, match=re.escape(
            "args[0] = datetime.datetime(2024, 5, 1, 0, 0, tzinfo=datetime.timezone.utc) is a "
            "datetime, not JSON-serialisable; job arguments must be plain JSON."
        )):  # fmt: skip
            tasks.untyped.enqueue(when)
        # Plain JSON in a typed task's other parameters is checked as it always was.
        with pytest.raises(ValueError, match=r"kwargs\['plain'\] = nan is not a finite number"):
            tasks.everything.enqueue(*VALUES, plain=float("nan"))
        with pytest.raises(TypeError, match=r"kwargs\['plain'\] = \(1, 2\) is a tuple"):
            tasks.everything.enqueue(*VALUES, plain=(1, 2))
    assert job_count(database_uri) == 0


def test_an_annotation_below_the_task_is_read_at_its_first_use(typed: Flask) -> None:
    # ``ship`` is declared above ``Parcel``: the name is resolved at the first enqueue.
    with typed.app_context():
        job = tasks.ship.enqueue(Parcel(date(2024, 3, 1), Decimal("0.250")))
        assert job.args == [{"sent": "2024-03-01", "weight": "0.250"}]
        (ran,) = drain()
    assert ran.result == repr(Parcel(date(2024, 3, 1), Decimal("0.250")))


# -- other ways in: eager mode, drain, by name, the command line, schedules ------------------------


def test_eager_mode_and_the_test_helpers_decode_too(typed: Flask, database_uri: str) -> None:
    eager = tasks.create_app({"SQLQUEUE_DATABASE_URI": database_uri, "SQLQUEUE_EAGER": True})
    try:
        with eager.app_context():
            job = tasks.everything.enqueue(*VALUES)
    finally:
        eager.extensions["sqlqueue"].store.engine.dispose()
    assert (job.status, job.result) == (JobStatus.COMPLETED, repr([*VALUES, None, None]))

    with typed.app_context():
        later = tasks.daily.enqueue(date(2024, 6, 1), Tier.PRO)
        assert_enqueued(tasks.daily, [date(2024, 6, 1), Tier.PRO])  # values...
        assert_enqueued(tasks.daily, ["2024-06-01", "pro"])  # ...or stored forms
        assert_not_enqueued(tasks.daily, [date(2024, 6, 2), Tier.PRO])
        (ran,) = drain()
    assert ran.id == later.id
    assert ran.result == repr([date(2024, 6, 1), Tier.PRO])


def test_by_name_values_or_stored_forms_with_encoded(typed: Flask, database_uri: str) -> None:
    with typed.app_context():
        first = tasks.queue.enqueue("tests.typed_app.everything", VALUES)
        # A job's stored arguments enqueue again as they are, with encoded=True.
        again = tasks.queue.enqueue(first.task, first.args, first.kwargs, encoded=True)
        with pytest.raises(TypeError, match=r"^args\[0\] = '2024-05-01T09:30:00.000005' is a s"):
            tasks.queue.enqueue(first.task, first.args)
        with pytest.raises(ValueError, match=r"args\[1\] = 'Feb 29' cannot be decoded as a date"):
            tasks.queue.enqueue(first.task, [STORED[0], "Feb 29", *STORED[2:]], encoded=True)
        batch = tasks.queue.enqueue_many(
            "tests.typed_app.daily", [(["2024-06-01"], {"tier": "pro"})], encoded=True
        )
    assert payload(database_uri, again.id) == payload(database_uri, first.id)
    assert payload(database_uri, batch[0].id) == {"args": ["2024-06-01"], "kwargs": {"tier": "pro"}}
    assert job_count(database_uri) == 3

    # A producer that does not register the task writes the stored forms itself, and
    # the worker decodes them.
    elsewhere = SQLQueue()
    producer = queue_app("producer", elsewhere, {"SQLQUEUE_DATABASE_URI": database_uri})
    try:
        with producer.app_context():
            job = elsewhere.enqueue("tests.typed_app.daily", ["2024-06-02"], unregistered=True)
    finally:
        producer.extensions["sqlqueue"].store.engine.dispose()
    with typed.app_context():
        ran = {done.id: done for done in drain()}
    assert len(ran) == 4
    assert ran[job.id].result == repr([date(2024, 6, 2), Tier.FREE])


def test_the_command_line_takes_the_stored_forms(typed: Flask, database_uri: str) -> None:
    runner = typed.test_cli_runner()
    args = json.dumps([*STORED[:2], "23:59:59.999999Z", *STORED[3:]])
    result = runner.invoke(
        args=["queue", "enqueue", "tests.typed_app.everything", "--args", args,
              "--kwargs", '{"maybe": "2024-07-01T07:00:00Z"}']
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    daily = runner.invoke(
        args=["queue", "enqueue", "tests.typed_app.daily", "--args", '["2024-06-01"]']
    )
    assert daily.exit_code == 0, daily.output
    bad = runner.invoke(
        args=["queue", "enqueue", "tests.typed_app.daily", "--args", '["tomorrow"]']
    )
    assert bad.exit_code == 1
    assert bad.output == (
        "Error: args[0] = 'tomorrow' cannot be decoded as a date for parameter 'day' (date): "
        "Invalid isoformat string: 'tomorrow'.\n"
    )
    rows = query(database_uri, "SELECT id, payload, concurrency_key FROM sqlqueue_jobs ORDER BY id")
    assert len(rows) == 2
    # Stored in canonical form: "Z" is written "+00:00", as the values would be.
    assert json.loads(rows[0][1]) == {
        "args": [*STORED[:2], "23:59:59.999999+00:00", *STORED[3:]],
        "kwargs": {"maybe": "2024-07-01T07:00:00+00:00"},
    }
    # The concurrency key was made from the date the task will get.
    assert rows[1][2] == "2024-06-01"

    burst(typed)
    with typed.app_context():
        job, day = (tasks.queue.get_job(row[0]) for row in rows)
    assert job is not None and day is not None
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert job.result == repr([*VALUES, datetime(2024, 7, 1, 7, 0, tzinfo=UTC), None])
    assert day.result == repr([date(2024, 6, 1), Tier.FREE])


def test_periodic_arguments_are_typed_too(typed: Flask, database_uri: str) -> None:
    with typed.app_context():
        (job,) = enqueue_periodic(
            since=datetime(2024, 12, 31, tzinfo=UTC), until=datetime(2025, 1, 1, 1, tzinfo=UTC)
        )
        assert (job.task, job.args) == ("tests.typed_app.yearly", ["pro", "2024-01-01"])
        (ran,) = drain()
    assert ran.result == repr([Tier.PRO, date(2024, 1, 1)])

    with pytest.raises(ConfigurationError, match=re.escape(
        "Periodic task 'nightly': args[0] = '2024-01-01' is a str, not a date: parameter "
        "'since' is annotated date, so pass a date."
    )):  # fmt: skip

        @SQLQueue().periodic("0 0 * * *", args=["2024-01-01"], name="nightly")
        def nightly(since: date) -> None: ...
