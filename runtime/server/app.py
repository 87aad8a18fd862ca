"""The OpenAI-compatible HTTP front end of the native engine: FastAPI routes over one AsyncLLM.

A request's life: validate (400) -> tokenize and check lengths (400) -> admission against `max_queue` (429) ->
`AsyncLLM.submit` -> the response (one JSON body, or server-sent events), read straight from the request's one
queue between the engine thread and the handler. While it waits, the handler polls `request.is_disconnected()`:
a client that leaves has its request aborted, which frees its cache blocks on the engine's next iteration.

Draining (`DFlashServer.drain`, on SIGTERM in dflash-serve): new requests get 503 with Retry-After and /health
says "draining", running requests go on until they finish or the grace period ends; then each one left is cut:
a stream gets a final error event and [DONE], a plain request a 503, and one line on stderr names it.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import sys
import time
import uuid

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .. import __version__
from ..async_llm import AsyncLLM
from ..errors import DFlashError
from . import protocol as P
from .metrics import ServerMetrics

log = logging.getLogger("dflash_trt.server")
_END = object()  # the request is over (its outputs, or its error, came before)
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


class ClientGone(Exception):
    """The HTTP client disconnected while its request was running."""


class Cut(Exception):
    """The server's drain deadline passed while the request was running."""


