"""The generation thread: bounded admission, continuous batching of one model at a time.

All of torch runs in one thread (:class:`Engine`). HTTP handlers :meth:`Engine.submit` a
:class:`Job` and read its events from an ``asyncio.Queue`` that the thread fills through
``loop.call_soon_threadsafe``. The thread keeps one batch of rows (one row per choice) of a
single model, decoding one token per step for all of them over a shared key/value cache, left
padded: row ``r``'s tokens are the last ``lengths[r]`` columns, its attention mask zero before
them and its position ids counted from its own first token, so each row computes what it would
alone. Between steps, finished and cancelled rows leave (their cache rows dropped, all-padding
columns trimmed) and queued jobs of the same model join (prefilled together, their caches left
padded to a common length and concatenated): continuous batching. Jobs of another model wait
until the batch drains: jobs join in arrival order, so the head of the queue is never
overtaken by later jobs of the running model.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from dprc_core.generation import SEED_MOD, sample_token
from dprc_core.training.chat_template import chat_template_of
from inference.detok import Detokenizer
from inference.errors import APIError, bad_request
from inference.models import Loaded, ModelCache

log = logging.getLogger("inference")

INTERNAL = APIError(500, "the engine failed on this request", "internal_error")


@dataclass(eq=False)
class Job:
    """One HTTP request: the prompt, its sampling settings and where its events go."""

    model: str
    loop: asyncio.AbstractEventLoop
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    max_new: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    open_rows: int = 0
    completion_tokens: int = 0

    outbox: list[tuple[Any, ...]] = field(default_factory=list)
    touched: set[Job] | None = None  # the engine's jobs with events to deliver

    def emit(self, *event: Any) -> None:
        """Queue an event; the engine delivers each step's events in one loop call."""
        self.outbox.append(event)
        if self.touched is not None:
            self.touched.add(self)

    def fail(self, err: APIError) -> None:
        self.emit("error", err)


def _put_all(batch: list[tuple[Job, list[tuple[Any, ...]]]]) -> None:
    for job, events in batch:
        for event in events:
            job.events.put_nowait(event)


class Row:
    """One choice of a job: its decoding state and its own random generator."""

    def __init__(self, job: Job, index: int, prompt: list[int], max_new: int, tokenizer: Any):
        self.job = job
        self.index = index
        self.prompt = prompt
        self.max_new = max_new
        self.generated = 0
        self.detok = Detokenizer(tokenizer, job.stop)
        self.greedy = job.temperature == 0
        self.generator: torch.Generator | None = None
        if not self.greedy:
            seed = job.seed if job.seed is not None else secrets.randbits(62)
            self.generator = torch.Generator().manual_seed((seed + index) % SEED_MOD)


def _sample(row: Row, logits: torch.Tensor) -> int:
    return sample_token(logits, row.job.temperature, row.job.top_p, row.generator)


def _pad_left(t: torch.Tensor, to: int) -> torch.Tensor:
    """``t`` [B, H, T, D] with ``to - T`` zero columns in front."""
    extra = to - t.shape[-2]
    if extra == 0:
        return t
    pad = t.new_zeros(t.shape[0], t.shape[1], extra, t.shape[3])
    return torch.cat([pad, t], dim=-2)


