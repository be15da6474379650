"""The batch runner's logic, in plain Python (deployments/batch_runner.py runs it in a Ray actor of its own and
gives it `respond`: the same processing an HTTP request reaches, over the graph's handles).

For each batch not yet ended (the store's `open/` markers, read at start and every RESCAN_S, and each batch
submitted since): its lines are checked (validation.py) unless that was done, then sent in their plan's order (by
prompt prefix) through `respond(request, caller)` with the owner's Caller marked as batch work, at most a model's
window of lines in flight per model (`ModelWindow`: narrowed when the model sends lines back for interactive work,
widened again line by line). A line that fails is sent again by the rules of retry.py. Results are written in
chunks (results.py), each chunk at once; the batch's counts follow each chunk. A line is sent only if no chunk
holds it, so a runner restarted anywhere (the actor, a replica, the whole app) goes on where the chunks end,
each line answered once.

A cancel or the end of the completion window stops the sending (lines in flight are cancelled: their
generations stop), keeps the lines answered, and answers the others as cancelled or expired; then the batch is
finalised: OpenAI's output and error files are written (ids made from the batch's, so a finalisation done again
writes the same files) and the batch ends."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..api import strict_json
from ..api.errors import APIError, as_api_error, service_unavailable
from ..config.app_args import BatchConfig
from ..config.spec import ModelSpec
from ..generation.caller import Caller
from ..tenants.policies import KeyPolicy
from .endpoints import endpoint_of
from .ids import FILE_PREFIX, LOCAL_OWNER, derived_id
from .records import (
    BatchRecord, FileRecord, batch_dir, batch_record_path, file_data_path, file_record_path, open_marker,
)
from .results import CANCELLED, ERRORED, EXPIRED, SUCCEEDED, LineResult, ResultChunks, usage_of
from .retry import retry_of
from .store import BatchStore
from .validation import LineCheck, LineError, Plan, PlannedLine, validate

log = logging.getLogger("llamaray.batches")

Respond = Callable[[Any, Caller], Awaitable[Any]]
"""The processing's `respond(request, caller)`: the whole answer of one request (a body, or one with headers)."""

RESCAN_S = 10.0  # how often the store's open batches are looked for (those submitted while the runner was away)
READ_AHEAD_LINES = 32  # lines read from the input in one go, per model
READ_AHEAD_BYTES = 8 << 20


class BatchEvents(Protocol):
    """What the runner tells metrics: lines of a model queued, running, and ended by outcome."""

    def queued(self, model: str, delta: int) -> None: ...

    def running(self, model: str, delta: int) -> None: ...

    def ended(self, model: str, outcome: str) -> None: ...


class NoEvents:
    def queued(self, model: str, delta: int) -> None:
        pass

    def running(self, model: str, delta: int) -> None:
        pass

    def ended(self, model: str, outcome: str) -> None:
        pass


class KeyRevoked(Exception):
    """The batch's key is no longer in force: its lines are not run."""


PolicyOf = Callable[[BatchRecord], KeyPolicy | None]
"""The policy a batch's lines run under now (its key's, re-read as the keys file changes); KeyRevoked for a key
taken out of it."""


