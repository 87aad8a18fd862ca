"""Tensor parallelism applied to built models, gpt-fast style: the model files know almost nothing of it.

Target and drafter layers: attention heads split (q/k/v rows by head, o_proj columns), MLP intermediate split
(gate/up rows, down_proj columns). The row-parallel o_proj/down_proj compute, on each rank, the batch-invariant
partial sum of their local K slice (`linear_partial`, k_splits=8 fixed chunks), all-gather the fp32 partials
and add them with `tree_sum` in rank order: bitwise the TP=1 `linear` (plugins/invariant.py), so every rank
holds exactly the TP=1 hidden states. The embedding is vocab-parallel (each rank looks up the ids it owns;
the owner's row is selected after an all-gather, exact); the output head is vocab-parallel too, and greedy
choices use a distributed argmax (local max + index, all-gather, max with the lowest global index on ties:
torch.argmax of the full logits) so full logits are only gathered for sampled rows. The drafter's fc and
norms are replicated (small). Each rank reads only its slices of the safetensors files.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .checkpoint import iter_tensors
from .config import DraftConfig, TargetConfig
from .distributed import Channel, Distributed, PeerGone
from .errors import DFlashError
from .models.draft import DFlashDrafter
from .models.target import Linear, TargetModel

TP_SIZES = (1, 2, 4, 8)


def validate_tp(tp: int, tcfg: TargetConfig, dcfg: DraftConfig | None) -> None:
    """One-line DFlashErrors for sizes the models cannot be split by."""
    if tp not in TP_SIZES:
        raise DFlashError(f"tp_size {tp} is not supported: use 1, 2, 4 or 8 (row-parallel sums are split in 8 "
                          "fixed chunks so every size reproduces TP=1 bitwise)")
    if tp > 1:
        from .models.registry import target_class
        from .models.target import TargetModel
        if target_class(tcfg.model_type) is not TargetModel:
            raise DFlashError(f"tensor parallelism supports dense Llama/Qwen3 targets, not {tcfg.model_type}: "
                              "run it with tp_size 1")
    for what, cfg in (("target", tcfg), ("drafter", dcfg)):
        if cfg is None:
            continue
        for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            n = getattr(cfg, field)
            if n % tp:
                raise DFlashError(f"tp_size {tp} does not divide the {what}'s {field} {n}: "
                                  f"use a tp_size that divides it (1, 2, 4 or 8)")


def resolve_tp_size(flag: int | None, engine_json: dict | None, world_size: int) -> tuple[int, str]:
    """The flag, else engine.json's tp_size, else the MPI world size; with where it came from."""
    if flag is not None:
        return int(flag), "tp_size"
    if engine_json and engine_json.get("tp_size") is not None:
        return int(engine_json["tp_size"]), "engine.json tp_size"
    return world_size, "the MPI world size"


# ---- modules ----------------------------------------------------------------------------------------------------

class RowParallelLinear(Linear):
    """y = x_local @ W[:, K slice].T summed over ranks (bias once): bitwise TP=1 with the invariant kernels."""

    def __init__(self, base: Linear, dist: Distributed):
        nn.Module.__init__(self)
        self.weight, self.bias, self.packed, self.k_splits = base.weight, base.bias, None, base.k_splits
        self.dist = dist
        self.tp = dist.world_size

    def forward(self, x):
        if self.packed is not None and ops._use_bi(x):
            ks = self.k_splits // self.tp
            part = ops._bi.linear_partial(x, self.packed, 0, ks, ks)
        else:  # PyTorch / GPU path: close to TP=1, not bitwise
            part = F.linear(x.float(), self.weight.float())
        parts = self.dist.all_gather(part)
        from .plugins.invariant import tree_sum  # pure PyTorch, needs no extension

        return tree_sum(parts, self.bias, x.dtype)


