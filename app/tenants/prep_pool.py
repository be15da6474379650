"""The CPU work of preparing requests (rendering a template, compiling a grammar, tokenizing a prompt, decoding an
image) on a few threads of its own, shared fairly between keys.

Why not the event loop's default executor: it is one first-come queue for the whole process, so one key sending
requests that each take a thread for long fills every thread, and every other key's plain request then waits
past its deadline. Here each key (a request's tenant: its key's name, "" without keys) has a queue of its own;
a free thread takes the next job from the keys in turn, and no key holds more than `per_key` threads at once.
Batch work (a batch job's lines, `low=True`) has queues of its own, served only when no interactive job can take
the thread: a batch's lines being prepared never make an interactive request's preparation wait for a thread.
A job whose caller stopped waiting (its deadline passed, its client left) before a thread took it never runs.

A job that has started cannot be stopped from outside (Python threads cannot be killed), so what runs here must
be bounded by construction: every preparation step is linear in its input's size, within the request's limits
(docs/api.md, Limits). A long-running step may ask `cancelled()` and give up once nobody waits for it."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_current = threading.local()


def cancelled() -> bool:
    """In a job of a pool: whether its caller stopped waiting for it (its result will be thrown away)."""
    job = getattr(_current, "job", None)
    return job is not None and job.abandoned


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    tenant: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    started: bool = False
    abandoned: bool = False


@dataclass
class _Tenant:
    queue: deque[_Job] = field(default_factory=deque)
    running: int = 0
    low: bool = False  # a key's batch work: served after every interactive job that can run


class PoolFull(Exception):
    """More jobs wait than the pool's `max_waiting`: the server is busy."""


class PreparationPool:
    """`threads` threads, started on first use; `per_key`: the most of them one key holds at once (default: half,
    rounded up, so that another key always finds one); `max_waiting`: the most jobs held over all keys besides
    one per thread (None: no bound; the callers' deadlines bound the wait)."""

    def __init__(self, name: str, threads: int = 4, per_key: int | None = None,
                 max_waiting: int | None = None) -> None:
        self.name = name
        self.threads = threads
        self.per_key = per_key if per_key is not None else max(1, -(-threads // 2))
        self.max_waiting = max_waiting
        self.waiting = 0
        self._cv = threading.Condition()
        self._tenants: dict[str, _Tenant] = {}
        self._turns: deque[str] = deque()  # keys with queued jobs, the next to be served first
        self._low_turns: deque[str] = deque()  # the same for batch work, served when no job of _turns can run
        self._workers: list[threading.Thread] = []
        self.busy = 0

    async def run(self, tenant: str, fn: Callable[..., T], *args: Any, low: bool = False) -> T:
        """`fn(*args)` on one of the pool's threads, in `tenant`'s turn (`low`: batch work, after interactive jobs).
        Cancelling the caller (asyncio.timeout, wait_for, a client gone) takes a job that has not started out of its
        queue, and marks a running one `cancelled()`; its result is then dropped."""
        job = self.submit(tenant, fn, *args, low=low)
        try:
            return await job.future
        except asyncio.CancelledError:
            self.cancel(job)
            raise

    def submit(self, tenant: str, fn: Callable[..., T], *args: Any, low: bool = False) -> _Job:
        """`fn(*args)` queued in `tenant`'s turn (on the running event loop): await its `future`; `cancel` it when
        no longer waited for. PoolFull when `max_waiting` jobs wait already."""
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, _LOW + tenant if low else tenant, loop, loop.create_future())
        tenant = job.tenant
        with self._cv:
            if self.max_waiting is not None and self.waiting + self.busy >= self.threads + self.max_waiting:
                raise PoolFull(self.name)
            self._start_workers()
            entry = self._tenants.setdefault(tenant, _Tenant(low=low))
            entry.queue.append(job)
            self.waiting += 1
            if len(entry.queue) == 1:
                (self._low_turns if entry.low else self._turns).append(tenant)
            self._cv.notify()
        return job

    def cancel(self, job: _Job) -> bool:
        """Nobody waits for `job` any more: out of its queue if it has not started (it never runs), else marked
        `cancelled()` and its result dropped. Whether it had started."""
        with self._cv:
            job.abandoned = True
            if not job.started:
                entry = self._tenants.get(job.tenant)
                if entry is not None and job in entry.queue:
                    entry.queue.remove(job)
                    self.waiting -= 1
                    self._forget(job.tenant, entry)
            return job.started

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {"threads": len(self._workers), "busy": self.busy,
                    "queued": {t: len(e.queue) for t, e in self._tenants.items() if e.queue}}

    def _start_workers(self) -> None:
        while len(self._workers) < self.threads:
            worker = threading.Thread(target=self._work, name=f"{self.name}-{len(self._workers)}", daemon=True)
            self._workers.append(worker)
            worker.start()

    def _forget(self, tenant: str, entry: _Tenant) -> None:
        """Under the lock: a key with nothing queued leaves the turns (and the table, once nothing of it runs)."""
        if not entry.queue:
            try:
                (self._low_turns if entry.low else self._turns).remove(tenant)
            except ValueError:
                pass
            if not entry.running:
                self._tenants.pop(tenant, None)

    def _next(self) -> _Job | None:
        """Under the lock: the first job of the first key in turn that may take another thread, interactive work
        before batch work; that key goes to the back of its turns."""
        for turns in (self._turns, self._low_turns):
            for _ in range(len(turns)):
                tenant = turns[0]
                turns.rotate(-1)
                entry = self._tenants[tenant]
                if entry.running < self.per_key:
                    job = entry.queue.popleft()
                    entry.running += 1
                    self.waiting -= 1
                    if not entry.queue:
                        turns.remove(tenant)
                    return job
        return None

    def _work(self) -> None:
        while True:
            with self._cv:
                job = self._next()
                while job is None:
                    self._cv.wait()
                    job = self._next()
                job.started = True
                self.busy += 1
            _current.job = job
            try:
                result, error = job.fn(*job.args), None
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                result, error = None, exc
            finally:
                _current.job = None
                with self._cv:
                    self.busy -= 1
                    entry = self._tenants[job.tenant]
                    entry.running -= 1
                    if not entry.running and not entry.queue:
                        self._tenants.pop(job.tenant, None)
                    self._cv.notify()  # a key at its share may take a thread again
            if not job.abandoned:
                try:
                    job.loop.call_soon_threadsafe(_settle, job.future, result, error)
                except RuntimeError:  # the caller's loop is closed: nobody waits
                    pass


_LOW = "\x00batch:"  # a key's batch work queues under this prefix (no key's name holds a NUL)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


PREPARATION = PreparationPool("llamaray-prepare")
"""This process's pool for preparing requests: planning (templates, grammars), a model's tokenizing and samplers."""
