"""Shared pieces of the transformers engines: loading a real checkpoint by path or hub name, or
building a tiny randomly-initialised model from a config (offline, same code path afterwards).

A tiny model's outputs are meaningless; it exists so that processor -> forward ->
post-processing runs everywhere (tests, CI, this machine). Pass ``model=`` a real checkpoint for
real answers. Image processors are the PIL ones (the default "fast" ones need torchvision).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from medvqa_env.errors import ConfigError

log = logging.getLogger(__name__)

TINY = "tiny-random"
"""The ``model=`` value that builds a tiny random model (the default when no checkpoint is given)."""

CHAR_VOCAB = ["[PAD]", "[BOS]", "[UNK]"] + [chr(c) for c in range(32, 127)] + ["[EOS]"]
EOS_ID = len(CHAR_VOCAB) - 1  # last, so CLIP-style "argmax of ids" pooling finds it too


def require_torch():
    try:
        import torch
    except ImportError:
        raise ConfigError("transformers engines need torch (pip install 'medvqa-gym[vision]')") from None
    return torch


def tiny_tokenizer(max_length: int = 32):
    """A character-level fast tokenizer (ids: 0 pad, 1 bos, 2 unk, last eos), built offline.

    >>> tok = tiny_tokenizer()
    >>> tok("ab")["input_ids"]
    [1, 68, 69, 98]
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(CHAR_VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 1), ("[EOS]", EOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                   unk_token="[UNK]", model_max_length=max_length)


def build_tiny(factory: Callable[[], Any], seed: int = 0):
    """Build with a fixed torch seed so every process gets the same tiny weights (in-process and
    remote results then match), without disturbing the caller's RNG state."""
    torch = require_torch()
    from transformers.utils import logging as hf_logging

    state = torch.random.get_rng_state()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # tiny configs trip harmless "token id outside vocab" notices
    try:
        torch.manual_seed(seed)
        model = factory()
    finally:
        torch.random.set_rng_state(state)
        hf_logging.set_verbosity(verbosity)
    return model.eval()


class TorchEngine:
    """Base for model engines: a lock (one forward at a time per model), a device, and
    ``random_weights`` (True for the tiny random models; tools then say so in their output, see
    :func:`tool_backends.base.random_weights_note`)."""

    random_weights = False

    def __init__(self, device: str = "cpu") -> None:
        require_torch()
        self.device = device
        self.lock = threading.Lock()

    def uses_tiny(self, model: str) -> bool:
        """Whether ``model`` asks for the tiny random model; records it and warns once per engine."""
        self.random_weights = model == TINY
        if self.random_weights:
            log.warning("%s runs a tiny randomly-initialised model: its outputs are meaningless "
                        "(pass model=<checkpoint> for real ones)", type(self).__name__)
        return self.random_weights

    def close(self) -> None:
        if getattr(self, "shared_by_registry", False):  # other tools use it (tool_backends.engines.loaded)
            return
        self.model = None