class _Job:
    """One admitted request, read from its AsyncLLM stream by the handler; counted until it ends."""

    def __init__(self, server: "DFlashServer", rid: str, prompt_ids: list[int], params, arrival: float):
        self.server, self.rid, self.n_prompt, self.arrival = server, rid, len(prompt_ids), arrival
        self.first: float | None = None
        self.last = None
        self.ended = False
        self.checked = time.monotonic()  # when the client's connection was last checked
        server.unfinished += 1
        self.stream = server.alm.submit(prompt_ids, params, request_id=rid)

    def _end(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = True
        srv = self.server
        srv.unfinished -= 1
        srv.metrics.request_done(reason, self.n_prompt, self.last, self.arrival, self.first, time.perf_counter())

    def cancel(self, reason: str = "abort") -> None:
        """Abort (if still running): the engine frees the request's blocks on its next iteration."""
        if not self.ended:
            self.server.alm.abort(self.rid)
            self._end(reason)

    def cut(self) -> Cut:
        n = len(self.last.token_ids) if self.last is not None else 0
        self.cancel("shutdown")
        self.server.cut.append(self.rid)
        print(f"dflash-serve: cut {self.rid} at the drain deadline after {n} generated tokens", file=sys.stderr,
              flush=True)
        return Cut()

    async def next(self, request: Request):
        """The next RequestOutput, or _END; raises the engine's error, or ClientGone when the client left."""
        if self.ended:
            return _END
        poll = self.server.poll_s
        getter = asyncio.ensure_future(self.stream.queue.get())
        try:
            while True:  # outputs may come every few ms: check the client every `poll` seconds regardless
                if self.server.cutting:
                    raise self.cut()
                now = time.monotonic()
                if now - self.checked >= poll:
                    self.checked = now
                    if await request.is_disconnected():
                        raise ClientGone()
                done, _ = await asyncio.wait({getter}, timeout=max(0.0, self.checked + poll - now))
                if done:
                    item = getter.result()
                    if isinstance(item, BaseException):
                        self._end("error")
                        raise item
                    if self.first is None and item.token_ids:
                        self.first = time.perf_counter()
                    self.last = item
                    if item.finished:
                        self._end(item.finish_reason)
                    return item
        finally:
            if not getter.done():
                getter.cancel()


class _EventStream(StreamingResponse):
    """Server-sent events whose request is aborted however the response ends (done, client gone, shutdown)."""

    def __init__(self, body, job: _Job):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()


class DFlashServer:
    def __init__(self, llm, *, served_model_name: str | None = None, api_key: str | None = None,
                 max_queue: int | None = None, disconnect_poll_s: float = 0.1):
        self.llm = llm
        self.model_name = served_model_name or os.path.basename(os.path.normpath(llm.paths.target))
        self.api_key = api_key or None
        self.max_queue = max_queue if max_queue is not None else 4 * llm.config.max_batch_size
        if self.max_queue < 1:
            raise DFlashError(f"max_queue must be >= 1, got {self.max_queue}")
        self.poll_s = disconnect_poll_s
        self.draining = False  # new requests get 503 (drain)
        self.cutting = False  # the grace period is over: running requests are cut at their next poll
        self.cut: list[str] = []  # request ids cut by a drain
        self.limits = P.Limits((self.model_name,), llm.config.max_seq_len, llm.engine.target_config.vocab_size)
        self.unfinished = 0  # admitted and not finished: touched on the event loop only
        self.created = int(time.time())
        self.metrics = ServerMetrics(llm.engine, lambda: self.unfinished, self.max_queue, self.model_name)
        self._alm: AsyncLLM | None = None

    @property
    def alm(self) -> AsyncLLM:
        if self._alm is None:
            self._alm = AsyncLLM(self.llm, on_drafts=self.metrics.drafts_done)
        return self._alm

    async def drain(self, grace_s: float, done) -> None:
        """Stop admitting, wait for the running requests up to `grace_s`, cut those left, then call done()."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.unfinished and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self.unfinished:
            self.cutting = True
            until = loop.time() + max(2.0, 10 * self.poll_s)  # each handler sees the flag at its next poll
            while self.unfinished and loop.time() < until:
                await asyncio.sleep(0.02)
        done()

    def shutdown(self) -> None:
        if self._alm is not None:
            self._alm.shutdown()
            self._alm = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.alm  # start the engine thread with the server
        try:
            yield
        finally:
            self.shutdown()

    # -- requests ---------------------------------------------------------------------------------------------
    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise P.APIError("invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                             status=401, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def _encode(self, req: P.ParsedRequest) -> list[int]:
        if isinstance(req.prompt, list) and req.kind == "completion":
            return req.prompt
        try:
            return self.llm.encode(req.prompt, chat=req.kind == "chat")
        except DFlashError as e:
            raise P.APIError(str(e), param="prompt" if req.kind == "completion" else "messages") from None
        except Exception as e:  # a chat template's raise_exception (e.g. roles must alternate), bad text
            raise P.APIError(f"could not apply the chat template / tokenizer: {e}",
                             param="messages" if req.kind == "chat" else "prompt") from None

    async def handle(self, request: Request, kind: str):
        arrival = time.perf_counter()
        if self.draining:
            raise P.APIError("the server is shutting down: retry on another replica or after the restart",
                             status=503, type="service_unavailable", code="shutting_down",
                             headers={"Retry-After": "5"})
        req = P.parse_request(P.parse_json(await request.body()), kind, self.limits)
        prompt_ids = self._encode(req)
        params = P.finalize(req, prompt_ids, self.limits)
        if self.unfinished >= self.max_queue:
            raise P.APIError(f"the server is full ({self.unfinished} unfinished requests, max_queue "
                             f"{self.max_queue}): retry later", status=429, type="rate_limit_error",
                             code="queue_full", headers={"Retry-After": "1"})
        rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex
        self.metrics.prompt_tokens.inc(len(prompt_ids))
        job = _Job(self, rid, prompt_ids, params, arrival)
        if req.stream:
            return _EventStream(self._events(job, request, req), job)
        try:
            final = None
            while True:
                out = await job.next(request)
                if out is _END:
                    break
                final = out
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"
        except Cut:
            raise P.APIError("the server shut down before the request finished: retry it", status=503,
                             type="service_unavailable", code="shutting_down", headers={"Retry-After": "5"}) \
                from None
        except DFlashError as e:
            raise P.APIError(str(e)) from None
        finally:
            job.cancel()
        if final is None or not final.finished:
            raise P.APIError("the request ended without output", status=500, type="internal_error")
        build = P.completion_response if kind == "completion" else P.chat_response
        return JSONResponse(build(rid, self.model_name, final))

    async def _events(self, job: _Job, request: Request, req: P.ParsedRequest):
        rid, model, created, chat = job.rid, self.model_name, int(time.time()), req.kind == "chat"

        def chunk(text: str | None, reason: str | None = None, role: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                c = P.chat_chunk(rid, model, created, delta, reason)
            else:
                c = P.completion_chunk(rid, model, created, text or "", reason)
            if req.include_usage:
                c["usage"] = None
            return c

        try:
            if chat:
                yield P.sse(chunk(None, role=True))
            while True:
                try:
                    out = await job.next(request)
                except ClientGone:
                    return
                except Cut:
                    yield P.sse(P.error_body("the server shut down before the request finished: retry it",
                                             "service_unavailable", code="shutting_down"))
                    break
                except Exception as e:  # the engine failed: say so in the stream, then end it
                    kind = "invalid_request_error" if isinstance(e, DFlashError) else "internal_error"
                    yield P.sse(P.error_body(str(e) or type(e).__name__, kind))
                    break
                if out is _END:
                    break
                if out.delta_text:
                    yield P.sse(chunk(out.delta_text))
                if out.finished:
                    last = chunk(None, out.finish_reason)
                    last["dflash"] = P.dflash_stats(out)
                    yield P.sse(last)
                    if req.include_usage:
                        yield P.sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                                     "created": created, "model": model, "choices": [],
                                     "usage": P.usage(len(out.prompt_token_ids), len(out.token_ids),
                                                      out.cached_tokens)})
            yield P.sse(b"[DONE]")
        finally:
            job.cancel()


def _error_handlers(app: FastAPI, server: "DFlashServer") -> None:
    """Every failure answers in the OpenAI error shape and counts in the rejection metric."""
    def error_response(status: int, body: dict, headers: dict | None = None) -> JSONResponse:
        server.metrics.rejected.labels(str(status)).inc()
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(P.APIError)
    async def _api_error(request: Request, e: P.APIError):
        return error_response(e.status, e.body(), e.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        return error_response(400, P.error_body(str(e)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        kind = "invalid_request_error" if e.status_code < 500 else "internal_error"
        return error_response(e.status_code, P.error_body(f"{e.detail}: {request.method} {request.url.path}", kind,
                                                          code=_HTTP_CODES.get(e.status_code)),
                              getattr(e, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, e: ClientDisconnect):  # left while sending its body: nothing to answer
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("request failed")
        return error_response(500, P.error_body(f"internal error: {type(e).__name__}: {e}", "internal_error"))


def create_app(llm, *, served_model_name: str | None = None, api_key: str | None = None,
               max_queue: int | None = None, disconnect_poll_s: float = 0.1) -> FastAPI:
    """The FastAPI application serving `llm` (a dflash_trt.LLM). Its engine thread runs with the app's lifespan."""
    server = DFlashServer(llm, served_model_name=served_model_name, api_key=api_key, max_queue=max_queue,
                          disconnect_poll_s=disconnect_poll_s)
    app = FastAPI(title="dflash-serve", version=__version__, lifespan=server.lifespan)
    app.state.dflash = server
    _error_handlers(app, server)

    @app.get("/health")
    async def health():
        alive = server._alm is not None and server._alm._thread.is_alive()
        status = "draining" if server.draining else "ok" if alive else "engine stopped"
        return JSONResponse({"status": status}, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(server.check_key)])

    def model_card() -> dict:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "dflash-trt",
                "max_model_len": server.limits.max_seq_len}

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @v1.get("/models/{name:path}")
    async def model(name: str):
        if name != server.model_name:
            raise P.APIError(f"model {name!r} does not exist", status=404, param="model", code="model_not_found")
        return model_card()

    @v1.post("/completions")
    async def completions(request: Request):
        return await server.handle(request, "completion")

    @v1.post("/chat/completions")
    async def chat_completions(request: Request):
        return await server.handle(request, "chat")

    app.include_router(v1)
    return app