class Batch:
    """The rows of one model decoding together."""

    def __init__(self, entry: Loaded):
        from transformers import DynamicCache

        self.entry = entry
        self.rows: list[Row] = []
        self.cache: Any = None
        self.lengths = torch.zeros(0, dtype=torch.long)  # real tokens of each row in the cache
        self.logits: torch.Tensor | None = None  # [B, V]: the next token's logits, per row
        self._cache_cls = DynamicCache
        forward = (
            entry.model.get_base_model().forward
            if hasattr(entry.model, "get_base_model")
            else entry.model.forward
        )
        params = inspect.signature(forward).parameters
        self._keep = "logits_to_keep" in params
        # transformers 5.x renames ``past_key_values`` to ``cache``
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @property
    def width(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def _forward(
        self, ids: torch.Tensor, lengths: torch.Tensor, width: int, cache: Any
    ) -> torch.Tensor:
        """One forward of ``ids`` [B, L] appended to ``cache`` (``width`` columns), each row's
        real tokens the last ``lengths`` of ``width + L`` columns; the last position's logits."""
        total = width + ids.shape[1]
        columns = torch.arange(total)
        mask = (columns[None, :] >= (total - lengths)[:, None]).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, width:]
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._keep else {}
        kwargs[self._cache_arg] = cache
        out = self.entry.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs
        )
        return out.logits[:, -1, :]

    def join(self, rows: list[Row]) -> None:
        """Prefill ``rows`` together and add them to the batch."""
        pad = int(self.entry.tokenizer.pad_token_id or 0)
        longest = max(len(r.prompt) for r in rows)
        ids = torch.full((len(rows), longest), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, longest - len(r.prompt) :] = torch.tensor(r.prompt)
        lengths = torch.tensor([len(r.prompt) for r in rows])
        cache: Any = self._cache_cls()
        logits = self._forward(ids, lengths, 0, cache)
        if self.cache is None or not self.rows:
            self.cache, self.lengths, self.logits = cache, lengths, logits
        else:
            assert self.logits is not None
            width = max(self.width, longest)
            merged = [
                (
                    torch.cat([_pad_left(old.keys, width), _pad_left(new.keys, width)]),
                    torch.cat([_pad_left(old.values, width), _pad_left(new.values, width)]),
                )
                for old, new in zip(self.cache.layers, cache.layers)
            ]
            self.cache = self._cache_cls(ddp_cache_data=merged)
            self.lengths = torch.cat([self.lengths, lengths])
            self.logits = torch.cat([self.logits, logits])
        self.rows += rows

    def keep(self, kept: list[int]) -> None:
        """Keep only the rows at ``kept`` (indices into :attr:`rows`)."""
        if len(kept) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in kept]
        if not kept:
            self.cache, self.logits = None, None
            self.lengths = torch.zeros(0, dtype=torch.long)
            return
        index = torch.tensor(kept)
        self.lengths = self.lengths[index]
        assert self.logits is not None
        self.logits = self.logits[index]
        cut = self.width - int(self.lengths.max())  # columns that are padding in every row
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, cut:, :]
            layer.values = layer.values[index, :, cut:, :]

    def step(self, tokens: list[int]) -> None:
        """Append one token to every row and compute the next logits."""
        ids = torch.tensor(tokens, dtype=torch.long)[:, None]
        self.lengths = self.lengths + 1
        self.logits = self._forward(ids, self.lengths, self.width, self.cache)


