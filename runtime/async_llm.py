"""Streaming front end: one background thread drives the engine loop; callers await token deltas.

`AsyncLLM.generate(...)` is an async iterator of RequestOutput whose `delta_text` / `delta_token_ids` hold what
is new since the previous item; breaking out of it (or cancelling the task, or a client disconnect in the
server) aborts the request, and its cache blocks are freed before the next iteration.

Under tensor parallelism (`mpirun -n N`, only rank 0 gets an LLM to wrap) this thread is the only one that
talks to the other ranks: every `engine.step()` (the driver, spmd.SPMD) sends them the step's
requests and aborts, and while idle it sends a heartbeat every `heartbeat_s` renewing a lease of `follower_timeout_s` (default DFLASH_TP_TIMEOUT, 60 s),
so followers of a hung rank 0 exit instead of waiting forever (runtime/tensor_parallel.py, SPMD).
"""
from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass, field

from .errors import DFlashError
from .llm import LLM, RequestOutput
from .sampling import SamplingParams


@dataclass
class Stream:
    """One request's outputs, in order, on one queue: RequestOutput deltas (the last with finished=True), or
    the exception that ended the request. Its reader is the only consumer."""
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    prompt: object
    request_id: str
    sent_text: int = 0
    sent_tokens: int = 0
    seq: object = None
    holdback: int = 0  # characters kept back while they could still be the start of a stop string
    accepts_seen: int = 0  # drafting steps already handed to the on_drafts observer
    drafted_seen: int = 0


@dataclass
class _Pending:
    prompt: object
    params: SamplingParams
    chat: bool
    request_id: str
    stream: Stream
    error: list = field(default_factory=list)


class AsyncLLM:
    def __init__(self, llm: LLM, *, heartbeat_s: float = 1.0, follower_timeout_s: float | None = None,
                 on_drafts=None):
        """on_drafts(accepted, draft_tokens): called on the engine thread after each step that verified drafts
        of a request, with the accepted count of each such step and the draft tokens they verified (the
        server's vLLM-style speculation counters; every decoding step emits, so none is missed)."""
        self.llm = llm  # admission limits (429) are the server's job: this class never refuses a request
        self._on_drafts = on_drafts
        self._lease_s = None  # under tensor parallelism: the followers' timeout, renewed by heartbeats
        if llm.engine.dist is not None:
            from .spmd import serve_lease_s

            self._lease_s = follower_timeout_s or serve_lease_s()
            if not 0 < heartbeat_s < self._lease_s:
                raise DFlashError(f"heartbeat_s {heartbeat_s} must be positive and below the followers' timeout "
                                  f"{self._lease_s}")
        self._heartbeat_s = heartbeat_s
        self._cv = threading.Condition()
        self._pending: list[_Pending] = []
        self._aborts: list[str] = []
        self._streams: dict[str, Stream] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="dflash-engine", daemon=True)
        self._thread.start()

    # -- public ---------------------------------------------------------------------------------------
    @property
    def num_unfinished(self) -> int:
        with self._cv:
            return len(self._streams) + len(self._pending)

    def submit(self, prompt, params: SamplingParams, chat: bool = False, request_id: str | None = None) -> Stream:
        """Admit a request (from the event loop's thread); read its outputs from the returned stream's queue,
        and call abort(stream.request_id) if you stop before it finishes."""
        rid = request_id or uuid.uuid4().hex
        stream = Stream(asyncio.get_running_loop(), asyncio.Queue(), prompt, rid,
                        holdback=max((len(s) for s in params.stop), default=1) - 1)
        with self._cv:
            self._pending.append(_Pending(prompt, params, chat, rid, stream))
            self._cv.notify()
        return stream

    async def generate(self, prompt, params: SamplingParams, chat: bool = False, request_id: str | None = None):
        stream = self.submit(prompt, params, chat, request_id)
        rid = stream.request_id
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # -- engine thread --------------------------------------------------------------------------------
    def _admit(self) -> None:
        with self._cv:
            pending, self._pending = self._pending, []
            aborts, self._aborts = self._aborts, []
        for p in pending:
            try:
                p.stream.seq = self.llm.add_request(p.prompt, p.params, p.chat, request_id=p.request_id)
                self._streams[p.request_id] = p.stream
            except Exception as e:  # bad request: surfaces in the caller's await
                p.stream.loop.call_soon_threadsafe(p.stream.queue.put_nowait, e)
        for rid in aborts:
            st = self._streams.pop(rid, None)
            self.llm.engine.abort(rid)
            if st is not None and st.seq is not None:
                self.llm.engine.release(st.seq)

    def _has_work(self) -> bool:
        return bool(self._stop or self._pending or self._aborts or self.llm.engine.has_unfinished())

    def _run(self) -> None:
        eng = self.llm.engine
        try:
            eng.set_lease(self._lease_s)
            while True:
                with self._cv:
                    if not self._has_work():
                        self._cv.wait(eng.idle_wait_s(self._heartbeat_s))
                    if self._stop:
                        return
                    busy = self._has_work()
                if not busy:
                    eng.heartbeat()  # tensor parallelism: followers must hear from rank 0 within the lease
                    continue
                self._step(eng)
        finally:
            try:  # no more promises: rank 0 may use the LLM without this thread now
                eng.set_lease(None)
            except Exception:  # the other ranks are gone already
                pass

    def _step(self, eng) -> None:
        self._admit()
        if not eng.has_unfinished():
            return
        try:
            outs = eng.step()
        except Exception as e:  # an engine failure ends every request with the error, not a hang
            for rid, st in list(self._streams.items()):
                st.loop.call_soon_threadsafe(st.queue.put_nowait, e)
                eng.abort(rid)
            self._streams.clear()
            return
        for o in outs:
            st = self._streams.get(o.seq.request_id)
            if st is not None:
                self._emit(o.seq, st)

    def _emit(self, seq, st: Stream) -> None:
        if self._on_drafts is not None and len(seq.accept_hist) > st.accepts_seen:
            self._on_drafts(seq.accept_hist[st.accepts_seen:], seq.drafted - st.drafted_seen)
            st.accepts_seen, st.drafted_seen = len(seq.accept_hist), seq.drafted
        out: RequestOutput = self.llm.output(seq, st.prompt)
        text = out.text
        visible = len(text)
        if not seq.is_finished:
            visible -= st.holdback
            while visible > st.sent_text and text[visible - 1] == "\ufffd":  # incomplete UTF-8 sequence
                visible -= 1
        out.delta_text = text[st.sent_text:visible] if visible > st.sent_text else ""
        out.delta_token_ids = out.token_ids[st.sent_tokens:]
        st.sent_text = max(st.sent_text, visible)
        st.sent_tokens = len(out.token_ids)
        if seq.is_finished:
            self._streams.pop(seq.request_id, None)
            self.llm.engine.release(seq)
        st.loop.call_soon_threadsafe(st.queue.put_nowait, out)
