"""Dense decoder targets (Llama 2/3.x, SmolLM2, Qwen3) with a paged KV cache and hidden-state capture.

Parameter names mirror Hugging Face's so a checkpoint loads by name. The forward takes a packed batch of
rows from many sequences (prefill chunks, verify blocks, decode tokens) and returns the final hidden states
plus, when asked, the OUTPUTS of the drafter's target layers concatenated in id order.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..attention import AttentionBatch, paged_attention
from ..config import TargetConfig
from ..greedy_head import GreedyHead
from ..rope import RotaryTable, apply_rope


# Bumped by every write of a Linear's packed or fp8 weight and of a layer's `fusable` flag, so a layer's cached
# one-op state (built from them) is checked with one comparison per call instead of walking its modules.
_WEIGHTS_EPOCH = [0]


class FusableLayer(nn.Module):
    """A decoder layer the C++ layer op may run (`fusable`, set by fuse_layer; False: the modules run)."""
    fusable = property(lambda self: self.__dict__.get("_fusable", False))

    @fusable.setter
    def fusable(self, value):
        self.__dict__["_fusable"] = value
        _WEIGHTS_EPOCH[0] += 1


class Linear(nn.Module):
    packed = property(lambda self: self.__dict__["_packed"])
    fp8 = property(lambda self: self.__dict__["_fp8"])

    @packed.setter
    def packed(self, value):
        self.__dict__["_packed"] = value
        _WEIGHTS_EPOCH[0] += 1

    @fp8.setter
    def fp8(self, value):
        self.__dict__["_fp8"] = value
        _WEIGHTS_EPOCH[0] += 1

    def __init__(self, in_f: int, out_f: int, bias: bool = False, row_parallel: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_f, in_f), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_f), requires_grad=False) if bias else None
        self.packed = None  # batch-invariant packed weight (ops.pack), set by pack_linears
        self.fp8 = None  # (e4m3 weight, weight scale, input scale or None): native FP8 GEMM (runtime/fp8_weights.py)
        # reductions of layers tensor parallelism splits along K are summed in 8 fixed chunks, so any TP size
        # up to 8 reproduces the TP=1 bits (see plugins/invariant.py)
        self.k_splits = 8 if row_parallel and in_f % 8 == 0 else 1

    def forward(self, x):
        if self.fp8 is not None:
            return ops.fp8_linear(x, *self.fp8, self.bias)
        return ops.linear(x, self.weight, self.bias, self.packed, self.k_splits)


def pack_linears(model: nn.Module) -> None:
    """Pack every Linear for the batch-invariant kernels (inference only)."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.packed = ops.pack(m.weight.data)


class FusedProjection:
    """Linears reading the same input (q/k/v, gate/up) as one packed weight: one kernel call, each member's
    output a view of it, bitwise what the member computes alone (plugins/layer.py). The members keep working
    on their own (their packed weights become views of the fused panels, or with `share` False stay as they
    are and the fusion holds a copy: a linear that is already a member of another fusion); a member whose weight
    is replaced afterwards (FP8 re-packing, native FP8) is noticed by `current` and the fusion rebuilt or
    dropped."""

    def __init__(self, members: list[Linear], cat, share: bool = True):
        from ..plugins import layer

        self.members = members
        self.packed = cat.packed
        self.cols = cat.cols
        self.sizes = [m.packed.n for m in members]
        self.bias = layer.concat_bias([m.bias for m in members], self.sizes, self.cols, cat.packed.n)
        self.views = cat.views
        if share:
            for m, v in zip(members, cat.views):
                m.packed = v
        self.sources = [m.packed for m in members]

    @staticmethod
    def build(members: list[Linear], share: bool = True) -> "FusedProjection | None":
        """None unless every member is a plain packed Linear of the batch-invariant kernels with the same
        bias presence (tensor-parallel and native-FP8 linears stay separate)."""
        if not ops.invariant_enabled() or any(type(m) is not Linear or m.fp8 is not None for m in members):
            return None
        if len({m.bias is None for m in members}) != 1 or len({m.k_splits for m in members}) != 1:
            return None
        from ..plugins import layer

        cat = layer.concat_packed([m.packed for m in members])
        return None if cat is None else FusedProjection(members, cat, share)

    def current(self) -> bool:
        return all(m.packed is v and m.fp8 is None for m, v in zip(self.members, self.sources))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        y = ops.linear(x, None, self.bias, self.packed, self.members[0].k_splits)
        return [y[..., c:c + n] for c, n in zip(self.cols, self.sizes)]