class VocabParallelEmbedding(nn.Module):
    """Rows [v0, v1) of the embedding on this rank; the owner rank's row is picked after an all-gather."""

    def __init__(self, base: nn.Embedding, dist: Distributed, shard: int):
        super().__init__()
        self.weight = base.weight
        self.dist, self.shard = dist, shard
        self.v0 = dist.rank * shard

    def forward(self, ids):
        local = ids - self.v0
        mine = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * mine[:, None]
        stacked = torch.stack(self.dist.all_gather(rows))  # [tp, T, H]
        owner = (ids // self.shard).clamp(max=self.dist.world_size - 1)
        return stacked[owner, torch.arange(ids.shape[0], device=ids.device)]


class VocabParallelHead:
    """What the model runner needs of a vocab-split head: the distributed argmax and full-logit gathers."""

    def __init__(self, dist: Distributed, shard: int, vocab: int):
        self.dist, self.shard, self.vocab = dist, shard, vocab

    def argmax(self, local_logits: torch.Tensor) -> torch.Tensor:
        """torch.argmax of the full logits (lowest index among equal maxima), without gathering them."""
        val, idx = local_logits.float().max(-1)  # first maximal local index
        idx = idx + self.dist.rank * self.shard
        vals = torch.stack(self.dist.all_gather(val))  # [tp, R]
        idxs = torch.stack(self.dist.all_gather(idx))
        best = vals.argmax(0)  # first rank holding the max: the lowest global index
        return idxs.gather(0, best[None])[0]

    def gather(self, local_logits: torch.Tensor) -> torch.Tensor:
        """The full [R, V] logits (only for sampled rows)."""
        pad = self.shard - local_logits.shape[1]
        if pad:  # the last shard is short when tp does not divide the vocabulary
            local_logits = F.pad(local_logits, (0, pad), value=float("-inf"))
        return self.dist.all_gather_cat(local_logits.contiguous(), dim=1)[:, :self.vocab]


# ---- sharding plans ---------------------------------------------------------------------------------------------

def _plan(cfg, tp: int, rank: int) -> dict:
    """name suffix -> (dim, start, end) for this rank; names not listed are replicated."""
    hd = cfg.head_dim
    qh, kvh, inter = cfg.num_attention_heads // tp, cfg.num_key_value_heads // tp, cfg.intermediate_size // tp
    q = (rank * qh * hd, (rank + 1) * qh * hd)
    kv = (rank * kvh * hd, (rank + 1) * kvh * hd)
    it = (rank * inter, (rank + 1) * inter)
    return {"self_attn.q_proj.weight": (0, *q), "self_attn.q_proj.bias": (0, *q),
            "self_attn.k_proj.weight": (0, *kv), "self_attn.k_proj.bias": (0, *kv),
            "self_attn.v_proj.weight": (0, *kv), "self_attn.v_proj.bias": (0, *kv),
            "self_attn.o_proj.weight": (1, *q),
            "mlp.gate_proj.weight": (0, *it), "mlp.gate_proj.bias": (0, *it),
            "mlp.up_proj.weight": (0, *it), "mlp.up_proj.bias": (0, *it),
            "mlp.down_proj.weight": (1, *it)}


_LAYER = re.compile(r"^(?:model\.)?layers\.\d+\.(.+)$")


def _slice_of(name: str, plan: dict, vocab: tuple[int, int] | None):
    if vocab is not None and name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (0, *vocab)
    m = _LAYER.match(name)
    return plan.get(m.group(1)) if m else None


def read_slices(path: str, what: str, wanted, plan: dict, vocab: tuple[int, int] | None) -> dict:
    """This rank's slices of the checkpoint tensors named in `wanted` (callable on the stored name)."""
    out = {}
    for name, f, _ in iter_tensors(path, what):
        if not wanted(name):
            continue
        s = _slice_of(name, plan, vocab)
        if s is None:
            out[name] = f.get_tensor(name)
            continue
        dim, a, b = s
        sl = f.get_slice(name)
        out[name] = sl[a:b] if dim == 0 else sl[:, a:b]
    return out


def _resize(p: nn.Parameter, shape) -> None:
    p.data = torch.empty(shape, dtype=p.dtype)


def _shard_layers(layers, cfg, dist: Distributed) -> None:
    tp = dist.world_size
    for layer in layers:
        att, mlp = layer.self_attn, layer.mlp
        for lin in (att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj):
            out_f = lin.weight.shape[0] // tp
            _resize(lin.weight, (out_f, lin.weight.shape[1]))
            if lin.bias is not None:
                _resize(lin.bias, (out_f,))
        for parent, name in ((att, "o_proj"), (mlp, "down_proj")):
            lin = getattr(parent, name)
            if lin.k_splits % tp:
                raise DFlashError(f"{name} has {lin.weight.shape[1]} inputs, not a multiple of 8: "
                                  "it cannot be split bitwise-exactly over ranks")
            _resize(lin.weight, (lin.weight.shape[0], lin.weight.shape[1] // tp))
            setattr(parent, name, RowParallelLinear(lin, dist))
        att.n_heads //= tp
        att.n_kv //= tp


def shard_target(target: TargetModel, dist: Distributed) -> None:
    tp, cfg = dist.world_size, target.cfg
    _shard_layers(target.model.layers, cfg, dist)
    shard = -(-cfg.vocab_size // tp)
    rows = max(0, min(cfg.vocab_size, (dist.rank + 1) * shard) - dist.rank * shard)
    emb = target.model.embed_tokens
    _resize(emb.weight, (rows, cfg.hidden_size))
    target.model.embed_tokens = VocabParallelEmbedding(emb, dist, shard)
    if target.lm_head is not None:
        _resize(target.lm_head.weight, (rows, cfg.hidden_size))
    target.tp = VocabParallelHead(dist, shard, cfg.vocab_size)
    target.tp_vocab = (dist.rank * shard, dist.rank * shard + rows)


def shard_drafter(drafter: DFlashDrafter, dist: Distributed) -> None:
    _shard_layers(drafter.layers, drafter.cfg, dist)


def read_target_state(paths, target: TargetModel, dist: Distributed, dtype) -> dict:
    """This rank's slices of the (sharded) target's weights."""
    from .quantized import is_quantized, load_quantized_state_dict

    own = set(dict(target.named_parameters()))
    plan = _plan(target.cfg, dist.world_size, dist.rank)
    if not is_quantized(paths.target):
        return read_slices(paths.target, "target", lambda n: n in own, plan, target.tp_vocab)
    state = {}  # quantized: dequantised whole on load, then sliced
    for n, t in load_quantized_state_dict(paths.target, dtype).items():
        if n in own:
            s = _slice_of(n, plan, target.tp_vocab)
            state[n] = t if s is None else (t[s[1]:s[2]] if s[0] == 0 else t[:, s[1]:s[2]])
    return state


def read_draft_state(paths, drafter: DFlashDrafter, dist: Distributed) -> dict:
    own = set(dict(drafter.named_parameters()))
    return read_slices(paths.draft, "drafter", lambda n: (n[6:] if n.startswith("model.") else n) in own,
                       _plan(drafter.cfg, dist.world_size, dist.rank), None)


def weight_bytes(*models) -> int:
    """Bytes of this rank's parameters (the packed copies of the invariant kernels excluded)."""
    return sum(p.numel() * p.element_size() for m in models if m is not None for p in m.parameters())


# ---- engine: SPMD ---------------------------------------------------------------------------------------------

def setup(cfg, paths, tcfg: TargetConfig, dcfg: DraftConfig | None) -> Distributed | None:
    """Resolve and validate the TP size; join the ranks' group when it is > 1 (None when alone)."""
    from .distributed import env_world, init_distributed

    world = env_world()[1]
    tp, source = resolve_tp_size(cfg.tp_size, paths.engine, world)
    validate_tp(tp, tcfg, dcfg)
    if tp != world:
        raise DFlashError(f"{source} is {tp} but {world} rank(s) are running: launch with `mpirun -n {tp} ...`"
                          + (f" or pass --tp-size {world}" if world in TP_SIZES else ""))
    if tp == 1:
        return None
    return init_distributed(cfg.device)


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
