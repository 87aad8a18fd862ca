"""dflash-serve: an OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health,
/metrics) on the native DFlash engine, or `--backend trtllm` to exec TensorRT-LLM's trtllm-serve on an engine
directory from dflash-build. Arguments after `--` go to trtllm-serve unchanged.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from ..errors import DFlashError
from ..cli.common import add_engine_args, load_kwargs, spec_method, user_errors

ENV_HOST, ENV_PORT, ENV_KEY = "DFLASH_HOST", "DFLASH_PORT", "DFLASH_API_KEY"
NATIVE_ONLY = ("dtype", "device", "no_spec", "spec", "api_key", "max_queue", "kv_cache_bytes", "kv_cache_fraction")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash-serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="With no ENGINE_DIR and no --target, the embedded default pair (SmolLM2-135M-Instruct + its DFlash "
               f"drafter) is served. Environment: {ENV_HOST}, {ENV_PORT}, {ENV_KEY} give defaults for --host, "
               "--port, --api-key.")
    add_engine_args(p)
    # None = not given: the engine directory's engine.json (or EngineConfig) decides
    p.set_defaults(max_batch_size=None, max_num_tokens=None, max_seq_len=None, dtype=None)
    p.add_argument("--host", default=os.environ.get(ENV_HOST, "127.0.0.1"),
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=int(os.environ.get(ENV_PORT) or 8000))
    p.add_argument("--api-key", default=os.environ.get(ENV_KEY) or None,
                   help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--max-queue", type=int, help="unfinished requests beyond which new ones get 429 "
                   "(default 4 x max-batch-size)")
    p.add_argument("--served-model-name", help="model id in the API (default: the model directory's name)")
    p.add_argument("--backend", choices=("native", "trtllm"), default="native",
                   help="native: this package's engine (CPU or GPUs, tensor parallel under mpirun); trtllm: exec "
                   "trtllm-serve on ENGINE_DIR")
    p.add_argument("--tp-size", type=int, help="tensor-parallel size (native: default engine.json's tp_size, else "
                   "the ranks mpirun started: `mpirun -n 2 dflash-serve ...`; trtllm: default the engine's)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="on SIGTERM/SIGINT: seconds running requests "
                   "may take to finish while new ones get 503; those left are then cut (an error event and [DONE] "
                   "end their streams) and the exit status is 1 (default 30)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--dry-run", action="store_true", help="trtllm: print the trtllm-serve command and exit")
    return p


def _split(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


@user_errors
def main(argv=None) -> int:
    ours, passthrough = _split(argv)
    args = make_parser().parse_args(ours)
    if not 0 < args.port < 65536:
        raise DFlashError(f"--port {args.port} must be in 1..65535")
    if args.backend == "trtllm":
        return _trtllm(args, passthrough)
    if passthrough:
        raise DFlashError(f"arguments after `--` ({' '.join(passthrough)}) are for trtllm-serve: use --backend trtllm")
    return _native(args)


# -- native -------------------------------------------------------------------------------------------------------
def _engine_defaults(args) -> dict:
    """EngineConfig keywords from the flags given (engine.json's values for the others: loader.engine_settings)."""
    kw = {}
    for k in ("max_batch_size", "max_num_tokens", "max_seq_len", "max_draft_len"):
        v = getattr(args, k)
        if v is not None:
            if v < 1:
                raise DFlashError(f"--{k.replace('_', '-')} {v} must be a positive integer")
            kw[k] = v
    for k in ("dtype", "device", "draft_len_policy"):
        if getattr(args, k):
            kw[k] = getattr(args, k)
    if args.tp_size is not None:
        kw["tp_size"] = args.tp_size
    return kw


def _check_port(host: str, port: int) -> None:
    """Fail in one line before loading the model when the address is taken."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise DFlashError(f"--host {host!r} does not resolve: {e}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise DFlashError(f"cannot listen on {host}:{port} ({e.strerror}): choose another --port or --host") \
                from None


def _native(args) -> int:
    """Under `mpirun -n N` every rank gets here: rank 0 serves HTTP; the others never return from LLM(...), they
    execute each engine step rank 0's AsyncLLM sends them and exit when it shuts the engine down."""
    from ..distributed import driver_check
    from ..spmd import serve_lease_s

    if args.max_queue is not None and args.max_queue < 1:
        raise DFlashError(f"--max-queue {args.max_queue} must be a positive integer")
    if not args.drain_timeout >= 0:
        raise DFlashError(f"--drain-timeout {args.drain_timeout} must be a number of seconds >= 0")

    def rank0_checks():  # only rank 0 listens; its verdict is every rank's, before any model is loaded
        _check_port(args.host, args.port)
        serve_lease_s()

    driver_check(rank0_checks)
    import uvicorn

    from ..llm import LLM
    from ..loader import report_stages
    from .app import create_app
    from .drain import DrainingServer

    report_stages()
    llm = LLM(args.model, target=args.target, draft=args.draft, speculative=spec_method(args),
              **_engine_defaults(args), **load_kwargs(args))
    # the server drains on SIGINT/SIGTERM (drain.py), then raises the signal again once done: to the handler
    # found before it. Ours turns that into _Stopped, so the other ranks are released below and the exit is 0
    # unless requests were cut (by default SIGTERM would kill this process first, and mpirun would report a crash).
    handlers = {s: signal.signal(s, _stopped) for s in (signal.SIGINT, signal.SIGTERM)}
    srv = None
    try:
        app = create_app(llm, served_model_name=args.served_model_name, api_key=args.api_key,
                         max_queue=args.max_queue)
        srv = app.state.dflash
        c, tp = llm.config, llm.engine.tp_size
        print(f"dflash-serve: {srv.model_name} ({c.spec.method or 'autoregressive'}, {c.device}"
              f"{f', tensor parallel over {tp} ranks' if tp > 1 else ''}, max_batch_size {c.max_batch_size}, "
              f"max_seq_len {c.max_seq_len}, max_queue {srv.max_queue}{', API key required' if srv.api_key else ''})"
              f" on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
        DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                      timeout_graceful_shutdown=5), srv, args.drain_timeout).run()
    except _Stopped:
        pass
    finally:  # however the HTTP server ended (signal, failed bind, error): release the other ranks now
        for sig, h in handlers.items():
            signal.signal(sig, h)
        llm.engine.shutdown()
    if srv is not None and srv.cut:
        print(f"dflash-serve: {len(srv.cut)} request(s) cut at the drain deadline (--drain-timeout "
              f"{args.drain_timeout:g}): exit status 1", file=sys.stderr, flush=True)
        return 1
    return 0