def _current(fused: FusedProjection | None, members: list[Linear]) -> FusedProjection | None:
    """The fusion of members if it still matches their weights, else a new one (or None)."""
    if fused is None or fused.current():
        return fused
    return FusedProjection.build(members)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.gate_proj = Linear(hidden, inter, bias)
        self.up_proj = Linear(hidden, inter, bias)
        self.down_proj = Linear(inter, hidden, bias, row_parallel=True)
        self.gate_up: FusedProjection | None = None  # set by fuse_projections

    def forward(self, x):
        if self.gate_up is not None:
            self.gate_up = _current(self.gate_up, [self.gate_proj, self.up_proj])
            if self.gate_up is not None and ops._use_bi(x):
                return self.down_proj(ops.silu_mul(*self.gate_up(x)))
        return self.down_proj(ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h, b = cfg.hidden_size, cfg.attention_bias
        self.q_proj = Linear(h, self.n_heads * self.head_dim, b)
        self.k_proj = Linear(h, self.n_kv * self.head_dim, b)
        self.v_proj = Linear(h, self.n_kv * self.head_dim, b)
        self.o_proj = Linear(self.n_heads * self.head_dim, h, b, row_parallel=True)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale = self.head_dim ** -0.5
        self.window: int | None = None  # sliding-window layers of the families set it
        self.qkv: FusedProjection | None = None  # set by fuse_projections

    def forward(self, x, cos, sin, kv_cache, batch: AttentionBatch):
        t = x.shape[0]
        if self.qkv is not None:
            self.qkv = _current(self.qkv, [self.q_proj, self.k_proj, self.v_proj])
        if self.qkv is not None and ops._use_bi(x):
            q, k, v = (y.view(t, -1, self.head_dim) for y in self.qkv(x))
        else:
            q = self.q_proj(x).view(t, -1, self.head_dim)
            k = self.k_proj(x).view(t, -1, self.head_dim)
            v = self.v_proj(x).view(t, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], batch, self.scale, window=self.window)
        return self.o_proj(o.reshape(t, -1))


class DecoderLayer(FusableLayer):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._fused = None  # (the sources it was built from, plugins/layer.py state)

    def forward(self, x, cos, sin, kv_cache, batch):
        if self.fusable and batch.kernel_args is not None and x.dim() == 2 and ops._use_bi(x):
            state = fused_layer_state(self, x, cos, kv_cache)
            if state is not None:
                from ..plugins import layer
                return layer.run(state, x, cos, sin, kv_cache, batch)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


def fused_layer_state(layer, x, cos, kv_cache):
    """The C++ layer op's state of a fused layer (`fuse_layer`: a target's DecoderLayer or a drafter's layer) for
    this call (the same bits as its modules), built once and kept on the layer until a linear's weights change; None when the call cannot run
    as one op. A drafter's layers (attention `causal` False) attend non-causally."""
    f = layer._fused
    if (f is not None and f[2] == _WEIGHTS_EPOCH[0] and f[0][-1] is x.dtype and cos.dtype == x.dtype
            and kv_cache[0].dtype in _CACHE_DTYPES):
        return f[1]  # no linear's weights changed since it was built
    att, mlp = layer.self_attn, layer.mlp
    if att.window is not None or cos.dtype != x.dtype or kv_cache[0].dtype not in _CACHE_DTYPES:
        return None
    att.qkv = _current(att.qkv, [att.q_proj, att.k_proj, att.v_proj])
    mlp.gate_up = _current(mlp.gate_up, [mlp.gate_proj, mlp.up_proj])
    src = (att.qkv, mlp.gate_up, att.o_proj.packed, mlp.down_proj.packed, x.dtype)
    if layer._fused is not None and all(a is b for a, b in zip(layer._fused[0], src)):
        layer._fused = (src, layer._fused[1], _WEIGHTS_EPOCH[0])
        return layer._fused[1]
    layer._fused = None
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if att.q_norm is not None:
        norms += [att.q_norm, att.k_norm]
    if (att.qkv is None or mlp.gate_up is None or any(type(m) is not Linear or m.packed is None or m.fp8
                                                       is not None for m in (att.o_proj, mlp.down_proj))
            or any(n.weight.dtype != x.dtype for n in norms) or norms[0].eps != norms[1].eps
            or norms[2:] and norms[2].eps != norms[3].eps):
        return None
    from ..plugins import layer as fused

    if not fused.available():
        return None
    state = fused.make_state(
        in_norm=norms[0].weight, post_norm=norms[1].weight,
        q_norm=None if att.q_norm is None else att.q_norm.weight,
        k_norm=None if att.k_norm is None else att.k_norm.weight,
        eps=norms[0].eps, qk_eps=norms[2].eps if att.q_norm is not None else 0.0, attn_scale=att.scale,
        heads=att.n_heads, kv_heads=att.n_kv, head_dim=att.head_dim,
        qkv=att.qkv.packed, qkv_bias=att.qkv.bias, qkv_cols=att.qkv.cols,
        o=att.o_proj.packed, o_bias=att.o_proj.bias, o_k_splits=att.o_proj.k_splits,
        gate_up=mlp.gate_up.packed, gate_up_bias=mlp.gate_up.bias, up_col=mlp.gate_up.cols[1],
        inter=mlp.gate_up.sizes[0],
        down=mlp.down_proj.packed, down_bias=mlp.down_proj.bias, down_k_splits=mlp.down_proj.k_splits,
        causal=getattr(att, "causal", True))
    layer._fused = (src, state, _WEIGHTS_EPOCH[0])
    return state