class ModelWindow:
    """A model's batch lines in flight: at most `size`, which starts at `limit`, halves when the model sends a line
    back for interactive work, and grows by one per line answered, up to `limit` again."""

    def __init__(self, limit: int) -> None:
        self.limit = self.size = max(1, limit)
        self.in_flight = 0
        self._cond = asyncio.Condition()

    async def acquire(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.in_flight < self.size)
            self.in_flight += 1

    def release(self, yielded: bool) -> None:
        self.in_flight -= 1
        if yielded:
            self.size = max(1, self.size // 2)
        elif self.size < self.limit:
            self.size += 1
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()


@dataclass
class _Job:
    owner: str
    batch_id: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class BatchRunner:
    """Runs every open batch of `store`. `lines_per_model`: each model's window limit (default: its n_seq_max)."""

    def __init__(self, store: BatchStore, config: BatchConfig, specs: list[ModelSpec], respond: Respond,
                 policy_of: PolicyOf, *, max_line_bytes: int, max_messages: int = 1024,
                 lines_per_model: Mapping[str, int] | None = None, events: BatchEvents | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.models = {s.id: s for s in specs}
        self.respond = respond
        self.policy_of = policy_of
        self.max_line_bytes = max_line_bytes
        self.max_messages = max_messages
        self.lines_per_model = dict(lines_per_model or {})
        self.events = events or NoEvents()
        self.clock = clock
        self.jobs: dict[str, _Job] = {}
        self.windows: dict[str, ModelWindow] = {}

    # -- what the deployments call ---------------------------------------------------------------------------------
    async def serve(self) -> None:
        """Forever: the store's open batches resumed, looked for again every RESCAN_S."""
        while True:
            try:
                await self.rescan()
            except Exception:  # noqa: BLE001 - the store unreachable for a while: the next look
                log.exception("batch runner: could not read the store's open batches")
            await asyncio.sleep(RESCAN_S)

    async def rescan(self) -> None:
        for name in await asyncio.to_thread(self.store.names, "open"):
            owner, _, batch_id = name.partition(".")
            self.submit(owner, batch_id)

    def submit(self, owner: str, batch_id: str) -> None:
        """Run the batch (nothing if it runs already)."""
        if batch_id in self.jobs:
            return
        job = _Job(owner, batch_id)
        self.jobs[batch_id] = job
        job.task = asyncio.ensure_future(self._run(job))
        job.task.add_done_callback(lambda _: self.jobs.pop(batch_id, None))

    def cancel(self, owner: str, batch_id: str) -> None:
        """Stop the batch now (its cancel is in the store already, for a runner that starts it later)."""
        job = self.jobs.get(batch_id)
        if job is not None:
            job.stop.set()
        else:
            self.submit(owner, batch_id)

    def window(self, model: str) -> ModelWindow:
        if model not in self.windows:
            spec = self.models.get(model)
            limit = self.lines_per_model.get(model) or self.config.lines_per_model or (spec.n_seq_max if spec else 1)
            self.windows[model] = ModelWindow(limit)
        return self.windows[model]

    async def close(self) -> None:
        for job in list(self.jobs.values()):
            if job.task is not None:
                job.task.cancel()

    # -- one batch -----------------------------------------------------------------------------------------------
    async def _run(self, job: _Job) -> None:
        try:
            record = await self._load(job.owner, job.batch_id)
            if record is None or record.ended:
                await asyncio.to_thread(self.store.delete, open_marker(job.owner, job.batch_id))
                return
            await _Batch(self, job, record).run()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the batch stays open; the next rescan tries it again
            log.exception("batch %s: the runner failed; it is tried again within %.0f s", job.batch_id, RESCAN_S)

    async def _load(self, owner: str, batch_id: str) -> BatchRecord | None:
        blob = await asyncio.to_thread(self.store.get, batch_record_path(owner, batch_id))
        return BatchRecord.from_json(blob) if blob is not None else None

    async def save(self, record: BatchRecord) -> None:
        await asyncio.to_thread(self.store.put, batch_record_path(record.owner, record.id), record.to_json())


def input_path(record: BatchRecord) -> str:
    if record.input_file_id is not None:
        return file_data_path(record.owner, record.input_file_id)
    return f"{batch_dir(record.owner, record.id)}/input.jsonl"


def _plan_path(record: BatchRecord) -> str:
    return f"{batch_dir(record.owner, record.id)}/index.json"


def _read_lines(store: BatchStore, path: str, group: list[PlannedLine]) -> list[tuple[PlannedLine, bytes]]:
    """`group`'s lines from the input, each at its offset (read in file order, handed back in the group's)."""
    found: dict[int, bytes] = {}
    with store.reader(path) as f:
        for planned in sorted(group, key=lambda p: p.offset):
            f.seek(planned.offset)
            data = f.read(planned.length)
            found[planned.line] = data[:-1] if data.endswith(b"\r") else data
    return [(p, found[p.line]) for p in group]


class _Batch:
    """One batch's run (validation, the lines, its end) by `runner`."""

    def __init__(self, runner: BatchRunner, job: _Job, record: BatchRecord) -> None:
        self.runner, self.job, self.record = runner, job, record
        self.store = runner.store
        self.endpoint = endpoint_of(record.endpoint)
        self.chunks = ResultChunks(self.store, record.owner, record.id)
        self.pending: list[LineResult] = []
        self.answered: dict[int, tuple[str, tuple[int, int, int]]] = {}
        self.flushing = asyncio.Lock()
        self.last_flush = time.monotonic()

    async def run(self) -> None:
        record = self.record
        if await asyncio.to_thread(self.store.exists, f"{batch_dir(record.owner, record.id)}/cancel"):
            self.job.stop.set()
        if record.status == "validating" and self.job.stop.is_set():
            plan = Plan()  # cancelled before its lines were read: nothing to answer
        elif record.status == "validating":
            plan = await self._validate()
            if plan is None:
                return
        else:
            plan = Plan.from_json(await asyncio.to_thread(self.store.get, _plan_path(record)) or b"")
        answered = await asyncio.to_thread(self.chunks.answered)
        self.answered = dict(answered.lines)
        if record.status in ("validating", "in_progress") and not self.job.stop.is_set():
            if record.status != "in_progress":
                record.set_status("in_progress", self.runner.clock())
                await self.runner.save(record)
            await self._refused_lines(plan)
            await self._send(plan)
        ending = self._ending()
        if ending == "completed" and any(p.line not in self.answered for p in plan.lines):
            # Sending stopped short (the store or the input unreadable for a while): the batch stays open and the
            # next rescan goes on from the chunks written.
            raise RuntimeError(f"{sum(p.line not in self.answered for p in plan.lines)} lines are not answered yet")
        await self._finish_unanswered(plan, ending)
        await self._finalize(ending)

    def _ending(self) -> str:
        if self.record.status == "finalizing" and self.record.ending:
            return self.record.ending
        if self.job.stop.is_set():
            return "cancelled"
        if self.runner.clock() >= self.record.expires_at:
            return "expired"
        return "completed"

    # -- checking the lines ------------------------------------------------------------------------------------
    async def _validate(self) -> Plan | None:
        record, runner = self.record, self.runner
        try:
            policy = runner.policy_of(record)
        except KeyRevoked:
            return await self._fail([{"code": "invalid_api_key", "message": "The key that made this batch is no "
                                      "longer accepted.", "param": None, "line": None}])
        check = LineCheck(self.endpoint, runner.models, policy, runner.max_messages)
        path = input_path(record)
        try:
            plan = await asyncio.to_thread(
                lambda: validate(self.store.blocks(path), check, max_lines=runner.config.max_lines,
                                 max_line_bytes=runner.max_line_bytes))
        except FileNotFoundError:
            return await self._fail([{"code": "input_file_not_found", "message": "The batch's input file is gone.",
                                      "param": "input_file_id", "line": None}])
        record.total = plan.total
        record.model = plan.models[0] if len(plan.models) == 1 else None
        if record.protocol == "openai" and plan.errors:
            # OpenAI's rule: one line that cannot run fails the batch, before any runs; the lines are named.
            return await self._fail([e.to_openai() for e in plan.errors])
        await asyncio.to_thread(self.store.put, _plan_path(record), plan.to_json())
        record.set_status("in_progress", runner.clock())
        await runner.save(record)
        return plan

    async def _fail(self, errors: list[dict[str, Any]]) -> None:
        record = self.record
        record.errors = errors
        record.set_status("failed", self.runner.clock())
        await self.runner.save(record)
        await asyncio.to_thread(self.store.delete, open_marker(record.owner, record.id))
        return None

    async def _refused_lines(self, plan: Plan) -> None:
        """A Message Batch's requests that failed their checks, answered as errored (once)."""
        for error in plan.errors:
            if error.custom_id is not None and error.line not in self.answered:
                status, body = self.endpoint.errors(APIError(error.message, status=error.status, param=error.param,
                                                             code=error.code, type="invalid_request_error"))
                await self._done(LineResult(error.line, error.custom_id, ERRORED, status, body,
                                            request_id=uuid.uuid4().hex), model=None)
        await self._flush()

    # -- sending the lines ---------------------------------------------------------------------------------------
    async def _send(self, plan: Plan) -> None:
        by_model: dict[str, list[PlannedLine]] = {}
        for planned in plan.order():
            if planned.line not in self.answered:
                by_model.setdefault(planned.model, []).append(planned)
        if not by_model:
            return
        for model, lines in by_model.items():
            self.runner.events.queued(model, len(lines))
        in_flight: set[asyncio.Task] = set()
        feeders = [asyncio.ensure_future(self._feed(model, lines, in_flight)) for model, lines in by_model.items()]
        ticker = asyncio.ensure_future(self._tick())
        remaining = max(0.0, self.record.expires_at - self.runner.clock())
        stop = asyncio.ensure_future(self.job.stop.wait())
        everything = asyncio.ensure_future(self._all(feeders, in_flight))
        try:
            await asyncio.wait({stop, everything}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*feeders, *in_flight, stop, everything, ticker):
                task.cancel()
            await asyncio.gather(*feeders, *in_flight, everything, ticker, return_exceptions=True)
            for model, lines in by_model.items():
                left = sum(p.line not in self.answered for p in lines)
                self.runner.events.queued(model, -left)
            await self._flush()

    async def _all(self, feeders: list[asyncio.Task], in_flight: set[asyncio.Task]) -> None:
        await asyncio.gather(*feeders)
        while in_flight:
            await asyncio.gather(*list(in_flight), return_exceptions=True)

    async def _feed(self, model: str, lines: list[PlannedLine], in_flight: set[asyncio.Task]) -> None:
        """`lines` of one model sent in order, within its window; read ahead from the input a group at a time."""
        window, path = self.runner.window(model), input_path(self.record)
        start = 0
        while start < len(lines):
            group, size = [], 0
            while start < len(lines) and len(group) < READ_AHEAD_LINES and size < READ_AHEAD_BYTES:
                group.append(lines[start])
                size += lines[start].length
                start += 1
            for planned, data in await asyncio.to_thread(_read_lines, self.store, path, group):
                await window.acquire()
                task = asyncio.ensure_future(self._line(model, planned, data, window))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)

    async def _line(self, model: str, planned: PlannedLine, data: bytes, window: ModelWindow) -> None:
        """One line, tried until its answer is final, its window held while it is sent (the caller acquired it)."""
        runner, events = self.runner, self.runner.events
        events.queued(model, -1)
        events.running(model, 1)
        held = True
        try:
            custom_id, request, _ = LineCheck(self.endpoint, runner.models, runner.policy_of(self.record),
                                              runner.max_messages).read(planned.line, data)
            caller = Caller(key_id=None if self.record.owner == LOCAL_OWNER else self.record.owner,
                            policy=runner.policy_of(self.record), batch=True)
            attempt = yields = 0
            while True:
                request_id = uuid.uuid4().hex
                try:
                    answer = await runner.respond(request, caller)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure is a status the rules of retry.py read
                    error = as_api_error(exc) or service_unavailable(f"The line could not be sent: {exc!r}")
                    retry = retry_of(error, attempt, runner.config.max_attempts, yields)
                    window.release(yielded=retry is not None and retry.yielded)
                    held = False
                    if retry is None:
                        status, body = self.endpoint.errors(error)
                        result = LineResult(planned.line, custom_id, ERRORED, status, body, request_id=request_id)
                        break
                    attempt += retry.counted
                    yields += retry.yielded
                    await asyncio.sleep(retry.delay_s)
                    await window.acquire()
                    held = True
                    continue
                body = answer if isinstance(answer, dict) else answer.body  # WithHeaders: the key's limits' headers
                window.release(yielded=False)
                held = False
                result = LineResult(planned.line, custom_id, SUCCEEDED, 200, body, request_id=request_id,
                                    usage=usage_of(body))
                break
        except (LineError, KeyRevoked) as exc:
            # The line was checked when the batch began: what changed since is the key (its models, or itself).
            if held:
                window.release(yielded=False)
                held = False
            error = (APIError(exc.message, status=exc.status, param=exc.param, code=exc.code,
                              type="invalid_request_error") if isinstance(exc, LineError) else
                     APIError("The key that made this batch is no longer accepted.", status=401,
                              code="invalid_api_key", type="invalid_request_error"))
            status, body = self.endpoint.errors(error)
            custom_id = getattr(exc, "custom_id", None) or _custom_id(data)
            result = LineResult(planned.line, custom_id, ERRORED, status, body, request_id=uuid.uuid4().hex)
        except BaseException:
            if held:
                window.release(yielded=False)
            raise
        finally:
            events.running(model, -1)
        await self._done(result, model)

    async def _done(self, result: LineResult, model: str | None) -> None:
        self.pending.append(result)
        if model is not None:
            self.runner.events.ended(model, result.outcome)
        if len(self.pending) >= self.runner.config.chunk_lines:
            await self._flush()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.runner.config.chunk_s)
            await self._flush()

    async def _flush(self) -> None:
        """The results held written as one chunk, then the batch's counts (shielded: a cancel waits for it)."""
        await asyncio.shield(self._flush_now())

    async def _flush_now(self) -> None:
        async with self.flushing:
            if not self.pending:
                return
            results, self.pending = self.pending, []
            await asyncio.to_thread(self.chunks.write, results)
            for r in results:
                self.answered.setdefault(r.line, (r.outcome, r.usage))
            self._count()
            await self.runner.save(self.record)

    def _count(self) -> None:
        counts = dict.fromkeys((SUCCEEDED, ERRORED, CANCELLED, EXPIRED), 0)
        given = cached = made = 0
        for outcome, (g, c, m) in self.answered.values():
            counts[outcome] += 1
            given, cached, made = given + g, cached + c, made + m
        self.record.counts = counts
        self.record.usage = {"input_tokens": given, "cached_tokens": cached, "output_tokens": made}

    # -- the end ---------------------------------------------------------------------------------------------------
    async def _finish_unanswered(self, plan: Plan, ending: str) -> None:
        """Lines never answered, answered as cancelled or expired (a completed batch has none left)."""
        if ending == "completed":
            return
        outcome = CANCELLED if ending == "cancelled" else EXPIRED
        left = [p for p in plan.lines if p.line not in self.answered]
        if not left:
            return
        path = input_path(self.record)
        for start in range(0, len(left), READ_AHEAD_LINES):
            group = left[start:start + READ_AHEAD_LINES]
            for planned, data in await asyncio.to_thread(_read_lines, self.store, path, group):
                self.pending.append(LineResult(planned.line, _custom_id(data), outcome, request_id=uuid.uuid4().hex))
            if len(self.pending) >= self.runner.config.chunk_lines:
                await self._flush()
        await self._flush()

    async def _finalize(self, ending: str) -> None:
        record, runner = self.record, self.runner
        if record.status != "finalizing":
            if ending == "cancelled":
                record.times.setdefault("cancelling", runner.clock())
            record.ending = ending
            record.set_status("finalizing", runner.clock())
            await runner.save(record)
        if record.protocol == "openai":
            await asyncio.to_thread(self._write_files)
        answered = await asyncio.to_thread(self.chunks.answered)
        self.answered = dict(answered.lines)
        self._count()
        record.set_status(ending, runner.clock())
        await runner.save(record)
        await asyncio.to_thread(self.store.delete, open_marker(record.owner, record.id))

    def _write_files(self) -> None:
        """OpenAI's output file (answered lines) and error file (the others), streamed from the chunks."""
        record = self.record
        made: dict[str, tuple[str, int]] = {}
        writers = {}
        try:
            for result in self.chunks.results():
                kind = "output" if result.outcome == SUCCEEDED else "error"
                if kind not in writers:
                    file_id = derived_id(FILE_PREFIX, record.id, kind)
                    writers[kind] = (file_id, self.store.writer(file_data_path(record.owner, file_id)))
                writers[kind][1].write(_json_line(result.to_openai()))
            for kind, (file_id, writer) in writers.items():
                writer.commit()
                made[kind] = (file_id, writer.size)
        except BaseException:
            for _, writer in writers.values():
                writer.abort()
            raise
        now = int(self.runner.clock())
        for kind, (file_id, size) in made.items():
            file = FileRecord(file_id, record.owner, size, now, f"{record.id}_{kind}.jsonl", "batch_output")
            self.store.put(file_record_path(record.owner, file_id), file.to_json())
        record.output_file_id = made.get("output", (None, 0))[0]
        record.error_file_id = made.get("error", (None, 0))[0]


def _json_line(value: dict[str, Any]) -> bytes:
    return strict_json.dumps_bytes(value) + b"\n"


def _custom_id(data: bytes) -> str:
    """The custom_id of a line that was checked once (its JSON is good), read again without its body's checks."""
    try:
        value = strict_json.loads(data)
        return str(value.get("custom_id", ""))
    except (ValueError, AttributeError):
        return ""

