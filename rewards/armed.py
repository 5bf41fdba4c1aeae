r"""ARMed's adaptive open-answer reward (seed 000 §4.2, arXiv 2508.12957), batched.

    R_c     = λ1 · BLEU-1 + (1 - λ1) · ROUGE-1
    R_as    = λ2 · BERTScore_adapt + (1 - λ2) · CosSim_adapt
    R_f     = 1 if the format is right else 0
    R_total = (γ1 R_c + γ2 R_as + γ3 R_f) / (γ1 + γ2 + γ3)
    reward  = 2 · R_total - 1

``*_adapt`` is :func:`rewards.adaptive.squash` of the raw score around a threshold that drifts
with a running buffer (:mod:`rewards.adaptive`). The constructor is cheap: encoders load on the
first batch, and are dropped when the reward is pickled (env workers reload them lazily).

Speed: one encoder pass per *distinct* text, references cached across calls (a GRPO group shares
one reference), and with the default MiniLM one pass serves both BERTScore and cosine similarity
(:mod:`rewards.encoders`). ``benchmarks/bench_rewards.py`` measures it against a naive loop.

>>> from medvqa_env.records import AnswerType
>>> r = ARMedReward()
>>> out = r([RewardInput(r"\boxed{left lower lobe}", "left lower lobe", "left lower lobe", AnswerType.OPEN)])
>>> round(out[0].components["bleu1"], 3), round(out[0].components["r_c"], 3)
(1.0, 1.0)
>>> out[0].total > 0.9
True
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from medvqa_env.errors import ConfigError
from rewards.adaptive import AdaptiveConfig, AdaptiveThresholds, squash
from rewards.base import RewardFunction, RewardInput, RewardOutput
from rewards.matching import exact_match_any, references
from rewards.normalize import semantic_text
from rewards.text_metrics import lexical_scores

log = logging.getLogger(__name__)
UNCOVERED = ("text_only", "error")
_WARNED_UNCOVERED: set[str] = set()


@dataclass
class ARMedConfig:
    """Everything ARMed can be told. Defaults: the seed's weights, offline MiniLM encoders."""

    lambda1: float = 0.5
    """Weight of BLEU-1 in R_c (ROUGE-1 gets 1 - lambda1)."""
    lambda2: float = 0.2
    """Weight of adaptive BERTScore in R_as (adaptive cosine gets 1 - lambda2)."""
    gammas: tuple[float, float, float] = (0.4, 0.4, 0.2)
    """Weights of R_c, R_as, R_f in R_total (normalised by their sum)."""
    bertscore_model: str | None = None
    """Local folder of the BERTScore encoder; None = all-MiniLM-L6-v2 (offline). Seed: PubMedBERT."""
    bertscore_layers: int = 6
    """bert-score's ``num_layers`` for that model (seed: 8 for PubMedBERT; MiniLM has 6)."""
    cosine_model: str | None = None
    """Local sentence-transformers folder for CosSim; None = all-MiniLM-L6-v2. Seed: BioBERT-STS."""
    stem: bool = False
    """Porter-stem tokens before BLEU-1/ROUGE-1 (rouge-score's tokenizer either way)."""
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    """Buffer size, percentile, drift, clip range and squashing of the adaptive thresholds."""
    threshold_store: str = "local"
    """'local' (this object owns the buffers) or 'ray' (one named actor owns them for all workers)."""
    ray_actor_name: str | None = None
    """Name of the threshold actor when ``threshold_store='ray'``; None = a fresh name for this
    reward (see :mod:`rewards.adaptive_ray`), so two rewards share thresholds only if given one name."""
    device: str = "cpu"
    """Torch device for the encoders (the seed keeps them on CPU to leave the GPU to rollouts)."""
    batch_size: int = 64
    """Texts per encoder forward pass."""
    uncovered: str = "text_only"
    """What to do with an answer or reference the encoders' vocabulary does not cover (a character
    read as the unknown token: MiniLM reads every Chinese character as ``[UNK]``, so 肺 and 肝 would
    get BERTScore and cosine 1.0). ``text_only`` (default): no BERTScore/cosine for that pair;
    ``R_c`` (BLEU-1/ROUGE-1) stands in for both raw similarities, squashed around the same adaptive
    thresholds (component ``semantic`` 0, nothing enters the buffers, a warning once), so an exact
    answer earns the same in every language; ``error``: refuse with a :class:`ConfigError` naming
    the encoder. An encoder whose vocabulary covers the language (``bertscore_model``/
    ``cosine_model``, a local folder) scores it fully."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.lambda1 <= 1.0 or not 0.0 <= self.lambda2 <= 1.0:
            raise ValueError(f"expected lambda1, lambda2 in [0, 1], got {self.lambda1!r}, {self.lambda2!r}")
        if len(self.gammas) != 3 or min(self.gammas) < 0 or sum(self.gammas) <= 0:
            raise ValueError(f"expected three non-negative gammas with a positive sum, got {self.gammas!r}")
        if self.uncovered not in UNCOVERED:
            raise ValueError(f"expected uncovered in {list(UNCOVERED)}, got {self.uncovered!r}")
        if self.threshold_store not in ("local", "ray"):
            raise ValueError(f"expected threshold_store 'local' or 'ray', got {self.threshold_store!r}")
        if isinstance(self.adaptive, Mapping):
            self.adaptive = AdaptiveConfig(**self.adaptive)

    @classmethod
    def paper(cls, pubmedbert_path: str, biobert_sts_path: str, **overrides: Any) -> "ARMedConfig":
        """The seed's backbones from local folders: PubMedBERT layer 8 for BERTScore
        (``microsoft/BiomedNLP-PubMedBERT-base-uncased-abstract``) and BioBERT-STS for CosSim
        (``pritamdeka/BioBERT-mnli-snli-scinli-scitail-mednli-stsb``)."""
        return cls(bertscore_model=pubmedbert_path, bertscore_layers=8, cosine_model=biobert_sts_path, **overrides)


def _clamp(value: float) -> float:
    return min(1.0, max(-1.0, float(value)))


class ARMedReward(RewardFunction):
    """Seed 000's OPEN reward in [-1, 1]; components are logged as ``reward/<name>``.

    Components: ``bleu1``, ``rouge1``, ``bertscore``, ``cosine`` (raw), ``threshold_bertscore``,
    ``threshold_cosine`` (in force for this batch: scoring never moves them, :meth:`end_batch`
    does), ``bertscore_adapt``, ``cosine_adapt``, ``format``,
    ``r_c``, ``r_as``, ``r_total``, ``semantic`` (1: BERTScore and cosine were computed, on the
    normalised texts; 0: the encoders do not cover the answer or the reference, see
    :attr:`ARMedConfig.uncovered`: ``bertscore``/``cosine`` are absent and ``R_c`` stood in for
    them), ``alternative`` and ``n_alternatives`` (the accepted answer that scored
    best: 0 is the record's ``answer``), and ``accuracy`` (normalised exact match against any
    accepted answer, for logging only). A missing answer scores 0 on every metric and is kept out
    of the threshold buffers; so are pairs the encoders do not cover, and the alternatives that did
    not score best.
    """

    name = "armed"

    def __init__(self, config: ARMedConfig | None = None, *, token_encoder: Any = None, **overrides: Any) -> None:
        if config is not None and overrides:
            raise ValueError(f"expected either a config or keyword overrides, got both ({sorted(overrides)})")
        self.config = config or ARMedConfig(**overrides)
        # ``token_encoder``: an already built :class:`rewards.encoders.TokenEncoder` to share (it must
        # match ``bertscore_model``/``bertscore_layers``); it is still dropped on pickling.
        self._token_encoder = token_encoder
        self._sentence_encoder = None
        if self.config.threshold_store == "ray":
            from rewards.adaptive_ray import RayThresholds, run_actor_name

            # the run's name is written into this reward's config (a copy: the caller's stays as given)
            self.config = replace(self.config, ray_actor_name=self.config.ray_actor_name or run_actor_name())
            self.thresholds = RayThresholds(self.config.adaptive, name=self.config.ray_actor_name)
        else:
            self.thresholds = AdaptiveThresholds(self.config.adaptive)

    # -- lazy encoders --------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_token_encoder": None, "_sentence_encoder": None}

    def _encoders(self):
        from rewards.encoders import SentenceEncoder, TokenEncoder, default_model_path

        c = self.config
        if self._token_encoder is None:
            self._token_encoder = TokenEncoder(c.bertscore_model, c.bertscore_layers, c.batch_size, device=c.device)
        if self._sentence_encoder is None:
            same = (c.cosine_model or default_model_path()) == (c.bertscore_model or default_model_path())
            if not (same and self._token_encoder.sentence_compatible):
                self._sentence_encoder = SentenceEncoder(c.cosine_model, c.batch_size, device=c.device)
        return self._token_encoder, self._sentence_encoder

    @property
    def shares_encoder_pass(self) -> bool:
        """Whether BERTScore and cosine come from one forward pass (True for the MiniLM default)."""
        return self._encoders()[1] is None

    # -- scoring ------------------------------------------------------------------------------
    def covered(self, texts: Sequence[str]) -> list[bool]:
        """Per text: whether the BERTScore and cosine encoders' vocabularies cover it (as the
        encoders read it: :func:`rewards.normalize.semantic_text`)."""
        tok, sent = self._encoders()
        texts = [semantic_text(t) for t in texts]
        ok = tok.covers(texts)
        if sent is not None:
            ok = [a and b for a, b in zip(ok, sent.covers(texts))]
        return ok

    def semantic_scores(self, candidates: Sequence[str], references: Sequence[str]
                        ) -> tuple[list[float | None], list[float | None]]:
        """Raw BERTScore F1 and cosine similarity per pair, of the normalised texts
        (:func:`rewards.normalize.semantic_text`: full-width ``ＣＴ`` is ``ct``, a trailing ``。`` or
        ``.`` goes); an empty candidate -> 0, 0; ``None`` for a pair whose answer *or* reference the
        encoders do not cover (:attr:`ARMedConfig.uncovered`)."""
        from rewards.encoders import bertscore_f1, cosine

        tok, sent = self._encoders()
        candidates = [semantic_text(c) for c in candidates]
        references = [semantic_text(r) for r in references]
        covered = [a and b for a, b in zip(self.covered(candidates), self.covered(references))]
        if not all(covered):
            self._uncovered([r if not rc else c for c, r, ok, rc in
                             zip(candidates, references, covered, self.covered(references)) if not ok])
        enc = tok.encode(list(candidates) + list(references))
        cand_enc, ref_enc = enc[: len(candidates)], enc[len(candidates):]
        bs = [bertscore_f1(c, r) for c, r in zip(cand_enc, ref_enc)]
        if sent is None:
            cos = [cosine(c.sentence, r.sentence) for c, r in zip(cand_enc, ref_enc)]
        else:
            vec = sent.encode(list(candidates) + list(references))
            cos = [cosine(c, r) for c, r in zip(vec[: len(candidates)], vec[len(candidates):])]
        empty = [not c.strip() for c in candidates]
        # float32 encoders give 1.0000001 for identical texts: both scores are cosines, in [-1, 1]
        return ([None if not ok else 0.0 if e else _clamp(b) for b, e, ok in zip(bs, empty, covered)],
                [None if not ok else 0.0 if e else _clamp(x) for x, e, ok in zip(cos, empty, covered)])

    def _uncovered(self, refs: Sequence[str]) -> None:
        c = self.config
        minilm = "all-MiniLM-L6-v2 (English vocabulary)"
        model = (minilm if not (c.bertscore_model or c.cosine_model)
                 else f"{c.bertscore_model or minilm} / {c.cosine_model or minilm}")
        message = (f"ARMed's encoder {model} has no vocabulary for {len(refs)} answer(s) or reference(s), e.g. "
                   f"{refs[0]!r:.40} (read as the unknown token): BERTScore and cosine could not tell a "
                   f"right answer from a wrong one")
        if c.uncovered == "error":
            raise ConfigError(f"{message}; give bertscore_model/cosine_model a local encoder that covers the "
                              f"language, or uncovered='text_only' to let BLEU-1/ROUGE-1 stand in for "
                              f"BERTScore and cosine on them (docs/rewards.md)")
        if model not in _WARNED_UNCOVERED:  # once per encoder and process: the env's and the eval's ARMed alike
            _WARNED_UNCOVERED.add(model)
            log.warning("%s; on such pairs R_c (BLEU-1/ROUGE-1) stands in for BERTScore and cosine "
                        "(uncovered='text_only', docs/rewards.md)", message)

    def __call__(self, batch: Sequence[RewardInput]) -> list[RewardOutput]:
        if not batch:
            return []
        c = self.config
        # every accepted answer of each sample is scored; the best total is the sample's
        owner, cands, refs, alt = [], [], [], []
        for i, s in enumerate(batch):
            for k, ref in enumerate(references(s.ground_truth, s.metadata)):
                owner.append(i)
                alt.append(k)
                cands.append(s.answer if s.answer is not None else "")
                refs.append(ref)
        bleu, rouge = lexical_scores(cands, refs, stem=c.stem)
        bert, cos = self.semantic_scores(cands, refs)
        used = self.thresholds.current()
        a = c.adaptive
        g1, g2, g3 = c.gammas
        best: dict[int, tuple[float, dict[str, float], int]] = {}
        for j, i in enumerate(owner):
            s = batch[i]
            r_c = c.lambda1 * bleu[j] + (1 - c.lambda1) * rouge[j]
            r_f = 1.0 if (s.format_ok and s.answer is not None) else 0.0
            comps = {"bleu1": bleu[j], "rouge1": rouge[j]}
            semantic = bert[j] is not None
            # where the encoders cannot read the pair, R_c stands in for both raw similarities: the
            # same squash, the same thresholds, one scale in every language (an exact answer's
            # raw similarities are 1 either way)
            raw_b, raw_c = (bert[j], cos[j]) if semantic else (r_c, r_c)
            b_ad = squash(raw_b, used["bertscore"], a.alpha_pos, a.alpha_neg)
            c_ad = squash(raw_c, used["cosine"], a.alpha_pos, a.alpha_neg)
            r_as = c.lambda2 * b_ad + (1 - c.lambda2) * c_ad
            r_total = (g1 * r_c + g2 * r_as + g3 * r_f) / (g1 + g2 + g3)
            comps.update({"bertscore_adapt": b_ad, "cosine_adapt": c_ad, "r_as": r_as, "semantic": float(semantic)})
            if semantic:
                comps.update({"bertscore": bert[j], "cosine": cos[j]})
            comps.update({"threshold_bertscore": used["bertscore"], "threshold_cosine": used["cosine"],
                          "format": r_f, "r_c": r_c, "r_total": r_total, "alternative": float(alt[j])})
            if i not in best or r_total > best[i][0]:
                best[i] = (r_total, comps, j)
        keep = [j for _, _, j in best.values() if cands[j].strip() and bert[j] is not None]
        self.thresholds.observe({"bertscore": [bert[j] for j in keep], "cosine": [cos[j] for j in keep]})
        n_refs = Counter(owner)
        out = []
        for i, s in enumerate(batch):
            r_total, comps, _ = best[i]
            comps["n_alternatives"] = float(n_refs[i])
            comps["accuracy"] = float(exact_match_any(s.answer, references(s.ground_truth, s.metadata)))
            out.append(RewardOutput(2.0 * r_total - 1.0, comps))
        return out

    # -- batch boundary and checkpoint state -------------------------------------------------
    def end_batch(self, batch_id: Any = None) -> dict[str, Any]:
        """Move the adaptive thresholds once, from the scores seen since the last boundary."""
        return {"thresholds": self.thresholds.end_batch(batch_id)}

    def close(self) -> None:
        """Let go of the threshold store (the run's Ray actor ends with its last holder)."""
        close = getattr(self.thresholds, "close", None)
        if callable(close):
            close()

    def state_dict(self) -> dict[str, Any]:
        return {"thresholds": self.thresholds.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "thresholds" not in state:
            raise ValueError(f"expected an ARMed state with 'thresholds', got keys {sorted(state)!r}")
        self.thresholds.load_state_dict(state["thresholds"])