_CACHE_DTYPES = (torch.float32, torch.bfloat16)


def stack_state(owner, layers, x: torch.Tensor, cos: torch.Tensor, caches, norm: "RMSNorm",
                fusable=lambda layer: layer.fusable):
    """The fused_decoder_stack state of `layers` and the final `norm` after them for a call like this one, or
    None when a layer cannot run as the C++ layer op. Every input of that verdict (the weights' epoch, which
    fusing bumps too, the dtypes, the caches) is compared first, so a step walks the layers only after one of
    them changed."""
    key = (_WEIGHTS_EPOCH[0], x.dtype, cos.dtype, caches[0][0].dtype if caches else None)
    memo = getattr(owner, "_stack_memo", None)
    if memo is not None and memo[0] == key and memo[1] is caches and memo[2] is layers and memo[3] is norm.weight:
        return memo[4]
    states = [fused_layer_state(layer, x, cos, cache) if fusable(layer) else None
              for layer, cache in zip(layers, caches)]
    stack = None if not states or any(s is None for s in states) else cached_stack(owner, states, norm)
    owner._stack_memo = (key, caches, layers, norm.weight, stack)
    return stack


def cached_stack(owner, states: list, norm: "RMSNorm"):
    """The fused_decoder_stack state of these layer states and final norm, kept on `owner` and rebuilt whenever
    a layer's state or the norm's weight is."""
    # (the layer states and norm weight it was built from, the stack state); families that skip
    # TargetModel.__init__ have none
    key, cached = getattr(owner, "_stack", (([], None), None))
    if (cached is None or key[1] is not norm.weight or len(key[0]) != len(states)
            or any(a is not b for a, b in zip(key[0], states))):
        from ..plugins import layer

        cached = layer.make_stack(states, norm.weight, norm.eps)
        owner._stack = ((states, norm.weight), cached)
    return cached


def fuse_projections(model: nn.Module) -> None:
    """After pack_linears: q/k/v and gate/up of every exactly-dense layer as one packed weight each, and
    those layers marked for the C++ layer op. Subclassed layers (families' windows, sinks, other norms) and
    tensor-parallel linears keep their own path."""
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        if type(layer) is DecoderLayer:
            fuse_layer(layer, Attention)


def fuse_layer(layer, attention_type) -> None:
    """One layer's q/k/v and gate/up fused and the layer marked `fusable` when its parts are exactly
    `attention_type`, MLP, Linear and RMSNorm (anything else keeps the op-by-op path)."""
    att, mlp = layer.self_attn, layer.mlp
    if type(att) is not attention_type or type(mlp) is not MLP:
        return
    if type(att.o_proj) is not Linear or type(mlp.down_proj) is not Linear:  # tensor parallel
        return
    if any(type(n) is not RMSNorm for n in (layer.input_layernorm, layer.post_attention_layernorm,
                                             att.q_norm or layer.input_layernorm,
                                             att.k_norm or layer.input_layernorm)):
        return
    att.qkv = FusedProjection.build([att.q_proj, att.k_proj, att.v_proj])
    mlp.gate_up = FusedProjection.build([mlp.gate_proj, mlp.up_proj])
    layer.fusable = att.qkv is not None and mlp.gate_up is not None
    layer._fused = None


