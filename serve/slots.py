"""The model's forward pass over a key/value cache with one row per sequence.

A replica decodes the sequences of many requests together: one forward per step for the whole
batch, each sequence at its own position with its own cache. Transformers' caches keep a batch at
one shared position (left padding) and cannot take a sequence in or out mid-flight, so the batch
would have to be re-padded every time a request arrives or ends. Here the cache is one tensor per
layer with a row per sequence; a sequence is prefilled into a free row, decoded with the others
(its attention masked to its own length), and its row is given back when it ends. Active rows
are kept packed at the front (`move`), so a step reads the cache as views, never as copies. A
prompt may go in by chunks, each in the same forward as a decoding step of the other rows
(`forward`), so that a long prompt does not stop them for its whole length.

The projections, norms, MLPs and rotary embedding are the model's own modules (so their weights,
biases, rope scaling and per-head norms are whatever the checkpoint says); only attention over the
cache is written here. Llama-family decoders (Llama, SmolLM, Qwen 2/3, Mistral without a sliding
window) are served this way; `supports()` says whether a model is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F


def supports(model: Any) -> str | None:
    """None if `model` can be served by SlotModel, else why not."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "not a Llama-family decoder (model.model.layers and model.model.rotary_emb)"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) \
            and cfg.model_type not in ("llama", "qwen2", "qwen3"):
        return "sliding-window attention"
    layer = inner.layers[0]
    attn = getattr(layer, "self_attn", None)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not hasattr(attn, name):
            return f"attention without {name}"
    return None


class SlotModel:
    """A causal LM's forward over a row-per-sequence cache (see the module note). Not
    thread-safe: one decoding loop owns it."""

    def __init__(self, model: Any, *, max_rows: int = 16, max_len: int = 4096, initial_len: int = 256):
        why = supports(model)
        if why is not None:
            raise ValueError(f"SlotModel cannot serve this model: {why}")
        cfg = model.config
        self.model = model
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.max_rows = max_rows
        self.max_len = min(max_len, getattr(cfg, "max_position_embeddings", max_len) or max_len)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.lengths = [0] * max_rows
        self._alloc(min(initial_len, self.max_len))

    @torch.inference_mode()
    def _alloc(self, length: int) -> None:
        shape = (len(self.layers), self.max_rows, self.n_kv, length, self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        old = getattr(self, "k", None)
        if old is not None:
            n = old.shape[3]
            k[:, :, :, :n] = old
            v[:, :, :, :n] = self.v
        self.k, self.v = k, v

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def _room(self, length: int) -> None:
        if length > self.max_len:
            raise ValueError(f"a sequence of {length} tokens is longer than the model's {self.max_len}")
        if length > self.capacity:
            new = self.capacity
            while new < length:
                new *= 2
            self._alloc(min(new, self.max_len))

    def reset(self, row: int) -> None:
        self.lengths[row] = 0

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Move a sequence's cache from row src to row dst (to keep the active rows packed)."""
        if src == dst:
            return
        n = self.lengths[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0

    def prefill(self, row: int, ids: list[int]) -> torch.Tensor:
        """Run a sequence's prompt (or more of it: a chunk after the ones it holds) into its row;
        the logits of its last position."""
        if not ids:
            raise ValueError("nothing to prefill")
        return self.forward([], row, ids)[0]

    def decode(self, tokens: list[int]) -> torch.Tensor:
        """One token for each of rows 0..len(tokens)-1, at each row's own position: logits (B, V)."""
        return self.forward(tokens)

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], row: int = -1, ids: Sequence[int] = ()) -> torch.Tensor:
        """One decoding step for rows 0..B-1 (`tokens`, one each, at each row's own position) and,
        in the same forward, `ids` prefilled into `row` after what it holds (a prompt, or a chunk
        of one): the decoded rows' logits (B, V), then, when `ids` is given, one more row, the
        logits of its last position.

        Why one forward: on a CPU a decoding step reads every weight for a handful of tokens, so
        prompt tokens riding along cost only their compute; a prompt chunk run as a forward of its
        own between steps would read the weights again. The projections and MLPs see all the
        tokens as one sequence; only attention is split (each decoded row against its own cache,
        the prompt chunk causally against its row's).

        The rows' lengths change only once everything has succeeded: a forward that raises leaves
        every row as it was (what it wrote lies past their lengths and is written again)."""
        b, n = len(tokens), len(ids)
        if b + n == 0:
            raise ValueError("nothing to run")
        if n and not b <= row < self.max_rows:
            raise ValueError(f"row {row} cannot take a prompt beside {b} decoded rows")
        before = self.lengths[:b]
        start = self.lengths[row] if n else 0
        total = start + n                                   # the prompt row's length after
        dtotal = max(before) + 1 if b else 0                 # the keys the decoded rows see
        self._room(max(total, dtotal))
        x = self.inner.embed_tokens(torch.tensor([[*tokens, *ids]], device=self.device))     # (1, B+n, H)
        lengths = torch.tensor(before, dtype=torch.long, device=self.device)
        positions = torch.cat((lengths, torch.arange(start, total, device=self.device)))[None]
        cos, sin = self.inner.rotary_emb(x, positions)
        if b:
            rows = torch.arange(b, device=self.device)
            dmask = (torch.arange(dtotal, device=self.device)[None] <= lengths[:, None])[:, None, None]   # (B,1,1,T)
        if n:
            # position i of the chunk sees the cached tokens and the chunk's own up to i
            pmask = torch.ones(n, total, dtype=torch.bool, device=self.device).tril(diagonal=start)[None, None]
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, layer.input_layernorm(x), cos, sin)      # (1, heads, B+n, D)
            parts = []
            if b:
                self.k[li, rows, :, lengths] = k[0, :, :b].transpose(0, 1)
                self.v[li, rows, :, lengths] = v[0, :, :b].transpose(0, 1)
                a = F.scaled_dot_product_attention(q[0, :, :b, None].transpose(0, 1), self.k[li, :b, :, :dtotal],
                                                   self.v[li, :b, :, :dtotal], attn_mask=dmask, enable_gqa=True,
                                                   scale=self._scale(attn))       # (B, heads, 1, D)
                parts.append(a.transpose(1, 2).reshape(1, b, -1))
            if n:
                self.k[li, row, :, start:total] = k[0, :, b:]
                self.v[li, row, :, start:total] = v[0, :, b:]
                a = F.scaled_dot_product_attention(q[:, :, b:], self.k[li, row:row + 1, :, :total],
                                                   self.v[li, row:row + 1, :, :total], attn_mask=pmask,
                                                   enable_gqa=True, scale=self._scale(attn))    # (1, heads, n, D)
                parts.append(a.transpose(1, 2).reshape(1, n, -1))
            x = x + attn.o_proj(parts[0] if len(parts) == 1 else torch.cat(parts, 1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        last = x[0, :b] if not n else x[0, :b + 1] if n == 1 else torch.cat((x[0, :b], x[0, -1:]))
        logits = self.model.lm_head(self.inner.norm(last))
        for r in range(b):
            self.lengths[r] += 1
        if n:
            self.lengths[row] = total
        return logits

    def _scale(self, attn: Any) -> float:
        return getattr(attn, "scaling", None) or self.head_dim ** -0.5

    def _qkv(self, attn: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = h.shape
        q = attn.q_proj(h).view(b, t, self.n_heads, self.head_dim)
        k = attn.k_proj(h).view(b, t, self.n_kv, self.head_dim)
        v = attn.v_proj(h).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if hasattr(attn, "q_norm"):          # Qwen 3: a norm over each head before the rotation
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)         # (B, heads, T, D)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
