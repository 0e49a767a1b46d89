"""Row locks: one way to take them, so every path locks the same way (decision 068)."""

from __future__ import annotations

from typing import TypeVar

from django.db.models import Manager, Model, QuerySet

M = TypeVar("M", bound=Model)


def lock_rows(rows: QuerySet[M] | Manager[M]) -> QuerySet[M]:
    """`rows`, each locked until the transaction ends once it is read (PostgreSQL).

    `FOR NO KEY UPDATE`: it excludes other lockers, but lets in inserts of rows that only
    reference the locked ones (log lines, timeline events, checkpoints). `OF self`: rows joined
    in by `select_related` (a pool, a region, a project) are read, not locked, so jobs that
    share them do not wait for each other."""
    return rows.select_for_update(no_key=True, of=("self",))
