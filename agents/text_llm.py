"""``TextLLMAgent``: a text-only chat LLM (SmolLM2-135M-Instruct here) as a MedVQA agent.

It cannot see pixels: each image becomes the text ``[image i]`` and tool results arrive as the
tools' text (zoom regions, segmentation areas, detections, class scores). That makes it the
"tools as text" ablation and a cheap, real model for exercising the whole loop on a CPU.

Prompts are rendered with the tokenizer's own chat template, with the tools' schemas passed as
``tools=``. When the template renders those schemas itself (Qwen, Llama 3.1, Hermes templates),
the env's system prompt is swapped for a tool-free one so the schemas are not shown twice; when
it ignores them (SmolLM2's template) the env's system prompt, which lists them, is kept.
Generation is batched (left padding) with the sampling settings given.

A checkpoint written by this project's trainers (a folder with ``medvqa_run.json``) is run as it
was trained: ``chat_format="chatml"`` renders the chat exactly as the trainers' encoder
(:class:`agents.models.ChatEncoder`) did -- plain ChatML, the env's system prompt as it is (or the
trainer's override), no ``tools=`` -- with its image placeholder; the same token ids as in
training. ``chat_format="template"`` (the default for any other model) uses the tokenizer's chat
template as described above. Passing a setting that differs from the checkpoint's logs a warning.

Generation follows the same rule: a trainer's checkpoint decodes as its trainer evaluated it on
held-out questions (greedy, the run's ``max_new_tokens``: ``medvqa_run.json``'s ``generation``
block), so ``eval.run`` reproduces the figure the trainer printed; sampling is an explicit choice
(``temperature=0.7``), warned about. Any other model samples at ``temperature=0.7, top_p=0.9``.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from agents.base import Agent
from medvqa_env.chat import Conversation
from medvqa_env.errors import ConfigError

log = logging.getLogger(__name__)
CHAT_FORMATS = ("template", "chatml")

TOOL_FREE_SYSTEM = (
    "You are a medical imaging assistant answering questions about radiology and pathology images. "
    "You may call the tools you are given to inspect the images; their results come back in the next "
    "message. Images are numbered in the order they appear (image 0 is the original).\n\n{instruction}"
)


class TextLLMAgent(Agent):
    """A causal LM with a chat template, generating one turn per conversation, batched.

    Args:
        model: ``"smollm2"`` (the packaged SmolLM2-135M-Instruct), a local checkpoint folder, or an
            already loaded model (then pass ``tokenizer``).
        tokenizer: the tokenizer when ``model`` is a loaded model.
        max_new_tokens, temperature, top_p, top_k, repetition_penalty: sampling settings
            (``temperature=0`` is greedy); default: a trainer's checkpoint decodes as it was
            evaluated in training (greedy, its ``max_new_tokens``), any other model with
            ``temperature=0.7, top_p=0.9, max_new_tokens=128``.
        batch_size: conversations per ``generate`` call.
        seed: each ``act_batch`` call seeds torch with ``seed + call number`` (reproducible runs).
        system_prompt: replaces the system prompt entirely when given (default: the prompt a
            trainer saved with the checkpoint, else the env's).
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``float32``, ``bfloat16`` or ``float16`` (strings as on the command line).
        max_prompt_tokens: longer prompts keep their system turn and their most recent tokens.
        chat_format: ``"template"`` (the tokenizer's chat template with ``tools=``) or ``"chatml"``
            (as the trainers encode); default: the checkpoint's ``medvqa_run.json``, else ``"template"``.
    """

    name = "text-llm"
    image_text = "[image {index}]"

    def __init__(self, model: Any = "smollm2", tokenizer: Any = None, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                 repetition_penalty: float | None = None, batch_size: int = 8, seed: int = 0,
                 system_prompt: str | None = None, max_prompt_tokens: int = 4096, device: str = "auto",
                 dtype: str | torch.dtype = "float32", chat_format: str | None = None) -> None:
        if (max_new_tokens is not None and max_new_tokens < 1) or batch_size < 1 or (temperature is not None and temperature < 0):
            raise ValueError(f"expected max_new_tokens >= 1, batch_size >= 1, temperature >= 0, got "
                             f"{max_new_tokens!r}, {batch_size!r}, {temperature!r}")
        from agents.devices import resolve_device, resolve_dtype

        self.model_name = model if isinstance(model, str) else type(model).__name__
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        if chat_format is not None and chat_format not in CHAT_FORMATS:
            raise ConfigError(f"expected chat_format in {CHAT_FORMATS}, got {chat_format!r}")
        self.saved_system_prompt: str | None = None  # the prompt a trainer saved with the checkpoint
        self.trained = trained_rendering(model)  # how a trainer encoded this checkpoint ({} otherwise)
        self.trained_generation = trained_generation(model)  # how its trainer decoded held-out questions
        self.model, self.tokenizer = self._load(model, tokenizer, dtype, device)
        self.model.eval()
        self.device, self.dtype = device, dtype
        self.sampling, self.generation_source = self._resolve_sampling(max_new_tokens, temperature, top_p)
        self.sampling.update(top_k=top_k, repetition_penalty=repetition_penalty)
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.system_prompt = system_prompt if system_prompt is not None else self.saved_system_prompt
        if system_prompt is not None and self.saved_system_prompt not in (None, system_prompt):
            log.warning("system_prompt= replaces the prompt this checkpoint was trained with (%.60r...)",
                        self.saved_system_prompt)
        self.max_prompt_tokens = int(max_prompt_tokens)
        self.chat_format = self._trained_or_given("chat_format", chat_format, "template")
        if self.chat_format == "chatml" and self.trained.get("image_token") and type(self)._image_token is TextLLMAgent._image_token:
            self.image_text = str(self.trained["image_token"])  # the trainer's placeholder, e.g. "<image>"
        self._calls = 0
        self._template_renders_tools: bool | None = None

    # ---- loading ------------------------------------------------------------------------------
    def _load(self, model: Any, tokenizer: Any, dtype: torch.dtype, device: str):
        if not isinstance(model, str):
            if tokenizer is None:
                raise ConfigError("expected tokenizer= together with a loaded model")
            return model.to(device), tokenizer
        from agents.models import load_policy

        loaded, encoder, kind = load_policy(model, dtype=dtype, device=device)
        self.saved_system_prompt = encoder.system_prompt
        if kind != "text":
            raise ConfigError(f"expected a text-only causal LM for {self.name!r}, got a {kind} model from {model!r}; "
                              "use the 'vlm' agent for vision-language models")
        return loaded, encoder.tokenizer

    def _resolve_sampling(self, max_new_tokens: int | None, temperature: float | None,
                          top_p: float | None) -> tuple[dict[str, Any], str]:
        """The decoding settings and where they came from: ``"checkpoint"`` (the trainer's
        held-out decoding, for every setting not given), ``"given"`` or ``"default"``."""
        trained = self.trained_generation
        given = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
        if trained:
            base = {"max_new_tokens": trained.get("max_new_tokens", 128), "temperature": 0.0, "top_p": 1.0}
            if temperature is not None and temperature > 0:
                log.warning("temperature=%s samples, but this checkpoint's trainer evaluated it greedily: the "
                            "figures will differ from the trainer's held-out figures", temperature)
            if max_new_tokens is not None and max_new_tokens != base["max_new_tokens"]:
                log.warning("max_new_tokens=%s differs from the %s this checkpoint was evaluated with in training",
                            max_new_tokens, base["max_new_tokens"])
        else:
            base = {"max_new_tokens": 128, "temperature": 0.7, "top_p": 0.9}
        source = "given" if all(v is not None for v in given.values()) else ("checkpoint" if trained else "default")
        out = {k: (given[k] if given[k] is not None else base[k]) for k in base}
        out["max_new_tokens"], out["temperature"], out["top_p"] = (int(out["max_new_tokens"]), float(out["temperature"]),
                                                                   float(out["top_p"]))
        return out, source

    @property
    def greedy(self) -> bool:
        """Every turn is decoded greedily (``temperature=0``): K samples of a question are one answer."""
        return self.sampling["temperature"] <= 0

    def _trained_or_given(self, name: str, given: Any, default: Any) -> Any:
        """``given`` if set (with a warning when it differs from the checkpoint's), else the
        checkpoint's ``medvqa_run.json`` value, else ``default``."""
        trained = self.trained.get(name)
        if given is None:
            return trained if trained is not None else default
        if trained is not None and given != trained:
            log.warning("%s=%r differs from the %r this checkpoint was trained with", name, given, trained)
        return given

    # ---- prompts -------------------------------------------------------------------------------
    def _image_token(self, index: int) -> str:
        return self.image_text.format(index=index)

    def chat_messages(self, conversation: Conversation) -> list[dict[str, str]]:
        """String-content messages (images as :attr:`image_text`), tool turns as user turns."""
        out = []
        for m in conversation.messages:
            content = m["content"]
            if m["role"] == "tool" and m.get("images"):
                content = [{"type": "image", "image_index": i} for i in m["images"]] + [{"type": "text", "text": content}]
            if isinstance(content, list):
                content = "\n".join(self._image_token(p["image_index"]) if p.get("type") == "image"
                                    else p.get("text", "") for p in content)
            role = "user" if m["role"] == "tool" else m["role"]
            out.append({"role": role, "content": content})
        return out

    def render(self, conversation: Conversation) -> str:
        """The prompt text for ``conversation`` (chat template, ``tools=``, generation prompt)."""
        if self.chat_format == "chatml":
            return self.render_chatml(conversation)
        messages = self.chat_messages(conversation)
        tools = list(conversation.info.get("tools") or []) or None
        if messages and messages[0]["role"] == "system":
            if self.system_prompt is not None:
                messages[0] = {"role": "system", "content": self.system_prompt}
            elif tools and self._renders_tools(tools):
                messages[0] = {"role": "system", "content": _tool_free_system(conversation)}
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        # No template (a bare base model): ChatML, which SmolLM2 and Qwen both use.
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + "<|im_start|>assistant\n"

    def render_chatml(self, conversation: Conversation) -> str:
        """The chat as the trainers encode it (:meth:`agents.models.ChatEncoder.conversation`):
        each message ``<|im_start|>role`` (tool turns as ``user``, their images first), its parts
        joined by newlines, ``<|im_end|>``; the system prompt replaced only by an override."""
        text = []
        for m in conversation.messages:
            content = m["content"]
            if m["role"] == "system" and self.system_prompt is not None:
                content = self.system_prompt
            if m["role"] == "tool" and m.get("images"):
                content = [{"type": "image", "image_index": i} for i in m["images"]] + [{"type": "text", "text": content}]
            parts = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
            pieces = [self._image_token(p["image_index"]) if p.get("type") == "image" else p.get("text", "")
                      for p in parts]
            role = "user" if m["role"] == "tool" else m["role"]
            text.append(f"<|im_start|>{role}\n" + "\n".join(x for x in pieces if x) + "<|im_end|>\n")
        return "".join(text) + "<|im_start|>assistant\n"

    def _renders_tools(self, tools: list[dict[str, Any]]) -> bool:
        if self._template_renders_tools is None:
            if not getattr(self.tokenizer, "chat_template", None):
                self._template_renders_tools = False
            else:
                probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
                with_tools = self.tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
                self._template_renders_tools = with_tools != self.tokenizer.apply_chat_template(probe, tokenize=False)
        return self._template_renders_tools

    def encode(self, conversations: Sequence[Conversation]) -> dict[str, torch.Tensor]:
        """Left-padded ``input_ids`` / ``attention_mask`` for a batch."""
        rows = [self._truncate(self.tokenizer(self.render(c), add_special_tokens=False)["input_ids"])
                for c in conversations]
        return _left_pad(rows, self._pad_id())

    def _truncate(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.max_prompt_tokens:
            return ids
        # keep the first turn (system + question) and the most recent context
        head = self.max_prompt_tokens // 2
        return ids[:head] + ids[len(ids) - (self.max_prompt_tokens - head):]

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.tokenizer.eos_token_id if pad is None else pad

    # ---- generation ----------------------------------------------------------------------------
    def generation_kwargs(self) -> dict[str, Any]:
        s = self.sampling
        kwargs: dict[str, Any] = {"max_new_tokens": s["max_new_tokens"], "pad_token_id": self._pad_id()}
        eos = self.model.generation_config.eos_token_id
        kwargs["eos_token_id"] = eos if eos is not None else self.tokenizer.eos_token_id
        if s["temperature"] > 0:
            kwargs.update(do_sample=True, temperature=s["temperature"], top_p=s["top_p"])
            if s["top_k"] is not None:
                kwargs["top_k"] = int(s["top_k"])
        else:
            kwargs["do_sample"] = False
        if s["repetition_penalty"] is not None:
            kwargs["repetition_penalty"] = float(s["repetition_penalty"])
        return kwargs

    def act_batch(self, conversations: Sequence[Conversation]) -> list[str]:
        self._calls += 1
        torch.manual_seed(self.seed + self._calls)
        out: list[str] = []
        for start in range(0, len(conversations), self.batch_size):
            chunk = conversations[start:start + self.batch_size]
            inputs = {k: v.to(self.device) for k, v in self.encode(chunk).items()}
            with torch.inference_mode():
                generated = self.model.generate(**inputs, **self.generation_kwargs())
            new = generated[:, inputs["input_ids"].shape[1]:]
            out.extend(self.tokenizer.decode(row, skip_special_tokens=True).strip() for row in new)
        return out

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model_name, "batch_size": self.batch_size, "seed": self.seed,
                "dtype": str(self.dtype).removeprefix("torch."), "chat_format": self.chat_format,
                **({"system_prompt": self.system_prompt} if self.system_prompt is not None else {}),
                **{k: v for k, v in self.sampling.items() if v is not None},
                "decoding": "greedy" if self.greedy else "sampled", "generation_source": self.generation_source}


def trained_rendering(model: Any) -> dict[str, Any]:
    """How a trainer encoded the checkpoint folder ``model`` (``medvqa_run.json``'s ``encoder``
    block: ``chat_format``, ``max_image_side``, ``image_token``); ``{}`` for anything else."""
    from pathlib import Path

    if not isinstance(model, str) or not Path(model).expanduser().is_dir():
        return {}
    from agents.models import read_run_file

    return dict(read_run_file(Path(model).expanduser()).get("encoder") or {})


def trained_generation(model: Any) -> dict[str, Any]:
    """How a trainer decoded the checkpoint folder ``model`` on its held-out questions: the
    ``generation`` block of ``medvqa_run.json``, or ``{"do_sample": False}`` for a trainer's
    checkpoint written before that block existed (every trainer here evaluates greedily, with its
    ``args.max_new_tokens``); ``{}`` for anything that is not a trainer's checkpoint."""
    from pathlib import Path

    if not isinstance(model, str) or not Path(model).expanduser().is_dir():
        return {}
    from agents.models import read_run_file

    run = read_run_file(Path(model).expanduser())
    if not run:
        return {}
    if run.get("generation"):
        return dict(run["generation"])
    out: dict[str, Any] = {"do_sample": False}
    if (run.get("args") or {}).get("max_new_tokens"):
        out["max_new_tokens"] = int(run["args"]["max_new_tokens"])
    return out


def _left_pad(rows: Sequence[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad token rows into ``input_ids`` and ``attention_mask``.

    >>> _left_pad([[5, 6], [7]], 0)["input_ids"].tolist()
    [[5, 6], [0, 7]]
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _tool_free_system(conversation: Conversation) -> str:
    from agents.baselines import answer_protocol_of
    from medvqa_env.parser import get_answer_protocol

    return TOOL_FREE_SYSTEM.format(instruction=get_answer_protocol(answer_protocol_of(conversation)).instruction)
