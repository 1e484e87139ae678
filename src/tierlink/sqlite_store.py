"""Opening the SQLite files the control plane's stores keep (one file may hold several).

Every store opens its connection the same way: usable from the store's threads (the store
serialises calls with its own lock), WAL journal, ``synchronous=NORMAL`` (a commit survives a
crash of the process; a power loss may undo the last ones), a 2 s busy timeout for the other
stores on the same file, and its tables created when missing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager


def open_store(path: str, schema: Sequence[str], failure: Callable[[str], Exception],
               what: str) -> sqlite3.Connection:
    """A prepared connection to ``path``; ``failure(message)`` builds the error raised when
    the file cannot be opened or prepared (each store maps it into its part of the tree)."""
    try:
        conn = sqlite3.connect(path, check_same_thread=False)
    except sqlite3.Error as exc:
        raise failure(f"cannot open the {what} {path}: {exc}") from exc
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=2000")
        with conn:
            for statement in schema:
                conn.execute(statement)
    except sqlite3.Error as exc:
        conn.close()
        raise failure(f"cannot prepare the {what} {path}: {exc}") from exc
    return conn


@contextmanager
def write_transaction(conn: sqlite3.Connection, sync: str = "FULL") -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction committed with ``PRAGMA synchronous=<sync>``
    (``FULL``: durable before the caller answers anyone); rolled back on any exception."""
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def mapped_errors(failure: Callable[[str], Exception], what: str) -> Iterator[None]:
    """Turn a ``sqlite3.Error`` inside the block into ``failure(f"{what}: {detail}")`` (the
    store's own error, with its hint), chained to the original."""
    try:
        yield
    except sqlite3.Error as exc:
        raise failure(f"{what}: {exc}") from exc
