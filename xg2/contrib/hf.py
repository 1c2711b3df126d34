"""A transformers LogitsProcessor (xgrammar's ``contrib.hf.LogitsProcessor``): ``model.generate(...,
logits_processor=[LogitsProcessor(compiled)])`` samples only what the grammar allows, for a whole
batch, one grammar for every row or one per row.

Each call accepts the token each unfinished row sampled last, fills the batch's masks with one
BatchGrammarMatcher call and masks the scores. A row whose matcher has accepted its stop token is
finished: generate() pads it from then on, so its tokens are not fed to the matcher and its scores
are left alone. Columns past the tokenizer's vocabulary (a model's padded embedding) are masked:
no grammar allows a token that has no text. Unlike xgrammar's, one processor may serve several
generate() calls: a call whose input is not the last one plus a token starts anew.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import transformers

from ..batch_matcher import BatchGrammarMatcher
from ..compiler import CompiledGrammar
from ..errors import UsageError
from ..kernels import allocate_token_bitmask, apply_token_bitmask_inplace
from ..matcher import GrammarMatcher


class LogitsProcessor(transformers.LogitsProcessor):
    """Constrains transformers' generate() to compiled grammars (one for all rows, or one per row)."""

    def __init__(self, compiled_grammar: CompiledGrammar | Sequence[CompiledGrammar]):
        grammars = [compiled_grammar] if isinstance(compiled_grammar, CompiledGrammar) else list(compiled_grammar)
        if not grammars or not all(isinstance(g, CompiledGrammar) for g in grammars):
            raise TypeError("compiled_grammar must be an xg2.CompiledGrammar or a non-empty list of them")
        sizes = {g.tokenizer_info.vocab_size for g in grammars}
        if len(sizes) != 1:
            raise UsageError("the grammars are compiled for vocabularies of different sizes")
        self.compiled_grammars = grammars
        self.full_vocab_size = sizes.pop()
        self.matchers: list[GrammarMatcher] = []
        self.token_bitmask: torch.Tensor | None = None
        self._batch = BatchGrammarMatcher(max_threads=1)
        self._last_len = -1     # input length at the last call; -1: no generation under way

    def _start(self, batch_size: int) -> None:
        if len(self.compiled_grammars) not in (1, batch_size):
            raise UsageError(f"{len(self.compiled_grammars)} grammars for a batch of {batch_size}: give one "
                             "grammar, or one per row")
        grammars = self.compiled_grammars * batch_size if len(self.compiled_grammars) == 1 else self.compiled_grammars
        self.matchers = [GrammarMatcher(g) for g in grammars]
        self.token_bitmask = allocate_token_bitmask(batch_size, self.full_vocab_size)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        continuing = self.matchers and batch == len(self.matchers) and length == self._last_len + 1
        if not continuing:
            self._start(batch)
        else:
            last = input_ids[:, -1].tolist()
            for i, (m, token) in enumerate(zip(self.matchers, last)):
                if not m.is_terminated() and not m.accept_token(token):
                    raise UsageError(f"row {i}: token {token} was sampled although the grammar refuses it "
                                     "(another processor or a sampler changed the scores after this one)")
        self._last_len = length
        live = [i for i, m in enumerate(self.matchers) if not m.is_terminated()]
        if live:
            self._batch.batch_fill_next_token_bitmask([self.matchers[i] for i in live], self.token_bitmask, live)
            bitmask = self.token_bitmask.to(scores.device, non_blocking=True)    # no copy on the CPU
            apply_token_bitmask_inplace(scores, bitmask, indices=live, vocab_size=min(self.full_vocab_size, scores.shape[-1]))
        if scores.shape[-1] > self.full_vocab_size:
            scores[:, self.full_vocab_size:] = float("-inf")
        return scores