class Engine:
    def __init__(self, cache: ModelCache, max_batch: int = 8, max_queue: int = 64):
        self.cache = cache
        self.max_batch = max_batch
        self.max_queue = max_queue
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._batch: Batch | None = None
        self._active = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="generation", daemon=True)
        self.step_seconds = 0.05  # a running estimate, for Retry-After
        self._touched: set[Job] = set()  # jobs with events not yet handed to their loop

    # ------------------------------------------------------------ the HTTP side
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        """Queue ``job``, or 429 when the queue is full."""
        with self._cond:
            if len(self._queue) >= self.max_queue:
                wait = max(1, round(self.step_seconds * 32 * (1 + len(self._queue) / 8)))
                raise APIError(
                    429,
                    f"the engine is busy: {self._active} sequences running, "
                    f"{len(self._queue)} requests queued; retry later",
                    "rate_limit_exceeded",
                    headers={"Retry-After": str(min(wait, 60))},
                )
            job.touched = self._touched
            self._queue.append(job)
            self._cond.notify_all()

    def cancel(self, job: Job) -> None:
        """The client went away: drop ``job`` (its rows leave the batch at the next step)."""
        job.cancelled = True
        with self._cond:
            self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            queued = sum(1 for j in self._queue if not j.cancelled)
            active = self._active
        return {
            "active": active,
            "queued": queued,
            "slots": self.max_batch,
            "max_queue": self.max_queue,
            "cached_models": self.cache.cached(),
            "cache_bytes": self.cache.cached_bytes(),
            "cache_limit_bytes": self.cache.limit,
            "evictions": self.cache.evictions,
        }

    # ------------------------------------------------------------ the generation thread
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                self._purge()
                while not self._stopping and not self._queue and self._batch is None:
                    self._cond.wait()
                    self._purge()
                if self._stopping:
                    return
            try:
                self._iterate()
            except Exception as err:  # keep the thread alive; fail what was running
                log.exception("generation step failed: %s", type(err).__name__)
                self._abort(INTERNAL)
            self._deliver()

    def _deliver(self) -> None:
        """Hand this step's events to the event loops: one thread-safe call per loop, not one
        per token (each call wakes the loop)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[Job]] = {}
        for job in self._touched:
            by_loop.setdefault(job.loop, []).append(job)
        self._touched.clear()
        for loop, jobs in by_loop.items():
            batch = [(job, job.outbox) for job in jobs]
            for job in jobs:
                job.outbox = []
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the loop is closed: the server is stopping
                for job in jobs:
                    job.cancelled = True

    def _purge(self) -> None:
        """Drop cancelled jobs from the queue (the lock is held)."""
        if any(j.cancelled for j in self._queue):
            self._queue = deque(j for j in self._queue if not j.cancelled)

    def _abort(self, err: APIError) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            for job in {id(r.job): r.job for r in batch.rows}.values():
                job.fail(err)
            self.cache.release(batch.entry)
        self._active = 0

    def _iterate(self) -> None:
        if self._batch is None:
            with self._cond:
                head = self._queue.popleft() if self._queue else None
            if head is None:
                return
            try:
                entry = self.cache.acquire(head.model)
            except APIError as err:
                head.fail(err)
                return
            except Exception as err:
                log.exception("model %s: acquiring failed: %s", head.model, type(err).__name__)
                head.fail(INTERNAL)
                return
            self._batch = Batch(entry)
            self._admit([head])
        batch = self._batch
        joiners: list[Job] = []
        with self._cond:
            free = self.max_batch - len(batch.rows)
            while self._queue:
                job = self._queue[0]
                if job.cancelled:
                    self._queue.popleft()
                    continue
                if job.model != batch.entry.reg.name or job.n > free:
                    break
                if self.cache.registration(job.model) != batch.entry.reg:
                    break  # unloaded or re-registered: a fresh batch will answer it
                joiners.append(self._queue.popleft())
                free -= job.n
        if joiners:
            self._admit(joiners)
        if batch.rows:
            self._decode(batch)
        if not batch.rows:
            self._batch = None
            self.cache.release(batch.entry)
        self._active = len(batch.rows)

    def _prompt(self, job: Job, entry: Loaded) -> list[int]:
        tok = entry.tokenizer
        if job.messages is not None:
            try:
                text = tok.apply_chat_template(
                    job.messages,
                    chat_template=chat_template_of(tok),
                    add_generation_prompt=True,
                    tokenize=False,
                )
            except Exception as err:  # a template may raise on the roles it is given
                raise bad_request(
                    f"the model's chat template refused the messages: {err}"[:500],
                    param="messages",
                ) from None
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
        else:
            ids = list(tok(job.prompt or "")["input_ids"])
        if not ids:
            raise bad_request("the prompt is empty", param="prompt")
        if len(ids) > entry.positions - 1:
            raise bad_request(
                f"this model's maximum context length is {entry.positions} tokens; the prompt "
                f"has {len(ids)} tokens, which leaves no room to generate",
                param="messages" if job.messages is not None else "prompt",
                code="context_length_exceeded",
            )
        return ids

    def _admit(self, jobs: list[Job]) -> None:
        batch = self._batch
        assert batch is not None
        rows: list[Row] = []
        for job in jobs:
            if job.cancelled:
                continue
            try:
                ids = self._prompt(job, batch.entry)
            except APIError as err:
                job.fail(err)
                continue
            except Exception as err:
                log.warning("model %s: tokenizing failed: %s", job.model, type(err).__name__)
                job.fail(INTERNAL)
                continue
            room = batch.entry.positions - len(ids)
            max_new = room if job.max_new is None else min(job.max_new, room)
            job.prompt_tokens = len(ids)
            job.open_rows = job.n
            rows += [Row(job, i, ids, max_new, batch.entry.tokenizer) for i in range(job.n)]
            job.emit("start", len(ids))
        if rows:
            try:
                batch.join(rows)
            except Exception as err:  # the prefill failed: the running rows are intact
                log.exception(
                    "model %s: prefill failed: %s", batch.entry.reg.name, type(err).__name__
                )
                for job in {id(r.job): r.job for r in rows}.values():
                    job.fail(INTERNAL)

    def _decode(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        logits = batch.logits
        assert logits is not None
        greedy = logits.argmax(-1).tolist()
        eos = batch.entry.eos_ids
        tokens: list[int] = []
        kept: list[int] = []
        for i, row in enumerate(batch.rows):
            job = row.job
            if job.cancelled:
                self._close(row, None)
                continue
            token = greedy[i] if row.greedy else _sample(row, logits[i])
            row.generated += 1
            reason = None
            if token in eos and not job.ignore_eos:
                reason = "stop"
            else:
                piece = row.detok.add(token)
                if piece:
                    job.emit("text", row.index, piece)
                if row.detok.stopped:
                    reason = "stop"
                elif row.generated >= row.max_new:
                    reason = "length"
            if reason is None:
                tokens.append(token)
                kept.append(i)
            else:
                self._close(row, reason)
        batch.keep(kept)
        if batch.rows:
            batch.step(tokens)
        self.step_seconds = 0.9 * self.step_seconds + 0.1 * (time.perf_counter() - t0)

    def _close(self, row: Row, reason: str | None) -> None:
        job = row.job
        job.completion_tokens += row.generated
        job.open_rows -= 1
        if reason is not None:
            rest = row.detok.finish()
            if rest:
                job.emit("text", row.index, rest)
            job.emit("end", row.index, reason, row.generated)
        if job.open_rows == 0:
            if job.cancelled:
                log.info("request %s for model %s cancelled by its client", job.id[:8], job.model)
                return
            job.emit("done", job.prompt_tokens, job.completion_tokens)
            log.info(
                "request %s model %s: %d prompt tokens, %d completion tokens, %.3f s",
                job.id[:8],
                job.model,
                job.prompt_tokens,
                job.completion_tokens,
                time.perf_counter() - job.submitted,
            )
