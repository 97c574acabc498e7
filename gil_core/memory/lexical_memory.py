"""Memory without a model: character 2–3-gram TF-IDF per task, ranked by cosine.

Its similarity is the TF-IDF cosine of ``char_wb`` 2–3-grams, with IDF fitted on the task's own remembered
texts (refitted lazily after any change). That is its own scale — and it shifts a little as the task's entries
change — so a threshold chosen for an embedding memory does not carry over to this one, nor back.

With a ``path``, each task's entries live in one JSON-lines file under it (named by a hash of the task, so any
task name is safe), replaced atomically on every change (temporary file, fsync, ``os.replace``) under a file
lock; an instance rereads a file another process replaced. Work is local and small, so it runs inline.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from filelock import FileLock
from numpy.typing import NDArray

from gil_core.atomic import atomic_open
from gil_core.errors import MemoryUnavailableError
from gil_core.memory._rules import check_k, check_threshold, latest_per_key, search_results
from gil_core.memory.ports import MemoryChanges, MemoryEntry, Recall

__all__ = ["LexicalMemory"]

_Stamp = tuple[int, int, int] | None  # (inode, mtime ns, size) of a task file; None when it does not exist


class _TaskTexts:
    """One task's entries in insertion order and, once needed, the TF-IDF fitted on their texts."""

    def __init__(self, entries: Iterable[MemoryEntry] = (), stamp: _Stamp = None) -> None:
        self.entries: dict[str, MemoryEntry] = {entry.key: entry for entry in entries}
        self.stamp = stamp
        self._fitted: _TfIdf | None = None  # None: not fitted since the entries last changed

    def upsert(self, entry: MemoryEntry) -> None:
        self.entries.pop(entry.key, None)
        self.entries[entry.key] = entry
        self._fitted = None

    def remove(self, key: str) -> bool:
        self._fitted = None
        return self.entries.pop(key, None) is not None

    def replace(self, entries: Iterable[MemoryEntry]) -> None:
        self.entries = {entry.key: entry for entry in latest_per_key(entries)}
        self._fitted = None

    def nearest(self, text: str, k: int) -> list[MemoryEntry]:
        held = list(self.entries.values())
        if not held or k == 0:
            return []
        if self._fitted is None:
            self._fitted = _TfIdf([entry.text for entry in held])
        return search_results(held, self._fitted.similarities(text), min(k, len(held)))


class _TfIdf:
    """Raw TF-IDF weights (count × smooth IDF) of a task's texts, fitted once per change of its entries.

    Cosine = a·b / sqrt(|a|² |b|²) where every sum is one ``np.add.reduceat`` segment over the same products in
    column order: identical texts get bit-identical similarities (the tie rule holds) and a text's similarity to
    itself is exactly 1.0. Unlike ``transform``, which drops n-grams the task never saw (so "cancel order 123"
    would equal "cancel order"), an unseen n-gram still counts toward the query's length, weighted by the IDF of
    a term in no text, ln(1 + n) + 1: extra words lower the similarity instead of vanishing.
    """

    def __init__(self, texts: list[str]) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer  # type: ignore[import-untyped]

        vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 3), norm=None, smooth_idf=True)
        self.count = len(texts)
        self._analyze: Callable[[str], list[str]] = vectorizer.build_analyzer()
        try:
            rows = vectorizer.fit_transform(texts).tocsr()
        except ValueError:  # "empty vocabulary": no text has a single n-gram
            self._vocabulary: dict[str, int] = {}
            self._idf: NDArray[np.float64] = np.zeros(0)
            self._indptr: NDArray[np.int64] = np.zeros(self.count + 1, dtype=np.int64)
            self._indices: NDArray[np.int64] = np.zeros(0, dtype=np.int64)
            self._weights: NDArray[np.float64] = np.zeros(0)
        else:
            rows.sort_indices()
            self._vocabulary = vectorizer.vocabulary_
            self._idf = np.asarray(vectorizer.idf_, dtype=np.float64)
            self._indptr = np.asarray(rows.indptr, dtype=np.int64)
            self._indices = np.asarray(rows.indices, dtype=np.int64)
            self._weights = np.asarray(rows.data, dtype=np.float64)
        self._squared_lengths = self._row_sums(self._weights * self._weights)

    def similarities(self, text: str) -> NDArray[np.float64]:
        """Cosine of ``text`` with each fitted text, in fitting order."""
        unseen_idf = math.log(1.0 + self.count) + 1.0
        known: dict[int, float] = {}
        unseen_squared = 0.0
        for gram, times in Counter(self._analyze(text)).items():
            column = self._vocabulary.get(gram)
            if column is None:
                unseen_squared += (times * unseen_idf) ** 2
            else:
                known[column] = times * float(self._idf[column])
        query = np.zeros(len(self._idf))
        query[list(known)] = list(known.values())
        in_order = query[sorted(known)]
        known_squared = float(np.add.reduceat(in_order * in_order, [0])[0]) if known else 0.0
        scale = np.sqrt(self._squared_lengths * (known_squared + unseen_squared))
        products = self._row_sums(self._weights * query[self._indices])
        similarities = np.divide(products, scale, out=np.zeros(self.count), where=scale > 0.0)
        return np.clip(similarities, -1.0, 1.0)

    def _row_sums(self, values: NDArray[np.float64]) -> NDArray[np.float64]:
        """Each row's sum of ``values`` (laid out like the weights); 0 for a row without n-grams."""
        sums = np.zeros(self.count)
        filled = np.diff(self._indptr) > 0
        if filled.any():
            # Segments run from one filled row's start to the next one's: exactly that row's values.
            sums[filled] = np.add.reduceat(values, self._indptr[:-1][filled])
        return sums


