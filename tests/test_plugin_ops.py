"""The DFlash custom ops (plugins/csrc) against their pure-PyTorch reference (plugins/reference.py), and the
reference against the runtime's own definitions (dflash_trt.sampling, dflash_trt.spec, the drafter's
write_context arithmetic). Seeded loops, > 1000 random cases in all, ~30 s on 2 cores."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from dflash_trt import sampling as rt_sampling
from dflash_trt.plugins import dflash_ops, reference as ref
from dflash_trt.spec import accept as rt_accept

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not dflash_ops.available(),
                                reason=f"the C++ extension did not build: {dflash_ops.load_error()}")
OPS = torch.ops.dflash_trt if dflash_ops.available() else None


def _eq(got, want, what=""):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype == torch.int64, (what, i, a.dtype, b.dtype)
        assert torch.equal(a, b), f"{what}: output {i} differs\n got {a}\nwant {b}"


# -------------------------------------------------------------------------------------------- batches
def ragged(g: torch.Generator, r: int, k_max: int, *, gaps: bool = False, lens: list[int] | None = None):
    """draft_lens, row_offsets and the row count of a packed batch (optionally with rows nobody owns)."""
    if lens is None:
        lens = torch.randint(0, k_max + 1, (r,), generator=g).tolist()
        if r:
            lens[int(torch.randint(0, r, (1,), generator=g))] = k_max
    offs, at = [], 0
    for k in lens:
        at += int(torch.randint(0, 3, (1,), generator=g)) if gaps else 0
        offs.append(at)
        at += k + 1
    n = at + (int(torch.randint(0, 3, (1,), generator=g)) if gaps else 0)
    return torch.tensor(lens, dtype=torch.int64), torch.tensor(offs, dtype=torch.int64), n


def drafts_for(g, choice, lens, offs, k_max, vocab, mode="random"):
    """Drafts whose accepted length is chosen: 'all', 'none' or random; padding holds garbage."""
    r = lens.shape[0]
    d = torch.randint(-5, max(vocab, 1), (r, k_max), generator=g)
    for i in range(r):
        k, o = int(lens[i]), int(offs[i])
        a = k if mode == "all" else 0 if mode == "none" else int(torch.randint(0, k + 1, (1,), generator=g))
        d[i, :a] = choice[o:o + a]
        if a < k:
            if vocab > 1:
                d[i, a] = (choice[o + a] + 1 + torch.randint(0, vocab - 1, (1,), generator=g)) % vocab
            else:
                d[i, a] = choice[o + a] + 1
    return d


def logits_for(g, n, vocab, dtype=torch.float32, ties=False, scale=3.0):
    if ties:  # few distinct values: exercises first-index tie breaking and exact top-k / top-p boundaries
        x = torch.randint(-2, 3, (n, vocab), generator=g).float()
    else:
        x = torch.randn(n, vocab, generator=g) * scale
    return x.to(dtype)


# ----------------------------------------------------------------------------- reference vs the runtime
def test_reference_rng_is_the_runtime_rng():
    g = torch.Generator().manual_seed(1)
    seeds = torch.cat([torch.randint(-2 ** 62, 2 ** 62, (200,), generator=g), torch.tensor([0, 1, 2 ** 63 - 1])])
    pos = torch.cat([torch.randint(0, 2 ** 40, (200,), generator=g), torch.tensor([0, 2 ** 32 - 1, 2 ** 32])])
    assert torch.equal(ref.uniforms(seeds, pos), rt_sampling.uniforms(seeds, pos))


def test_reference_sampler_is_sample_rows():
    g = torch.Generator().manual_seed(2)
    for case in range(60):
        vocab = int(torch.randint(1, 300, (1,), generator=g))
        logits = logits_for(g, 6, vocab, ties=case % 3 == 0)
        params = [rt_sampling.SamplingParams(temperature=[0.0, 0.5, 1.0, 1.7][i % 4], top_k=[0, 3, 50, -1][i % 4],
                                             top_p=[1.0, 0.9, 0.5, 0.2][(i + case) % 4], seed=case * 7 + i)
                  for i in range(6)]
        positions = [int(torch.randint(0, 10 ** 6, (1,), generator=g)) for _ in range(6)]
        want = rt_sampling.sample_rows(logits, params, positions).tolist()
        got = [ref.sample_one(logits[i], p.temperature, p.top_k, p.top_p, p.seed, positions[i])
               for i, p in enumerate(params)]
        assert got == want


def test_reference_accept_is_spec_accept():
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        lens, offs, n = ragged(g, 4, 6, gaps=True)
        choice = torch.randint(0, 5, (n,), generator=g)
        d = drafts_for(g, choice, lens, offs, 6, 5)
        acc, com, cnt = ref._accept(d, lens, offs, choice)
        for r in range(4):
            k, o = int(lens[r]), int(offs[r])
            a, committed = rt_accept(d[r, :k].tolist(), choice[o:o + k + 1].tolist())
            assert int(acc[r]) == a and int(cnt[r]) == a + 1 and com[r, :a + 1].tolist() == committed
            assert (com[r, a + 1:] == -1).all()


# ----------------------------------------------------------------------------------- prepare_draft_blocks
def _prepare_case(g, r, page, block, max_start, extra):
    starts = torch.randint(0, max_start + 1, (r,), generator=g)
    max_blocks = max(1, (max_start + page - 1) // page + int(torch.randint(0, 3, (1,), generator=g)))
    tables = torch.stack([torch.randperm(4 * max_blocks * max(r, 1), generator=g)[:max_blocks] for _ in range(r)]) \
        if r else torch.zeros(0, max_blocks, dtype=torch.int64)
    last = torch.randint(0, 1000, (r,), generator=g)
    cap = int(starts.sum()) + extra
    return last, starts, tables, block, 4242, page, cap


def test_prepare_draft_blocks_random():
    g = torch.Generator().manual_seed(10)
    for case in range(250):
        r = int(torch.randint(0, 9, (1,), generator=g))
        page = int(torch.randint(1, 20, (1,), generator=g))
        block = int(torch.randint(1, 17, (1,), generator=g))
        args = list(_prepare_case(g, r, page, block, int(torch.randint(0, 80, (1,), generator=g)),
                                  int(torch.randint(0, 5, (1,), generator=g))))
        if case % 2:
            args[0], args[1], args[2] = args[0].int(), args[1].int(), args[2].int()
        _eq(OPS.dflash_prepare_draft_blocks(*args), ref.prepare_draft_blocks(*args), f"case {case}")


def test_prepare_draft_blocks_matches_model_runner_slots():
    """ctx_slots equal DFlashProposer.slots(table, 0, start) and the block ids the proposer builds."""
    from dflash_trt.spec.dflash import DFlashProposer

    runner = DFlashProposer.__new__(DFlashProposer)
    runner.page, runner.device = 16, torch.device("cpu")
    tables = [[7, 3, 9], [2], [11, 4, 5]]
    starts, last = [37, 0, 40], [5, 6, 7]
    bt = torch.tensor([t + [0] * (3 - len(t)) for t in tables])
    ids, pos, slots, offs = dflash_ops.prepare_draft_blocks(torch.tensor(last), torch.tensor(starts), bt,
                                                            block_size=8, mask_token_id=99, page_size=16)
    for r in range(3):
        assert torch.equal(slots[offs[r]:offs[r + 1]], runner.slots(tables[r], 0, starts[r]))
        assert ids[r * 8:(r + 1) * 8].tolist() == [last[r]] + [99] * 7
        assert pos[r * 8:(r + 1) * 8].tolist() == list(range(starts[r], starts[r] + 8))


def test_prepare_draft_blocks_refuses_bad_input():
    last, starts, tables = torch.tensor([1]), torch.tensor([33]), torch.tensor([[0, 1]])
    with pytest.raises(RuntimeError, match="pages"):
        OPS.dflash_prepare_draft_blocks(last, starts, tables, 4, 0, 16, 64)
    with pytest.raises(RuntimeError, match="num_ctx_slots"):
        OPS.dflash_prepare_draft_blocks(last, torch.tensor([20]), tables, 4, 0, 16, 10)


# ------------------------------------------------------------------------------------------ greedy_verify
GREEDY_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def test_greedy_verify_random():
    g = torch.Generator().manual_seed(20)
    for case in range(450):
        k_max = [1, 2, 3, 7, 15][case % 5]
        r = int(torch.randint(1, 9, (1,), generator=g))
        vocab = int(torch.randint(1, 400, (1,), generator=g))
        lens, offs, n = ragged(g, r, k_max, gaps=case % 3 == 0)
        logits = logits_for(g, n, vocab, GREEDY_DTYPES[case % 4], ties=case % 5 == 0)
        if case % 7 == 0:  # a row-strided view (last dim contiguous)
            logits = torch.cat([logits, logits[:, :3]], 1)[:, :vocab]
        choice = torch.argmax(logits, -1)
        d = drafts_for(g, choice, lens, offs, k_max, vocab, ["random", "all", "none"][case % 3])
        if case % 4 == 0:
            d, lens = d.int(), lens.int()
        ro = torch.cat([offs, torch.tensor([n])]) if case % 2 else offs
        _eq(OPS.dflash_greedy_verify(d, lens, logits, ro), ref.greedy_verify(d, lens, logits, ro), f"case {case}")


def test_greedy_verify_edges():
    g = torch.Generator().manual_seed(21)
    for k_max in (1, 15):
        for mode in ("all", "none"):
            lens, offs, n = ragged(g, 5, k_max, lens=[k_max] * 5)
            logits = logits_for(g, n, 64)
            d = drafts_for(g, logits.argmax(-1), lens, offs, k_max, 64, mode)
            got = OPS.dflash_greedy_verify(d, lens, logits, offs)
            _eq(got, ref.greedy_verify(d, lens, logits, offs))
            want_a = k_max if mode == "all" else 0
            assert got[1].tolist() == [want_a] * 5 and got[3].tolist() == [want_a + 1] * 5
    # NaN wins and ties go to the first index, as torch.argmax
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [1.0, float("nan"), 5.0, float("nan")], [2.0, 2.0, 2.0, 2.0]])
    got = OPS.dflash_greedy_verify(torch.tensor([[1, 1]]), torch.tensor([2]), logits, torch.tensor([0]))
    assert got[0].tolist() == [1, 1, 0] and got[1].tolist() == [2]
    # an empty batch
    got = OPS.dflash_greedy_verify(torch.zeros(0, 3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                                   torch.zeros(0, 10), torch.zeros(0, dtype=torch.int64))
    assert [t.shape for t in got] == [(0,), (0,), (0, 4), (0,)]
    with pytest.raises(RuntimeError, match="owns logits rows"):
        OPS.dflash_greedy_verify(torch.tensor([[1, 1]]), torch.tensor([2]), logits, torch.tensor([1]))


def test_greedy_verify_argmax_edges_past_the_first_lanes():
    """The float32 argmax (16-lane passes with a masked tail) is torch.argmax's: ties across lanes and chunks go
    to the first index, -0.0 ties 0.0, a NaN anywhere wins, all--inf rows choose 0, any row length."""
    g = torch.Generator().manual_seed(22)
    for n in (1, 15, 16, 17, 31, 33, 49152 + 5):
        rows = torch.randn(9, n, generator=g)
        rows[1] = 2.0  # all equal: index 0
        rows[2, n // 2:] = 50.0  # a tie from the middle on: its first index
        rows[3] = float("-inf")
        rows[4, -1] = float("nan")  # a NaN in the tail
        rows[5, 0] = float("nan")
        rows[6] = -0.0
        rows[6, n - 1] = 0.0  # -0.0 == 0.0: index 0
        rows[7, -1] = 1e30  # the maximum in the masked tail
        rows[8] = rows[8].abs().neg()
        for logits in (rows, torch.cat([rows, rows], 1)[:, :n]):  # contiguous and row-strided
            got = OPS.dflash_greedy_verify(torch.zeros(9, 1, dtype=torch.int64), torch.zeros(9, dtype=torch.int64),
                                           logits, torch.arange(9))
            assert got[0].tolist() == torch.argmax(logits, -1).tolist(), n
        clean = rows[[0, 1, 2, 3, 6, 7, 8]]  # no NaN: the vector path alone decides every row
        got = OPS.dflash_greedy_verify(torch.zeros(7, 1, dtype=torch.int64), torch.zeros(7, dtype=torch.int64),
                                       clean, torch.arange(7))
        assert got[0].tolist() == torch.argmax(clean, -1).tolist(), n


@pytest.mark.parametrize("vocab", [49152, 151936])
def test_greedy_verify_large_vocab(vocab):
    g = torch.Generator().manual_seed(vocab)
    lens, offs, n = ragged(g, 4, 15)
    for dtype in (torch.float32, torch.bfloat16):
        logits = logits_for(g, n, vocab, dtype)
        d = drafts_for(g, logits.argmax(-1), lens, offs, 15, vocab)
        _eq(OPS.dflash_greedy_verify(d, lens, logits, offs), ref.greedy_verify(d, lens, logits, offs))


# ---------------------------------------------------------------------------------------- sampling_verify
TEMPS = [0.0, 0.25, 0.7, 1.0, 1.5]
TOPK = [0, -1, 1, 2, 5, 40, 10 ** 6]
TOPP = [1.0, 0.95, 0.8, 0.5, 0.1, 1e-9]


def _sampling_params(g, r, vocab, case):
    pick = lambda xs: xs[int(torch.randint(0, len(xs), (1,), generator=g))]  # noqa: E731
    temp = torch.tensor([pick(TEMPS) for _ in range(r)], dtype=torch.float64)
    top_k = torch.tensor([pick(TOPK + [vocab, vocab - 1]) for _ in range(r)])
    top_p = torch.tensor([pick(TOPP) for _ in range(r)], dtype=torch.float64)
    seeds = torch.randint(-2 ** 63, 2 ** 63 - 1, (r,), generator=g)
    starts = torch.randint(0, 2 ** 33 if case % 5 == 0 else 5000, (r,), generator=g)
    return starts, seeds, temp, top_k, top_p


def _check_sampling(g, r, k_max, vocab, case, dtype=torch.float32, ties=False, gaps=False, mode="random"):
    lens, offs, n = ragged(g, r, k_max, gaps=gaps)
    logits = logits_for(g, n, vocab, dtype, ties=ties, scale=float(torch.rand(1, generator=g)) * 4 + 0.2)
    starts, seeds, temp, top_k, top_p = _sampling_params(g, r, vocab, case)
    # the expected choices first, so that drafts can be built to be accepted for a while
    choice = ref.sampling_verify(torch.zeros(r, k_max, dtype=torch.int64), lens, logits, offs, starts, seeds,
                                 temp, top_k, top_p)[0]
    d = drafts_for(g, choice, lens, offs, k_max, vocab, mode)
    want = (choice,) + ref._accept(d, lens, offs, choice)
    got = OPS.dflash_sampling_verify(d, lens, logits, offs, starts, seeds, temp, top_k, top_p)
    _eq(got, want, f"case {case}")
    # and the sampled rows are the runtime sampler's tokens, row by row
    rows, params, positions = [], [], []
    for i in range(r):
        for j in range(int(lens[i]) + 1):
            rows.append(int(offs[i]) + j)
            params.append(rt_sampling.SamplingParams(temperature=float(temp[i]), top_k=max(int(top_k[i]), -1),
                                                     top_p=float(top_p[i]), seed=int(seeds[i])))
            positions.append(int(starts[i]) + j + 1)
    if rows:
        assert got[0][rows].tolist() == rt_sampling.sample_rows(logits[rows], params, positions).tolist()


def test_sampling_verify_random():
    g = torch.Generator().manual_seed(30)
    for case in range(420):
        k_max = [1, 3, 4, 15][case % 4]
        r = int(torch.randint(1, 5, (1,), generator=g))
        vocab = int(torch.randint(1, 300, (1,), generator=g))
        _check_sampling(g, r, k_max, vocab, case, dtype=[torch.float32, torch.bfloat16, torch.float16][case % 3],
                        ties=case % 4 == 1, gaps=case % 3 == 2, mode=["random", "all", "none"][case % 3])


def test_sampling_top_p_boundaries():
    """Equal logits make the top-p prefix masses exact multiples: cut exactly at the boundary."""
    for vocab, top_p in ((4, 0.5), (4, 0.25), (8, 0.375), (10, 0.3), (3, 1 / 3)):
        logits = torch.zeros(6, vocab)
        starts = torch.tensor([0, 100]), torch.tensor([11, 12])
        for seeds in starts:
            args = (torch.zeros(2, 2, dtype=torch.int64), torch.tensor([2, 2]), logits, torch.tensor([0, 3]),
                    torch.tensor([5, 9]), seeds, torch.tensor([1.0, 0.5], dtype=torch.float64),
                    torch.tensor([0, 3]), torch.tensor([top_p, top_p], dtype=torch.float64))
            _eq(OPS.dflash_sampling_verify(*args), ref.sampling_verify(*args))


@pytest.mark.parametrize("vocab", [49152, 151936])
def test_sampling_verify_large_vocab(vocab):
    g = torch.Generator().manual_seed(vocab + 1)
    for case in range(2):
        _check_sampling(g, 2, 3, vocab, case, dtype=[torch.float32, torch.bfloat16][case])


# ---------------------------------------------------------------------------------------- context_append
APPEND_DTYPES = [  # (k/v, k_norm weight, cos/sin, caches)
    (torch.float32, torch.float32, torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16, torch.float16, torch.float16),
    (torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32, torch.float32, torch.bfloat16),
]


def _append_case(g, case):
    xt, wt, ct, cache_t = APPEND_DTYPES[case % len(APPEND_DTYPES)]
    t = int(torch.randint(0, 24, (1,), generator=g))
    kvh = int(torch.randint(1, 5, (1,), generator=g))
    d = [2, 8, 64, 128][case % 4]
    blocks, page = int(torch.randint(2, 6, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
    t = min(t, blocks * page)
    k = (torch.randn(t, kvh, d, generator=g) * 2).to(xt)
    v = torch.randn(t, kvh, d, generator=g).to(xt)
    w = (1 + 0.3 * torch.randn(d, generator=g)).to(wt)
    ang = torch.rand(t, d // 2, generator=g) * 100
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(ct), torch.cat([ang.sin()] * 2, -1).to(ct)
    slots = torch.randperm(blocks * page, generator=g)[:t]
    slots[torch.rand(t, generator=g) < 0.2] = -1  # padding rows are skipped
    caches = [torch.randn(blocks, page, kvh, d, generator=g).to(cache_t) for _ in range(2)]
    return k, v, w, cos, sin, slots, caches, 1e-6 if case % 2 else 1e-5


def test_context_append_random():
    g = torch.Generator().manual_seed(40)
    same = total = 0
    for case in range(150):
        k, v, w, cos, sin, slots, (kc, vc), eps = _append_case(g, case)
        kc2, vc2 = kc.clone(), vc.clone()
        OPS.dflash_context_append(k, v, w, cos, sin, slots, kc, vc, eps)
        ref.context_append(k, v, w, cos, sin, slots, kc2, vc2, eps)
        assert torch.equal(vc, vc2), f"case {case}: v"
        if kc.dtype == torch.float32:
            torch.testing.assert_close(kc, kc2, rtol=1e-5, atol=1e-5)
        else:  # the float32 mean of squares is summed in another order: a rare ulp of the normed key, which
            # RoPE's sum can carry into a smaller output
            torch.testing.assert_close(kc.float(), kc2.float(), rtol=2 ** -7 if kc.dtype == torch.bfloat16
                                       else 2 ** -10, atol=2 ** -5 if kc.dtype == torch.bfloat16 else 2 ** -8)
        if kc.dtype != torch.float32:
            same += int((kc == kc2).sum())
            total += kc.numel()
    assert same / total > 0.999, same / total  # 16-bit caches: bit-identical but for those rare ulps


def test_context_append_is_the_drafters_write_context():
    """The op writes what DFlashDrafter.write_context writes (k_norm, RoPE table rows, index_copy_)."""
    from dflash_trt.config import RopeConfig
    from dflash_trt.rope import RotaryTable, apply_rope
    from dflash_trt import ops as rt_ops

    g = torch.Generator().manual_seed(41)
    t, kvh, d = 12, 2, 64
    table = RotaryTable(RopeConfig(theta=1e6), d, 256)
    pos = torch.randint(0, 256, (t,), generator=g)
    cos, sin = table(pos, torch.bfloat16)
    k = torch.randn(t, kvh, d, generator=g).bfloat16()
    v = torch.randn(t, kvh, d, generator=g).bfloat16()
    w = (1 + 0.2 * torch.randn(d, generator=g)).bfloat16()
    slots = torch.randperm(4 * 16, generator=g)[:t]
    kc, vc = torch.zeros(4, 16, kvh, d, dtype=torch.bfloat16), torch.zeros(4, 16, kvh, d, dtype=torch.bfloat16)
    want_k = apply_rope(rt_ops.rms_norm(k, w, 1e-6), cos, sin)
    dflash_ops.context_append(k, v, w, cos, sin, slots, kc, vc, 1e-6)
    got_k = kc.view(-1, kvh, d)[slots]
    torch.testing.assert_close(got_k.float(), want_k.float(), rtol=2 ** -7, atol=2 ** -5)
    assert (got_k == want_k).float().mean() > 0.99
    assert torch.equal(vc.view(-1, kvh, d)[slots], v)


# -------------------------------------------------------------------------- opcheck, fake kernels, compile
def _small_args():
    g = torch.Generator().manual_seed(50)
    lens, offs, n = ragged(g, 3, 4)
    logits = logits_for(g, n, 33)
    d = drafts_for(g, logits.argmax(-1), lens, offs, 4, 33)
    sp = (torch.tensor([7, 8, 9]), torch.tensor([1, 2, 3]), torch.tensor([0.0, 0.8, 1.2], dtype=torch.float64),
          torch.tensor([0, 5, 0]), torch.tensor([1.0, 1.0, 0.7], dtype=torch.float64))
    k, v, w, cos, sin, slots, (kc, vc), eps = _append_case(g, 1)
    return {
        "dflash_prepare_draft_blocks": _prepare_case(g, 3, 4, 8, 20, 3),
        "dflash_greedy_verify": (d, lens, logits, offs),
        "dflash_sampling_verify": (d, lens, logits, offs) + sp,
        "dflash_context_append": (k, v, w, cos, sin, slots, kc, vc, eps),
    }


@pytest.mark.parametrize("name", ["dflash_prepare_draft_blocks", "dflash_greedy_verify", "dflash_sampling_verify",
                                  "dflash_context_append"])
def test_opcheck(name):
    torch.library.opcheck(getattr(OPS, name).default, _small_args()[name])


def test_ops_trace_under_torch_compile():
    args = _small_args()

    def step(d, lens, logits, offs):
        _, acc, com, cnt = OPS.dflash_greedy_verify(d, lens, logits, offs)
        return com, cnt.sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got, want = compiled(*args["dflash_greedy_verify"]), step(*args["dflash_greedy_verify"])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ------------------------------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                    reason="nvcc is not installed")
def test_cuda_kernels_compile_to_sass_for_hopper_and_blackwell():
    # a stable output folder: the script reuses an object it already checked for the same sources
    out = os.path.join(os.environ.get("DFLASH_TRT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                           "dflash_trt"), "check_cuda")
    res = subprocess.run(["bash", os.path.join(ROOT, "plugins", "check_cuda.sh"), out],
                         capture_output=True, text=True, timeout=900)
    if res.returncode == 3:
        pytest.skip(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 0, res.stdout + res.stderr
    for arch in ("sm_90a", "sm_100a", "sm_103a"):
        assert f"SASS {arch}: ok" in res.stdout, res.stdout


@pytest.mark.skipif(os.environ.get("DFLASH_TRT_EMU_TESTS") != "1",
                    reason="CPU emulation of the CUDA kernels: ~1 min, opt in with DFLASH_TRT_EMU_TESTS=1")
def test_cuda_kernels_emulated_on_cpu_match_cpu_ops():
    from dflash_trt.plugins import gpu_check

    assert gpu_check.run_checks(cases=12, verbose=False, emulate=True) == 0


def test_trtllm_custom_module_registers_the_ops(tmp_path):
    """What `trtllm-serve --custom_module_dirs plugins/trtllm_module` does, with dflash_trt NOT importable:
    the module falls back on the plugins/ folder it sits in."""
    script = f"""
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "dflash_trt" or name.startswith("dflash_trt."):
            raise ImportError("blocked")
sys.meta_path.insert(0, Block())
sys.path.insert(0, {os.path.join(ROOT, "plugins")!r})
mod = importlib.import_module("trtllm_module")
import torch
for name in mod.OPS:
    assert hasattr(torch.ops.dflash_trt, name), name
out = torch.ops.dflash_trt.dflash_greedy_verify(torch.tensor([[3]]), torch.tensor([1]),
                                                torch.eye(4)[[3, 1]], torch.tensor([0]))
assert out[2].tolist() == [[3, 1]], out
print("ok", mod.dflash_ops.__name__)
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         cwd=str(tmp_path))
    assert res.returncode == 0 and "ok _dflash_trt_plugins.dflash_ops" in res.stdout, res.stdout + res.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_ops_match_cpu():
    if not dflash_ops.has_cuda_kernels():
        pytest.skip("the extension was built without CUDA kernels")
    from dflash_trt.plugins import gpu_check

    assert gpu_check.run_checks(cases=60, verbose=False) == 0
