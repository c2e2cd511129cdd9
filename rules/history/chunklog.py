"""Which chunks of an import are done, kept in the usage store's file, so an import that stopped (an error, Ctrl-C)
goes on where it stopped when run again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS import_chunks (
    source TEXT NOT NULL, cluster TEXT NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL,
    done_at REAL NOT NULL, PRIMARY KEY (source, cluster, start, "end")
) WITHOUT ROWID;
"""


class ChunkLog:
    """`source` names what was imported (`prometheus <url> <selector> step=60`): another source, or the same
    one read differently, starts again."""

    def __init__(self, path: Path | str) -> None:
        self._db = sqlite3.connect(str(path), timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ChunkLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def done(self, source: str, cluster: str) -> set[tuple[int, int]]:
        rows = self._db.execute('SELECT start, "end" FROM import_chunks WHERE source = ? AND cluster = ?',
                                (source, cluster))
        return {(int(a), int(b)) for a, b in rows}

    def mark(self, source: str, cluster: str, start: int, end: int, at: float) -> None:
        with self._db:
            self._db.execute('INSERT OR REPLACE INTO import_chunks (source, cluster, start, "end", done_at) '
                             "VALUES (?, ?, ?, ?, ?)", (source, cluster, start, end, at))
