"""The row types of the store's ``SELECT *`` queries against the migrated schema: one field per column,
in the table's order (the order psycopg's rows are built in without naming each field), and ``None``
allowed exactly where the column is nullable."""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING

import psycopg
import pytest

from api import rows
from api.runner.run_spec import Q as RUNNER_QUERIES
from api.webhooks import rows as webhook_rows
from runplane.dbt.context import ContextRow

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

TABLE_ROWS: list[tuple[str, type[DataclassInstance]]] = [
    ("jobs", rows.Job),
    ("runs", rows.Run),
    ("run_steps", rows.RunStep),
    ("projects", rows.Project),
    ("environments", rows.Environment),
    ("repositories", rows.Repository),
    ("connections", rows.WarehouseConnection),
    ("credentials", rows.Credentials),
    ("job_completion_triggers", rows.CompletionTrigger),
    ("webhook_subscriptions", webhook_rows.Subscription),
    ("git_webhooks", webhook_rows.GitWebhook),
]


def _columns(db: psycopg.Connection[tuple[object, ...]], table: str) -> list[tuple[str, bool]]:
    found = db.execute(
        "SELECT column_name, is_nullable = 'YES' FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [(str(name), bool(nullable)) for name, nullable in found]


def _allows_none(hint: object) -> bool:
    return type(None) in typing.get_args(hint)


@pytest.mark.parametrize(("table", "row"), TABLE_ROWS, ids=[table for table, _ in TABLE_ROWS])
def test_a_row_type_is_its_table(
    db: psycopg.Connection[tuple[object, ...]], table: str, row: type[DataclassInstance]
) -> None:
    hints = typing.get_type_hints(row)
    fields = [(f.name, _allows_none(hints[f.name])) for f in dataclasses.fields(row)]
    assert fields == _columns(db, table)


def test_the_dbt_context_row_is_its_query(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """``runplane.dbt`` cannot read the API's query: its row type is held to the query's columns here."""
    cur = db.execute(RUNNER_QUERIES["dbt_context"], {"run_id": -1})
    assert [column.name for column in cur.description or ()] == [f.name for f in dataclasses.fields(ContextRow)]
