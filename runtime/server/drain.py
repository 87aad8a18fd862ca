"""uvicorn on SIGTERM / SIGINT: drain the DFlash server first, then shut down as uvicorn does.

uvicorn alone closes the listening socket at once and cancels what still runs after a fixed grace, so clients see
refused connections and streams that stop without an end. Here the first signal starts `DFlashServer.drain`
(new requests: 503 with Retry-After; running ones: finish, or are cut with a final error event and [DONE] at
the deadline), and only then is uvicorn asked to exit. A second signal falls through to uvicorn's own handling.
"""
from __future__ import annotations

import asyncio
import sys

import uvicorn


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, dflash, grace_s: float):
        super().__init__(config)
        self.dflash, self.grace_s = dflash, grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._draining or self._loop is None or not self.started:
            return super().handle_exit(sig, frame)
        self._draining = True
        self._captured_signals.append(sig)  # re-raised once uvicorn is done, as its own handler does
        n = self.dflash.unfinished
        print(f"dflash-serve: signal {sig}: draining {n} running request(s) for up to {self.grace_s:g} s; new "
              "requests get 503", file=sys.stderr, flush=True)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._loop.create_task(self.dflash.drain(self.grace_s, self._exit))

    def _exit(self) -> None:
        self.should_exit = True
