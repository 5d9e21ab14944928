"""Writing the trajectory log off the training thread, in order, one step at a time."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lit_agentrl.viewer.records import samples_text, to_json_line


class BackgroundWriter:
    """Runs write jobs on one background thread, in submission order.

    At most ``max_pending`` jobs wait: a submit first waits for the older ones, so a step's lines are on disk before
    the next step's are submitted (a SIGKILL loses at most the step being written). An error in a job is raised by
    the next :meth:`submit` or :meth:`wait`.
    """

    def __init__(self, max_pending: int = 1) -> None:
        self.max_pending = max_pending
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajectory-log")
        self._pending: deque[Future[None]] = deque()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        while self._pending and (len(self._pending) >= self.max_pending or self._pending[0].done()):
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(fn, *args))

    def wait(self) -> None:
        """Block until every submitted job has run."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


def append_jsonl(
    path: Path, records: Sequence[Mapping[str, Any]], pieces: Callable[[list[int]], list[str]] | None
) -> None:
    """Append the records as one write; closing the file hands it to the OS (it survives the process's death)."""
    text = "".join(to_json_line(r, pieces) for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def write_samples_text(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(samples_text(records), encoding="utf-8")
