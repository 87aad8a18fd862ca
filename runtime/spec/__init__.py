"""The speculative method: what a proposer proposes, how many tokens it may propose (policy), and how the
target's verification turns proposals into committed tokens. The engine asks the proposer what it needs
(`needs_target_features`, `needs_state_rollback`, ...) instead of testing which method runs.

    interface.py  the Proposer contract and its capability queries
    policy.py     every draft-length decision: cap, schedule, adaptive cost model, gate, confidence cut
    dflash.py     the DFlash block drafter and its context cache queue
    dflash2.py    DFlash2: the same block pass, then the drafter's candidate selector (sampled drafts carry q)
    ngram.py      prompt lookup: drafts copied from the request's own earlier tokens
    verify.py     one verification dispatch (torch / compiled ops / vocab-split under TP) and acceptance
"""
from .config import SpecConfig  # noqa: F401
from .verify import accept  # noqa: F401

NGRAM_DEFAULT_K = 7  # as many as the embedded DFlash pair drafts: the policy shortens it where rows cost


def make_proposer(cfg: SpecConfig, target, drafter, draft_caches, page_size: int, device, ops=None,
                  scratch: tuple[int, int] = (0, 0)):
    """The proposer of cfg.method (an autoregressive engine gets the no-op one). scratch: (first slot, slots) of
    the drafter caches' rows outside every block table (kv_cache.KVPlan.draft_scratch)."""
    from .interface import Proposer

    if cfg.method == "dflash":
        from ..models.dflash2 import DFlash2Drafter

        if isinstance(drafter, DFlash2Drafter):  # the drafter decides: a DFlash2 checkpoint drafts with its selector
            from .dflash2 import DFlash2Proposer
            return DFlash2Proposer(drafter, target, draft_caches, page_size, device, ops)
        from .dflash import DFlashProposer
        trim = str(device).startswith("cpu") if cfg.trim_draft_block is None else cfg.trim_draft_block
        return DFlashProposer(drafter, target, draft_caches, page_size, device, ops, scratch, trim)
    if cfg.method == "ngram":
        from .ngram import NGramProposer
        return NGramProposer(cfg.ngram_max, cfg.ngram_min, NGRAM_DEFAULT_K)
    return Proposer()