class Backbone(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TargetModel(nn.Module):
    def __init__(self, cfg: TargetConfig, max_positions: int = 4096):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size)
        self.rotary = RotaryTable(cfg.rope, cfg.head_dim, max_positions)
        self.capture_ids: list[int] = []
        self.head_packed = None

    @property
    def head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: final-normed rows; float32 logits (also the drafter's head: it has none of its own)."""
        return ops.linear(hidden, self.head_weight, packed=self.head_packed).float()

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax token, exactly `logits(hidden).argmax(-1)`: from the screened head
        (runtime/greedy_head.py) where it pays (GreedyHead.takes; rows it declines teach it its outlier dimensions),
        else from the packed head with the argmax in the same op. None: compute the logits (no batch-invariant
        kernels or panels, tensor parallelism, a family's own logits)."""
        if not ops._use_bi(hidden):
            return None
        gh = self.prepare_greedy_head()
        if gh is not None and gh.takes(hidden.shape[0]):
            ids = gh.tokens(hidden)
            if ids is not None:
                return ids
            gh.observe(hidden)
        if not self._plain_packed_head():
            return None
        return ops.head_argmax(hidden, self.head_packed)[0]  # the same logits' argmax, in one op

    def _plain_packed_head(self) -> bool:
        """The head is this class's packed head, whole: not a family's own logits, not split by tensor
        parallelism."""
        return (self.head_packed is not None and type(self).logits is TargetModel.logits
                and getattr(self, "tp", None) is None)

    def prepare_greedy_head(self) -> GreedyHead | None:
        """The greedy screen of the head's current panels, made once (its int8 codes and norms); None where the
        head is not screened (8-bit or no panels, tensor parallelism, a family's own logits)."""
        packed = self.head_packed
        if "_screened" not in vars(self) or self._screened is not packed:  # not built, or built for other panels
            ok = self._plain_packed_head() and GreedyHead.screens(packed)
            self.greedy_screen = GreedyHead(self.head_weight.data, packed) if ok else None
            self._screened = packed
        return self.greedy_screen

    def pack(self) -> None:
        pack_linears(self)
        fuse_projections(self)
        self.head_packed = ops.pack(self.head_weight.data)

    # Per-request recurrent state (linear-attention hybrids override these): bytes of one request's state, its
    # pool, and the per-layer view of the cached layers' KV caches the forward indexes by layer
    def state_bytes_per_request(self) -> int:
        return 0

    def new_state_pool(self, slots: int, device="cpu"):
        return None

    def layer_caches(self, caches: list) -> list:
        return caches

    def forward(self, ids, positions, kv_caches, batch: AttentionBatch, capture: bool = False):
        x = self.embed(ids)
        cos, sin = self.rotary(positions, x.dtype)
        stack = self._fused_stack(x, cos, kv_caches, batch)
        if stack is not None:  # every layer in one op: one crossing into C++ per step instead of one per layer
            from ..plugins import layer

            # the final norm and the captured features come out of the op too (as `finish` makes them)
            out = layer.run_stack(stack, x, cos, sin, kv_caches, batch, self.capture_ids if capture else [])
            return out[0], out[1] if capture else None
        captured = {}
        want = set(self.capture_ids) if capture else ()
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, kv_caches[i], batch)
            if i in want:
                captured[i] = x
        return self.finish(x, captured, capture)

    def _fused_stack(self, x, cos, kv_caches, batch):
        """The fused_decoder_stack state when every layer can run as the C++ layer op, else None."""
        if batch.kernel_args is None or x.dim() != 2 or not ops._use_bi(x) or type(self.model.norm) is not RMSNorm:
            return None
        return stack_state(self, self.model.layers, x, cos, kv_caches, self.model.norm,
                           lambda layer: type(layer) is DecoderLayer and layer.fusable)

    def finish(self, x: torch.Tensor, captured: dict, capture: bool):
        """Final norm, and the captured layer outputs concatenated in the drafter config's order (duplicates
        allowed), as the z-lab reference does. The reference reads transformers' hidden_states[id + 1]; for the
        LAST layer that entry is after the final norm (transformers replaces it with the normed output), so a
        capture of layer L-1 is the normed output too; every other layer's is its raw residual stream."""
        h = self.model.norm(x)
        if not capture:
            return h, None
        last = len(self.model.layers) - 1
        if last in captured:
            captured[last] = h
        return h, torch.cat([captured[i] for i in self.capture_ids], -1)

    def load_weights(self, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        own = dict(self.named_parameters())
        for name, t in state.items():
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied checkpoints sometimes still carry a copy
            if name not in own:
                continue  # rotary buffers and the like
            if tuple(own[name].shape) != tuple(t.shape):
                from ..errors import CheckpointError
                raise CheckpointError(f"target weight {name} has shape {list(t.shape)}, config implies "
                                      f"{list(own[name].shape)}: config.json does not match the weights")
            own[name].data = t.to(dtype)
        missing = [n for n in own if n not in state]
        if missing:
            from ..errors import CheckpointError
            raise CheckpointError(f"target checkpoint lacks {len(missing)} weights, e.g. {missing[0]}")