class _Stopped(Exception):
    """A signal asked the server to stop, and it did."""


def _stopped(signum, frame):
    raise _Stopped()


# -- trtllm -------------------------------------------------------------------------------------------------------
def _trtllm(args, passthrough: list[str]) -> int:
    from . import trtllm

    if args.target or args.draft:
        raise DFlashError("--backend trtllm serves an engine directory from dflash-build: pass ENGINE_DIR instead "
                          "of --target/--draft")
    if not args.model:
        raise DFlashError("--backend trtllm needs ENGINE_DIR, an engine directory from `dflash-build --output DIR`")
    given = [k for k in NATIVE_ONLY if getattr(args, k) not in (None, False)]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise DFlashError(f"{flags}: native-backend option(s) that trtllm-serve does not take (for an API key, put "
                          "an authenticating proxy in front of trtllm-serve)")
    if not args.dry_run:
        trtllm.check_available()
    plan = trtllm.launch_plan(args.model, host=args.host, port=args.port, tp_size=args.tp_size,
                              max_batch_size=args.max_batch_size, max_num_tokens=args.max_num_tokens,
                              max_seq_len=args.max_seq_len, max_draft_len=args.max_draft_len,
                              served_model_name=args.served_model_name, extra_args=passthrough)
    if args.dry_run:
        print(plan.command())
        return 0
    installed, built = trtllm.trtllm_version(), plan.engine.get("tensorrt_llm_version")
    if installed and built and installed != built:
        print(f"warning: the engine was written for TensorRT-LLM {built}, this is {installed}: option names may "
              "differ (see builder/trtllm.py)", file=sys.stderr)
    print(f"dflash-serve: exec {plan.command()}", file=sys.stderr, flush=True)
    trtllm.exec_plan(plan)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
