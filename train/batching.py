"""Token sequences -> padded model inputs -> per-token log-probs of the response.

Layout: ``[left pad | prompt | response | right pad]``, so every row's response starts at the same
column and the model only has to return logits for the response (``logits_to_keep``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from agents.models import ChatEncoder, mm_token_type_ids


@dataclass
class Sequence_:
    """One training sequence: ``prompt_ids`` are context; ``response_mask`` marks the trained
    response tokens (0 = tool observation or other context inside the response)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    pixel_values: list[torch.Tensor] = field(default_factory=list)
    image_grid_thw: list[torch.Tensor] = field(default_factory=list)


@dataclass
class TokenBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_width: int
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def from_trajectory(traj, prompt) -> Sequence_:
    """A :class:`~train.rollout.Trajectory` (and its prompt's pixels) as a training sequence."""
    pix = ([prompt.pixel_values] if prompt.pixel_values is not None else []) + list(traj.pixel_values)
    grid = ([prompt.image_grid_thw] if prompt.image_grid_thw is not None else []) + list(traj.image_grid_thw)
    return Sequence_(list(traj.prompt_ids), list(traj.response_ids), list(traj.response_mask), pix, grid)


def pad_batch(seqs: Sequence[Sequence_], pad_id: int) -> TokenBatch:
    """Left-pad prompts and right-pad responses to common widths."""
    if not seqs:
        raise ValueError("expected at least one sequence, got none")
    pw = max(len(s.prompt_ids) for s in seqs)
    rw = max(1, max(len(s.response_ids) for s in seqs))
    b = len(seqs)
    ids = torch.full((b, pw + rw), pad_id, dtype=torch.long)
    attn = torch.zeros((b, pw + rw), dtype=torch.long)
    rmask = torch.zeros((b, rw), dtype=torch.float32)
    for i, s in enumerate(seqs):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, pw - p:pw] = torch.tensor(s.prompt_ids, dtype=torch.long)
        attn[i, pw - p:pw + r] = 1
        if r:
            ids[i, pw:pw + r] = torch.tensor(s.response_ids, dtype=torch.long)
            rmask[i, :r] = torch.tensor(s.response_mask, dtype=torch.float32)
    pix = [t for s in seqs for t in s.pixel_values]
    grid = [t for s in seqs for t in s.image_grid_thw]
    return TokenBatch(ids, attn, ids[:, pw:], rmask, pw, torch.cat(pix) if pix else None,
                      torch.cat(grid) if grid else None)


def response_logprobs(model, batch: TokenBatch, encoder: ChatEncoder, temperature: float = 1.0,
                      share_prompts: bool = True, all_logits: bool = False) -> torch.Tensor:
    """``[B, R]`` log-probabilities of the response tokens under ``model`` (float32), from
    ``log_softmax(logits / temperature)``: the distribution the rollouts were sampled from (as verl
    divides the logits by the rollout temperature). SFT uses the default 1.

    Only the trained tokens (``response_mask`` 1) get logits: a tool's observation inside the
    response is context, so its positions skip the output projection and the softmax over the
    vocabulary (for a small model with a large vocabulary, much of its arithmetic). Their entries,
    like padding's, are 0; callers multiply by ``response_mask``. ``all_logits`` computes every
    response position's logits instead (the same values at the trained tokens; for comparison).

    With ``share_prompts`` (text models), rows with the same prompt -- a GRPO group's rollouts --
    run the prompt once: its key/value cache is computed per distinct prompt and repeated for the
    group's responses (gradients flow back through the shared prompt). Same values as one
    forward per row, to float rounding; the prompt costs 1/group_size of the compute."""
    if not temperature > 0:
        raise ValueError(f"expected a temperature > 0, got {temperature!r}")
    device = next(model.parameters()).device
    kwargs = {"input_ids": batch.input_ids.to(device), "attention_mask": batch.attention_mask.to(device)}
    rw = batch.response_ids.shape[1]
    shared = prompt_groups(batch) if share_prompts and batch.pixel_values is None else None
    if batch.pixel_values is not None:
        kwargs.update(pixel_values=batch.pixel_values.to(device, model.dtype),
                      image_grid_thw=batch.image_grid_thw.to(device),
                      mm_token_type_ids=mm_token_type_ids(batch.input_ids, encoder.image_pad_id()).to(device))
    else:
        pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        kwargs["position_ids"] = pos.to(device)
    targets = batch.response_ids.to(device)
    head = None if all_logits else output_head(model)
    if head is None:  # a model whose logits are more than its output projection: compute them all
        if shared is not None:
            logits = _shared_prompt_forward(model, kwargs, batch.prompt_width, rw, *shared, hidden=False).float()
        else:
            logits = model(**kwargs, logits_to_keep=rw + 1, use_cache=False).logits[:, :-1].float()
        if temperature != 1.0:
            logits = logits / temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if shared is not None:
        hidden = _shared_prompt_forward(model, kwargs, batch.prompt_width, rw, *shared, hidden=True)
    else:
        out = model(**kwargs, logits_to_keep=1, use_cache=False, output_hidden_states=True)
        hidden = out.hidden_states[-1][:, -(rw + 1):-1]
    trained = batch.response_mask.to(device) > 0
    logits = head(hidden[trained]).float()  # [trained tokens, vocabulary]
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets[trained].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.zeros(trained.shape, dtype=picked.dtype, device=device).masked_scatter(trained, picked)


LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
"""Config fields of model families whose logits are more than ``lm_head(hidden)`` (Gemma 2's soft
cap, Cohere's and Granite's scales): for them :func:`response_logprobs` takes the model's logits."""


def output_head(model):
    """The output projection that maps the final hidden state to the logits, or ``None`` when the
    model transforms the logits further (:data:`LOGIT_TRANSFORMS`) or has no such module."""
    config = getattr(model, "config", None)
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is not None and any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in LOGIT_TRANSFORMS):
            return None
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def prompt_groups(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first row of each distinct prompt, distinct-prompt index of each row)``, or ``None`` when
    no two rows share a prompt (nothing to save).

    >>> b = pad_batch([Sequence_([1, 2], [3], [1]), Sequence_([1, 2], [4, 5], [1, 1]), Sequence_([7], [8], [1])], 0)
    >>> first, inverse = prompt_groups(b)
    >>> sorted(first.tolist()), inverse.tolist()[0] == inverse.tolist()[1] != inverse.tolist()[2]
    ([0, 2], True)
    """
    pw = batch.prompt_width
    key = torch.cat([batch.input_ids[:, :pw], batch.attention_mask[:, :pw]], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(unique) == len(key):
        return None
    first = torch.full((len(unique),), len(key), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(key)), reduce="amin")
    return first, inverse


def _shared_prompt_forward(model, kwargs: dict, pw: int, rw: int, first: torch.Tensor, inverse: torch.Tensor,
                           hidden: bool):
    """The final hidden states (``hidden``) or the logits at the ``rw`` positions that predict the
    response tokens, running each distinct prompt once (see :func:`response_logprobs`)."""
    device = kwargs["input_ids"].device
    first, inverse = first.to(device), inverse.to(device)
    ids, attn, pos = kwargs["input_ids"], kwargs["attention_mask"], kwargs["position_ids"]

    def last(out):
        return out.hidden_states[-1] if hidden else out.logits

    prompt = model(input_ids=ids[first, :pw], attention_mask=attn[first, :pw], position_ids=pos[first, :pw],
                   use_cache=True, logits_to_keep=1, output_hidden_states=hidden)
    head = last(prompt)[:, -1:][inverse]  # the last prompt position predicts response token 0
    if rw == 1:
        return head
    cache = prompt.past_key_values
    cache.reorder_cache(inverse)  # one copy of the prompt's keys/values per row (index_select: differentiable)
    rest = model(input_ids=ids[:, pw:pw + rw - 1], attention_mask=attn[:, :pw + rw - 1],
                 position_ids=pos[:, pw:pw + rw - 1], past_key_values=cache, use_cache=True,
                 logits_to_keep=1 if hidden else 0, output_hidden_states=hidden)
    return torch.cat([head, last(rest)], dim=1)


def micro_batches(n: int, size: int) -> list[slice]:
    """``[slice(0, size), slice(size, 2 * size), ...]`` covering ``n`` rows.

    >>> micro_batches(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    if size < 1:
        raise ValueError(f"expected a micro-batch size >= 1, got {size!r}")
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def gold_answer_sequence(traj, prompt, encoder: ChatEncoder, gold_text: str) -> Sequence_ | None:
    """GRASP's SFT input: the rollout up to its final turn's reasoning (context, mask 0), then
    ``gold_text`` and end-of-turn (mask 1). The reasoning is the final turn's text before its
    answer (``\\boxed{``/``<answer>``); a final turn without an answer keeps no reasoning."""
    if not traj.turn_starts:
        return None
    last = traj.turn_starts[-1]
    final = traj.turn_texts[-1] if traj.turn_texts else ""
    cuts = [c for c in (final.find("\\boxed"), final.find("<answer>")) if c >= 0]
    reasoning = final[:min(cuts)] if cuts and traj.end_reason == "answer" else ""
    tok = encoder.tokenizer
    ctx = list(traj.response_ids[:last]) + (tok(reasoning, add_special_tokens=False)["input_ids"] if reasoning else [])
    gold = tok(gold_text, add_special_tokens=False)["input_ids"] + [encoder.eos_token_id]
    pix = ([prompt.pixel_values] if prompt.pixel_values is not None else []) + list(traj.pixel_values)
    grid = ([prompt.image_grid_thw] if prompt.image_grid_thw is not None else []) + list(traj.image_grid_thw)
    return Sequence_(list(traj.prompt_ids), ctx + gold, [0] * len(ctx) + [1] * len(gold), pix, grid)
