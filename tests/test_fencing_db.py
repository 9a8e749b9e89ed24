"""Fenced database writes: ``fenced_update(token=...)`` on SQLite and on a real
PostgreSQL the tests start (tests/postgres_server.py): the database refuses a write
whose token is older than the last one the row accepted, and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_redislock import LockLost, locks
from django_redislock.exceptions import StaleFencingToken
from tests.fencing_models import Invoice, Unfenced


def add_database(alias: str, entry: dict[str, Any]) -> None:
    """Make *alias* a database of this process (outside pytest-django's test databases)."""
    both = {"default": connections.settings["default"], alias: entry}
    connections.settings[alias] = connections.configure_settings(both)[alias]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_alias(
    request: pytest.FixtureRequest, tmp_path: Path, django_db_blocker: Any
) -> Iterator[str]:
    """A database with the fencing tables: a SQLite file, or the PostgreSQL cluster."""
    alias = f"fencing_{request.param}"
    if request.param == "sqlite":
        entry: dict[str, Any] = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(tmp_path / "f.db"),
        }
    else:
        entry = request.getfixturevalue("postgres").settings()
    add_database(alias, entry)
    with django_db_blocker.unblock():
        with connections[alias].schema_editor() as editor:
            editor.create_model(Invoice)
            editor.create_model(Unfenced)
        try:
            yield alias
        finally:
            with connections[alias].schema_editor() as editor:
                editor.delete_model(Invoice)
                editor.delete_model(Unfenced)
            connections[alias].close()
            del connections[alias]
            del connections.settings[alias]


def test_a_newer_token_writes_an_older_one_is_refused_and_changes_nothing(db_alias: str) -> None:
    rows = Invoice.objects.using(db_alias)
    pk = rows.create(total=1).pk
    row = rows.filter(pk=pk)
    assert row.fenced_update(token=100, total=10) == 1
    assert row.fenced_update(token=100, note="same hold again") == 1  # equal: accepted
    assert row.fenced_update(token=200, total=20) == 1
    with pytest.raises(StaleFencingToken) as refused:
        row.fenced_update(token=150, total=15, note="stale")
    assert isinstance(refused.value, LockLost)
    assert (refused.value.token, refused.value.current) == (150, 200)
    assert refused.value.target == Invoice._meta.db_table
    assert "newer token (200)" in str(refused.value)
    assert rows.values_list("total", "note", "fence").get(pk=pk) == (20, "same hold again", 200)


def test_several_rows_are_written_all_or_none(db_alias: str) -> None:
    rows = Invoice.objects.using(db_alias)
    newer = rows.create(total=1, fence=300)
    fresh = rows.create(total=2)
    both = rows.filter(pk__in=[newer.pk, fresh.pk])
    with pytest.raises(StaleFencingToken, match="1 matched row"):
        both.fenced_update(token=250, total=99)
    assert sorted(rows.values_list("total", "fence")) == [(1, 300), (2, 0)]
    assert both.fenced_update(token=300, total=7) == 2
    assert sorted(rows.values_list("total", "fence")) == [(7, 300), (7, 300)]


def test_no_matched_row_writes_nothing_and_is_no_refusal(db_alias: str) -> None:
    assert Invoice.objects.using(db_alias).filter(pk=12345).fenced_update(token=5, total=1) == 0


def test_with_the_tokens_of_real_holds(db_alias: str, name: str) -> None:
    rows = Invoice.objects.using(db_alias)
    pk = rows.create().pk
    first = locks.lock(name, ttl=30)
    with pytest.raises(LockLost), first as held:
        old = held.fencing_token
        assert old is not None
        locks.force_release(name)  # its lease ran out, say
        with locks.lock(name, owner="successor", ttl=30) as successor:
            assert successor.fencing_token is not None and successor.fencing_token > old
            rows.filter(pk=pk).fenced_update(token=successor.fencing_token, note="successor")
        with pytest.raises(StaleFencingToken):
            rows.filter(pk=pk).fenced_update(token=old, note="zombie")
    assert rows.get(pk=pk).note == "successor"


def test_afenced_update(db_alias: str) -> None:
    rows = Invoice.objects.using(db_alias)
    pk = rows.create().pk

    async def main() -> None:
        assert await rows.filter(pk=pk).afenced_update(token=10, total=3) == 1
        with pytest.raises(StaleFencingToken):
            await rows.filter(pk=pk).afenced_update(token=9, total=4)

    asyncio.run(main())
    assert rows.values_list("total", "fence").get(pk=pk) == (3, 10)


def test_misuse_is_refused_with_a_named_error(db_alias: str) -> None:
    rows = Invoice.objects.using(db_alias)
    with pytest.raises(TypeError, match="token is None"):
        rows.fenced_update(token=None, total=1)
    with pytest.raises(TypeError, match="is an int"):
        rows.fenced_update(token=True, total=1)
    with pytest.raises(ValueError, match="positive"):
        rows.fenced_update(token=-3, total=1)
    with pytest.raises(ValueError, match="leave it out"):
        rows.fenced_update(token=5, fence=9)
    with pytest.raises(ImproperlyConfigured, match="exactly one FencingTokenField"):
        Unfenced.objects.using(db_alias).fenced_update(token=5, total=1)


def test_the_field_deconstructs_as_a_big_integer_without_its_own_defaults() -> None:
    field = Invoice._meta.get_field("fence")
    name, path, args, kwargs = field.deconstruct()
    assert path == "django_redislock.fencing.db.FencingTokenField"
    assert kwargs == {}
    assert field.get_internal_type() == "BigIntegerField"
