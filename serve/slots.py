"""The model's forward pass over a key/value cache with one row per sequence.

A replica decodes the sequences of many requests together: one forward per step for the whole
batch, each sequence at its own position with its own cache. Transformers' caches keep a batch at
one shared position (left padding) and cannot take a sequence in or out mid-flight, so the batch
would have to be re-padded every time a request arrives or ends. Here the cache is one tensor per
layer with a row per sequence; a sequence is prefilled into a free row, decoded with the others
(its attention masked to its own length), and its row is given back when it ends. Active rows
are kept packed at the front (`move`), so a step reads the cache as views, never as copies.

The projections, norms, MLPs and rotary embedding are the model's own modules (so their weights,
biases, rope scaling and per-head norms are whatever the checkpoint says); only attention over the
cache is written here. Llama-family decoders (Llama, SmolLM, Qwen 2/3, Mistral without a sliding
window) are served this way; `supports()` says whether a model is one.
"""

from __future__ import annotations

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

    @torch.inference_mode()
    def prefill(self, row: int, ids: list[int]) -> torch.Tensor:
        """Run a sequence's prompt (or more of it) into its row; the logits of its last position."""
        start = self.lengths[row]
        n = len(ids)
        if n == 0:
            raise ValueError("nothing to prefill")
        self._room(start + n)
        x = self.inner.embed_tokens(torch.tensor([ids], device=self.device))
        positions = torch.arange(start, start + n, device=self.device)[None]
        cos, sin = self.inner.rotary_emb(x, positions)
        # attention: position i of the new tokens sees the cached ones and new ones up to i
        total = start + n
        mask = torch.ones(n, total, dtype=torch.bool, device=self.device).tril(diagonal=start)[None, None]
        for li, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            q, k, v = self._qkv(layer.self_attn, h, cos, sin)
            self.k[li, row, :, start:total] = k[0]
            self.v[li, row, :, start:total] = v[0]
            keys = self.k[li, row:row + 1, :, :total]
            values = self.v[li, row:row + 1, :, :total]
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True,
                                               scale=self._scale(layer.self_attn))
            x = x + layer.self_attn.o_proj(a.transpose(1, 2).reshape(1, n, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.lengths[row] = total
        return self.model.lm_head(self.inner.norm(x[:, -1]))[0]

    @torch.inference_mode()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """One token for each of rows 0..len(tokens)-1, at each row's own position: logits (B, V)."""
        b = len(tokens)
        lengths = torch.tensor(self.lengths[:b], device=self.device)
        total = int(lengths.max()) + 1
        self._room(total)
        x = self.inner.embed_tokens(torch.tensor(tokens, device=self.device)[:, None])     # (B, 1, H)
        cos, sin = self.inner.rotary_emb(x, lengths[:, None])
        mask = (torch.arange(total, device=self.device)[None] <= lengths[:, None])[:, None, None]   # (B,1,1,T)
        rows = torch.arange(b, device=self.device)
        for li, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            q, k, v = self._qkv(layer.self_attn, h, cos, sin)
            self.k[li, rows, :, lengths] = k[:, :, 0]
            self.v[li, rows, :, lengths] = v[:, :, 0]
            a = F.scaled_dot_product_attention(q, self.k[li, :b, :, :total], self.v[li, :b, :, :total],
                                               attn_mask=mask, enable_gqa=True, scale=self._scale(layer.self_attn))
            x = x + layer.self_attn.o_proj(a.transpose(1, 2).reshape(b, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        for r in range(b):
            self.lengths[r] += 1
        return self.model.lm_head(self.inner.norm(x[:, 0]))

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
