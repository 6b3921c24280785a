"""What names a database lives behind ``DialectOps``: engine options, identity, files,
bulk inserts and doctor's checks, tested on the dialect objects themselves."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue.config import Settings
from flask_sqlqueue.core.diagnosis import FAIL
from flask_sqlqueue.core.diagnosis import OK
from flask_sqlqueue.core.diagnosis import WARN
from flask_sqlqueue.core.dialects import database_identity
from flask_sqlqueue.core.dialects import for_dialect
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import utcnow
from flask_sqlqueue.core.options import EnqueueOptions
from flask_sqlqueue.core.options import job_values
from flask_sqlqueue.core.store import Store
from flask_sqlqueue.core.store import is_transient
from flask_sqlqueue.exceptions import UnsupportedDatabase

SERVERS = ("postgresql", "mysql", "mariadb")


# -- choosing the operations ----------------------------------------------------------------


def test_an_unsupported_database_is_refused_before_its_driver_is_loaded() -> None:
    with pytest.raises(UnsupportedDatabase) as raised:
        Store.from_settings(Settings(database_uri="oracle+nosuchdriver://scott@db/orcl"))
    assert "mariadb, mysql, postgresql, sqlite" in str(raised.value)


# -- engine options --------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///:memory:"])
def test_sqlite_refuses_an_in_memory_database(uri: str) -> None:
    with pytest.raises(ConfigurationError, match="in-memory SQLite database cannot be shared"):
        for_dialect("sqlite").engine_options(sa.make_url(uri), {})


def test_sqlite_makes_the_folder_of_its_file_and_adds_no_options(tmp_path: Path) -> None:
    url = sa.make_url(f"sqlite:///{tmp_path / 'a' / 'b' / 'queue.db'}")
    assert for_dialect("sqlite").engine_options(url, {"echo": True}) == {"echo": True}
    assert (tmp_path / "a" / "b").is_dir()


@pytest.mark.parametrize("name", SERVERS)
def test_a_server_gets_pre_ping_and_read_committed_unless_the_app_says_otherwise(
    name: str,
) -> None:
    url = sa.make_url(f"{name}://db/queue")
    assert for_dialect(name).engine_options(url, {}) == {
        "pool_pre_ping": True,
        "isolation_level": "READ COMMITTED",
    }
    chosen = {"pool_pre_ping": False, "isolation_level": "SERIALIZABLE", "echo": True}
    assert for_dialect(name).engine_options(url, chosen) == chosen


# -- identity, files and wake-ups -------------------------------------------------------------


def test_two_paths_to_one_sqlite_file_are_one_database(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    one = database_identity(sa.make_url(f"sqlite:///{tmp_path / 'real' / 'q.db'}"))
    other = database_identity(sa.make_url(f"sqlite+pysqlite:///{tmp_path / 'link' / 'q.db'}"))
    assert one == other
    assert one != database_identity(sa.make_url(f"sqlite:///{tmp_path / 'real' / 'other.db'}"))


def test_a_server_database_is_its_address_and_name_whatever_the_driver() -> None:
    plain = database_identity(sa.make_url("postgresql://u:secret@db:5432/queue"))
    assert plain == database_identity(sa.make_url("postgresql+psycopg://other@db:5432/queue"))
    assert plain != database_identity(sa.make_url("postgresql://db:5433/queue"))
    assert plain != database_identity(sa.make_url("postgresql://db:5432/other"))
    # A caller's session may be on any database: it is compared, never refused here.
    assert database_identity(sa.make_url("oracle://db/queue")) == "oracle://db:/queue"


def test_only_sqlite_is_a_file_and_one_writer(tmp_path: Path) -> None:
    url = sa.make_url(f"sqlite:///{tmp_path / 'q.db'}")
    sqlite = for_dialect("sqlite")
    assert sqlite.single_writer
    assert sqlite.database_file(url) == str(tmp_path / "q.db")
    for name in SERVERS:
        ops = for_dialect(name)
        assert not ops.single_writer
        assert ops.database_file(sa.make_url(f"{name}://db/q")) is None


def test_same_host_wake_ups_where_the_database_cannot_notify(tmp_path: Path) -> None:
    """SQLite and MariaDB wake this host's workers by a socket, one folder per database;
    PostgreSQL has NOTIFY."""
    sqlite = for_dialect("sqlite")
    assert sqlite.wake_dir(sa.make_url(f"sqlite:///{tmp_path / 'q.db'}")) is not None
    mysql = for_dialect("mysql")
    one = mysql.wake_dir(sa.make_url("mysql+pymysql://root@db:3306/q"))
    assert one is not None
    assert one == mysql.wake_dir(sa.make_url("mysql+pymysql://other@db:3306/q"))
    assert one != mysql.wake_dir(sa.make_url("mysql+pymysql://root@db:3306/other"))
    assert for_dialect("postgresql").wake_dir(sa.make_url("postgresql://db/q")) is None


def test_sqlites_busy_error_is_the_one_sqlite_raises_and_may_pass() -> None:
    error = for_dialect("sqlite").busy_error("by a writer in this process")
    assert isinstance(error, sa.exc.OperationalError) and is_transient(error)
    assert "database is locked (by a writer in this process)" in str(error)


# -- doctor's checks ----------------------------------------------------------------------------


def _server_conn(name: str, version: tuple[int, ...], **dialect: Any) -> Any:
    return SimpleNamespace(
        dialect=SimpleNamespace(name=name, server_version_info=version, **dialect)
    )


def test_a_server_reports_its_version_or_why_it_is_refused() -> None:
    ops = for_dialect("postgresql")
    current, wakes = ops.diagnose(_server_conn("postgresql", (15, 4), driver="psycopg"))
    assert (current.level, current.message) == (OK, "postgresql 15.4 with SKIP LOCKED")
    assert (wakes.level, wakes.message) == (OK, "wake-ups: LISTEN/NOTIFY (driver psycopg)")
    _, polls = ops.diagnose(_server_conn("postgresql", (15, 4), driver="pg8000"))
    assert polls.level == WARN and "only at each poll" in polls.message
    assert polls.fix and "postgresql+psycopg://" in polls.fix
    old, _ = ops.diagnose(_server_conn("postgresql", (9, 4), driver="psycopg2"))
    assert old.level == FAIL and "9.4" in old.message
    assert old.fix == "upgrade the database server"
    (mariadb,) = for_dialect("mysql").diagnose(_server_conn("mysql", (10, 5), is_mariadb=True))
    assert mariadb.level == FAIL and "MariaDB 10.5" in mariadb.message


# -- bulk inserts, on every backend --------------------------------------------------------------


def test_insert_jobs_gives_each_row_its_own_id_in_order(core_store: Store) -> None:
    values = job_values("t", "", EnqueueOptions(), default_max_attempts=3, now=utcnow())
    rows = [{**values, "payload": f'{{"args": [{n}]}}'} for n in range(30)]
    with core_store.write() as conn:
        ids = core_store.ops.insert_jobs(conn, rows)
    assert ids == sorted(ids) and len(set(ids)) == 30
    with core_store.read() as conn:
        stored = dict(conn.execute(sa.select(jobs.c.id, jobs.c.payload)).all())
    assert [stored[i] for i in ids] == [row["payload"] for row in rows]


def test_insert_jobs_writes_each_rows_own_values_and_skips_held_keys(core_store: Store) -> None:
    """Values that differ between rows (times, numbers, keys, text that needs escaping)
    are each written to their own row; a row whose key is held gets ``None``."""
    now = utcnow()
    values = job_values("t", "", EnqueueOptions(), default_max_attempts=3, now=now)
    with core_store.write() as conn:
        (held,) = core_store.ops.insert_jobs(conn, [{**values, "idempotency_key": "held"}])
    texts = ['{"args": ["a \\"quoted\\" \\\\ {brace}, NULL"]}', '{"args": ["ünï ☃ 𝄞"]}', "{}"]
    rows = [
        {
            **values,
            "payload": texts[n % 3],
            "priority": n - 5,
            "run_at": now + timedelta(seconds=n, microseconds=n),
            "idempotency_key": None if n % 4 else ("held" if n == 8 else f"key-{n}"),
        }
        for n in range(12)
    ]
    with core_store.write() as conn:
        ids = core_store.ops.insert_jobs(conn, rows)
    assert ids[8] is None
    new = [job_id for job_id in ids if job_id is not None]
    assert held not in new and new == sorted(new) and len(set(new)) == 11  # in row order
    with core_store.read() as conn:
        stored = {row.id: row for row in conn.execute(sa.select(jobs))}
    for job_id, row in zip(ids, rows, strict=True):
        if job_id is None:
            continue
        found = stored[job_id]
        assert (found.payload, found.priority, found.idempotency_key) == (
            row["payload"],
            row["priority"],
            row["idempotency_key"],
        )
        assert found.run_at == row["run_at"]
    assert stored[held].payload == ""
