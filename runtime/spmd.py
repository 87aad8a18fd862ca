"""The tensor-parallel driver (SPMD): every rank runs the same engine; rank 0 owns I/O and tells the others,
before each step, which requests arrived and which were aborted. The engine knows nothing of it: the driver
wraps the engine's public add_request / abort / step on rank 0, and replays them on the others."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from .distributed import Channel, PeerGone
from .errors import DFlashError


def serve_lease_s() -> float:
    """How long followers wait for rank 0's next message while it serves (env DFLASH_TP_TIMEOUT, seconds)."""
    raw = os.environ.get("DFLASH_TP_TIMEOUT", "60")
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise DFlashError(f"DFLASH_TP_TIMEOUT={raw!r} must be a positive number of seconds")
    return v


class SPMD:
    """The tensor-parallel driver around an engine: every rank runs the same engine and scheduler; on rank 0
    this object stands in for the engine (its public add_request / abort / step, everything else passed
    through) and, before each step, broadcasts the requests added and aborted since the last one. The others
    replay them through the same public calls and step: verification results are identical on all ranks
    (distributed argmax, gathered logits) and stop strings are found where tokens are committed, on every rank,
    so every rank makes the same scheduling and finishing decisions.

    The protocol (rank 0 -> all, on a Channel): ("step", msgs, lease), ("idle", msgs, lease) or ("shutdown", [],
    None). `lease` is rank 0's promise of its next message within that many seconds, None for no promise.
    `LLM.generate` makes none (a script may pause between calls); a server does (AsyncLLM sends "idle"
    heartbeats while it has nothing to run), so a follower whose rank 0 hangs exits instead of waiting forever.
    A rank 0 that dies closes its sockets, which followers notice at once.
    """

    GRACE_S = 30.0  # after SIGINT/SIGTERM, how long a follower waits for rank 0's shutdown message

    def __init__(self, engine):
        import atexit

        self.engine, self.dist = engine, engine.dist
        self.pending: list[tuple] = []
        self.closed = False
        self.lease_s: float | None = None  # rank 0: sent with every message
        # rank 0: held for a whole step (send + collectives) so a shutdown from another thread never lands in
        # the middle of one (then tears the group down under it)
        self.lock = threading.RLock()
        self.weight_bytes_per_rank = self.dist.all_gather_object(engine.weight_bytes)
        self.channel = Channel(self.dist)
        self._signalled: tuple[str, float] | None = None
        if self.dist.is_driver:
            atexit.register(self.shutdown)

    def __getattr__(self, name):  # the engine's metrics, stats, release, configs ... as they are
        return getattr(self.engine, name)

    # -- rank 0: the engine's public calls ----------------------------------------------------------------
    def add_request(self, prompt_ids, params, request_id=None):
        seq = self.engine.add_request(prompt_ids, params, request_id)
        # the resolved params (a drawn seed included) and id: every rank must make the very same request
        self._record("add", list(prompt_ids), seq.params, seq.request_id)
        return seq

    def abort(self, request_id: str) -> None:
        self._record("abort", request_id)
        self.engine.abort(request_id)

    def step(self):
        with self.lock:  # no shutdown from another thread between the ranks' collectives of this step
            self.send()  # the others learn this iteration's new requests and aborts first
            return self.engine.step()

    def idle_wait_s(self, heartbeat_s: float) -> float | None:
        """How long a serving loop may sleep with nothing to run: followers must hear within their lease."""
        return heartbeat_s

    def _record(self, *msg) -> None:
        if self.dist.is_driver:
            self.pending.append(msg)

    def _broadcast(self, kind: str) -> None:
        if not self.dist.is_driver:
            raise DFlashError("only rank 0 drives the engine; the other ranks call engine.follow()")
        if self.closed:
            raise DFlashError("the tensor-parallel engine was shut down")
        msgs, self.pending = self.pending, []
        self.channel.send((kind, msgs, self.lease_s))

    def send(self) -> None:
        """Before rank 0's step (engine.step holds `lock` around this and the step)."""
        self._broadcast("step")

    def heartbeat(self) -> None:
        """Rank 0 with nothing to run: renew the lease (and pass on aborts that need no step)."""
        with self.lock:
            if not self.closed:
                self._broadcast("idle")

    def set_lease(self, seconds: float | None) -> None:
        """Promise followers a message at least every `seconds` from now on (None: no promise); told at once."""
        with self.lock:
            self.lease_s = seconds
            if not self.closed:
                self._broadcast("idle")

    def shutdown(self, wait_s: float = 60.0) -> None:
        """Rank 0: release the other ranks from follow() (also at exit)."""
        if self.closed or not self.dist.is_driver:
            return
        if not self.lock.acquire(timeout=wait_s):  # a step hung: the followers' lease or rank 0's exit ends them
            return
        try:
            if self.closed:
                return
            self.closed = True
            self.channel.send(("shutdown", [], None))
            self.dist.close()
        except Exception:  # the group is already gone (a rank died): nothing to release
            pass
        finally:
            self.lock.release()

    # -- ranks > 0 ----------------------------------------------------------------------------------------
    def _apply(self, msg) -> None:
        eng = self.engine
        kind = msg[0]
        if kind == "add":
            _, prompt, params, rid = msg
            eng.add_request(prompt, params, rid)
        elif kind == "abort":
            eng.abort(msg[1])

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._signalled is not None:  # a second one: the user insists
            self._exit(f"second {name}", 128 + signum)
        self._signalled = (name, time.monotonic())

    def _exit(self, why: str, code: int = 1):
        print(f"dflash: rank {self.dist.rank}: {why}: exiting", file=sys.stderr, flush=True)
        # not sys.exit: interpreter teardown would join gloo threads still blocked on the silent rank 0
        os._exit(code)

    def follow(self) -> None:
        """Ranks > 0: mirror rank 0's engine until it shuts down; exit the process if rank 0 goes silent."""
        main = threading.current_thread() is threading.main_thread()
        # mpirun forwards SIGINT/SIGTERM to every rank; rank 0 then shuts the others down in order, so a
        # follower dying first would only break rank 0's last step and print mpirun's crash banner
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            self._follow()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _follow(self) -> None:
        eng = self.engine
        lease = None
        while True:
            start = time.monotonic()

            def give_up():
                now = time.monotonic()
                if self._signalled is not None and now - self._signalled[1] > self.GRACE_S:
                    return f"got {self._signalled[0]} and rank 0 sent no shutdown within {self.GRACE_S:g} s"
                if lease is not None and now - start > lease:
                    return f"no message from rank 0 for {lease:g} s (it hung or is gone)"
                return None

            try:
                kind, msgs, lease = self.channel.recv(give_up)
            except PeerGone as e:
                self._exit(str(e))
            if kind == "shutdown":
                self.closed = True
                self.dist.close()
                return
            for m in msgs:
                self._apply(m)
            if kind == "step":
                try:
                    eng.step()
                except DFlashError as e:  # rank 0 hit the same error; it aborts those requests next
                    print(f"dflash: rank {self.dist.rank}: step failed: {e}", file=sys.stderr, flush=True)
            for rid in [r for r, s in eng.sequences.items() if s.is_finished]:
                del eng.sequences[rid]  # rank 0's caller releases its own copies