class LexicalMemory:
    """``Memory`` by character n-gram TF-IDF cosine: no model, no call. In-process only when ``path`` is None."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._path = Path(path) if path is not None else None
        self._tasks: dict[str, _TaskTexts] = {}

    def __repr__(self) -> str:
        return f"LexicalMemory({str(self._path) if self._path else None!r})"

    async def lookup(self, task: str, text: str, *, threshold: float) -> Recall | None:
        check_threshold(threshold)
        found = await self.nearest(task, text, 1)
        return Recall.from_nearest(found[0], threshold=threshold) if found else None

    async def nearest(self, task: str, text: str, k: int) -> list[MemoryEntry]:
        return self._task(task).nearest(text, check_k(k))

    async def remember(self, task: str, key: str, text: str, answer: str) -> None:
        with self._changing(task) as state:
            state.upsert(MemoryEntry(key=key, text=text, answer=answer))

    async def forget(self, task: str, key: str) -> None:
        with self._changing(task) as state:
            state.remove(key)

    async def change(self, task: str, changes: MemoryChanges) -> None:
        if not len(changes):
            return
        with self._changing(task) as state:
            for key in changes.forgotten:
                state.remove(key)
            for entry in changes.entries:
                state.upsert(entry)

    async def rebuild(self, task: str, entries: Iterable[MemoryEntry]) -> None:
        with self._changing(task) as state:
            state.replace(entries)

    async def entries(self, task: str) -> list[MemoryEntry]:
        return list(self._task(task).entries.values())

    # -- files ---------------------------------------------------------------------------------------------

    def _task(self, task: str) -> _TaskTexts:
        """``task``'s entries, reread when another writer replaced its file since we last read it."""
        state = self._tasks.get(task)
        if self._path is None:
            return state if state is not None else self._tasks.setdefault(task, _TaskTexts())
        file = _task_file(self._path, task)
        with self._io_errors(task, f"read {file}"):
            stamp = _stamp(file)
            if state is None or state.stamp != stamp:
                state = self._tasks[task] = _TaskTexts(_read_entries(file, task), stamp)
        return state

    @contextmanager
    def _changing(self, task: str) -> Iterator[_TaskTexts]:
        """The task's current entries to change; with a path, the change is written before returning."""
        root = self._path
        if root is None:
            yield self._task(task)
            return
        file = _task_file(root, task)
        with self._io_errors(task, f"lock {file}"):
            root.mkdir(parents=True, exist_ok=True)
            lock = FileLock(f"{file}.lock")
            lock.acquire()
        try:
            state = self._task(task)
            before = list(state.entries.values())
            yield state
            if list(state.entries.values()) != before:
                previous = state.stamp[1] if state.stamp is not None else 0
                try:
                    with self._io_errors(task, f"write {file}"):
                        _write_entries(
                            file, task, state.entries.values(), modified_ns=max(time.time_ns(), previous + 1)
                        )
                        state.stamp = _stamp(file)
                except MemoryUnavailableError:
                    self._tasks.pop(task, None)  # the file still holds the previous version: reread it
                    raise
        finally:
            lock.release()

    @contextmanager
    def _io_errors(self, task: str, what: str) -> Iterator[None]:
        try:
            yield
        except (OSError, ValueError, KeyError) as exc:
            raise MemoryUnavailableError(f"cannot {what} ({type(exc).__name__}: {exc})", task=task) from exc


def _task_file(root: Path, task: str) -> Path:
    """The file of ``task``: named by a hash, so no task name can reach another's file or leave ``root``."""
    digest = hashlib.sha256(task.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return root / f"{digest}.jsonl"


def _stamp(file: Path) -> _Stamp:
    try:
        status = file.stat()
    except FileNotFoundError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


def _read_entries(file: Path, task: str) -> list[MemoryEntry]:
    if not file.exists():
        return []
    entries: list[MemoryEntry] = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        row = json.loads(line)
        if row.get("task") != task:
            raise ValueError(f"{file}:{number} belongs to task {row.get('task')!r}, not {task!r}")
        entries.append(MemoryEntry(key=row["key"], text=row["text"], answer=row["answer"]))
    return entries


def _write_entries(file: Path, task: str, entries: Iterable[MemoryEntry], *, modified_ns: int) -> None:
    """Replace ``file`` atomically: a reader sees the old file or the new one, never half of one.

    ``modified_ns`` becomes its mtime: later than the version it replaces, so a reader's stamp never matches a
    newer version (an inode can be reused, and two writes can share a clock tick and a size).
    """
    rows = ({"task": task, "key": e.key, "text": e.text, "answer": e.answer} for e in entries)
    with atomic_open(file, modified_ns=modified_ns) as handle:
        handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
