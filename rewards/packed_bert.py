"""A BERT encoder forward pass over *packed* texts: no padding tokens, one matrix product per layer.

The reward encoders see many short texts (VQA answers: 3-10 wordpieces). The usual forward pads
each batch to its longest text and multiplies the padding too; here every text's tokens are laid
one after the other, sorted by length, so each dense layer is one product over exactly the real
tokens, and attention runs per group of equal-length texts, which are contiguous slabs of that
matrix (no mask, nothing gathered). The arithmetic is the model's own (its weights, its
LayerNorms and activation); only the summation order inside the matrix products can differ, so
outputs agree with ``model(input_ids, attention_mask)`` to float rounding (~1e-6), which the
tests check. Query, key and value projections are fused into one product.

Supported: ``transformers`` ``BertModel`` (MiniLM, PubMedBERT, BioBERT) in eval mode with absolute
positions; :func:`supports` says whether a model qualifies, the encoders fall back to the padded
forward otherwise.
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import torch
import torch.nn.functional as F


def supports(model) -> bool:
    """Whether :class:`PackedBert` can run ``model`` (a plain BERT encoder)."""
    cfg = getattr(model, "config", None)
    return (cfg is not None and getattr(cfg, "model_type", None) == "bert"
            and getattr(cfg, "position_embedding_type", "absolute") == "absolute"
            and not getattr(cfg, "is_decoder", False) and hasattr(model, "embeddings")
            and hasattr(model, "encoder") and not model.training)


class PackedBert:
    """Runs a loaded ``BertModel`` on lists of token ids; returns each text's last hidden states."""

    def __init__(self, model) -> None:
        if not supports(model):
            raise ValueError(f"expected a BertModel in eval mode with absolute positions, got {type(model).__name__}")
        self.model = model
        self.heads = model.config.num_attention_heads
        self._qkv = []  # one fused (3H x H) projection per layer
        for layer in model.encoder.layer:
            s = layer.attention.self
            weight = torch.cat([s.query.weight, s.key.weight, s.value.weight]).detach().contiguous()
            bias = torch.cat([s.query.bias, s.key.bias, s.value.bias]).detach().contiguous()
            self._qkv.append((weight, bias))

    @torch.inference_mode()
    def __call__(self, ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[int], list[int]]:
        """Last hidden states of every token, packed: ``(x, starts, lengths)`` where text ``i`` is
        ``x[starts[i]:starts[i] + lengths[i]]`` (texts are laid out shortest first)."""
        if not ids:
            return torch.zeros(0, self.model.config.hidden_size), [], []
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        lengths = [len(ids[i]) for i in order]
        if lengths[0] == 0:
            raise ValueError("expected every text to have at least one token (its [CLS])")
        flat = torch.tensor(list(chain.from_iterable(ids[i] for i in order)), dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths])
        groups = []  # (start token, number of texts, length) of each run of equal lengths
        start = k = 0
        while k < len(lengths):
            j = k
            while j < len(lengths) and lengths[j] == lengths[k]:
                j += 1
            groups.append((start, j - k, lengths[k]))
            start += (j - k) * lengths[k]
            k = j
        m = self.model
        emb = m.embeddings
        x = emb.word_embeddings(flat) + emb.token_type_embeddings.weight[0] + emb.position_embeddings(positions)
        x = emb.LayerNorm(x)
        for layer, (w_qkv, b_qkv) in zip(m.encoder.layer, self._qkv):
            x = self._layer(layer, x, w_qkv, b_qkv, groups)
        starts, sizes = [0] * len(ids), [0] * len(ids)
        pos = 0
        for i, n in zip(order, lengths):
            starts[i], sizes[i] = pos, n
            pos += n
        return x, starts, sizes

    def _layer(self, layer, x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor, groups) -> torch.Tensor:
        hidden = x.shape[1]
        heads, size = self.heads, hidden // self.heads
        qkv = F.linear(x, w_qkv, b_qkv)
        context = torch.empty_like(x)
        for start, n, length in groups:
            block = qkv[start:start + n * length].view(n, length, 3, heads, size).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(block[0], block[1], block[2])  # (n, heads, L, size)
            context[start:start + n * length] = attended.transpose(1, 2).reshape(n * length, hidden)
        attn = layer.attention.output
        x = attn.LayerNorm(attn.dense(context) + x)
        h = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))
        return layer.output.LayerNorm(layer.output.dense(h) + x)
