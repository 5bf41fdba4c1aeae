"""Multi-turn rollouts against a pool of env copies, with token-level bookkeeping.

For each slot the rollout keeps one growing token sequence: the prompt, then alternately the
model's own tokens (``response_mask`` 1, trained) and the tool observation tokens the env sent
back (``response_mask`` 0, context only). Observations are encoded once and appended -- the
text is never re-tokenised, so the trained tokens are exactly the sampled ones. For a VLM the
images of tool outputs (crops, overlays) are encoded too and fed back to the model.

Generation of one micro-batch overlaps with the env steps (tools, rewards) of the previous one:
``pool.step_async`` returns at once.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import torch

from agents.models import ChatEncoder, Encoded, mm_token_type_ids
from medvqa_env.chat import Conversation
from medvqa_env.pool import EnvPool, ResetRequest


class Generator(Protocol):
    """Produces the next turn's token ids (ending with the end-of-turn id when finished)."""

    def generate(self, contexts: Sequence[Encoded], convs: Sequence[Conversation]) -> list[list[int]]: ...


@dataclass
class Trajectory:
    """One episode as tokens plus what the env said about it."""

    slot: int
    group: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    pixel_values: list[torch.Tensor] = field(default_factory=list)
    image_grid_thw: list[torch.Tensor] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    correct: bool | None = None
    format_ok: bool | None = None
    tool_calls: list[str] = field(default_factory=list)
    tool_errors: int = 0
    invalid_turns: int = 0
    """turns that neither called a tool nor answered (the env's ``parsed.kind == "invalid"``)"""
    turn_rewards: float = 0.0
    """what the env gave before the last turn (its ``format_penalty`` for invalid turns); in ``reward``"""
    end_reason: str | None = None
    record_id: str | None = None
    answer_type: str | None = None
    ground_truth: str | None = None
    answer: str | None = None
    hit_token_limit: bool = False
    tool_latency_s: float = 0.0
    off_policy: bool = False
    """a demonstration placed in the group (``train.grpo --guidance``), not the policy's own sample"""

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def generated_tokens(self) -> int:
        return int(sum(self.response_mask))

    def extend(self, enc: Encoded, trained: bool) -> None:
        self.response_ids.extend(enc.ids)
        self.response_mask.extend([int(trained)] * len(enc.ids))
        if enc.pixel_values is not None:
            self.pixel_values.append(enc.pixel_values)
            self.image_grid_thw.append(enc.image_grid_thw)

    def context(self, prompt: Encoded) -> Encoded:
        """The whole sequence so far, as the next generation's input."""
        pix = ([prompt.pixel_values] if prompt.pixel_values is not None else []) + self.pixel_values
        grid = ([prompt.image_grid_thw] if prompt.image_grid_thw is not None else []) + self.image_grid_thw
        return Encoded(self.prompt_ids + self.response_ids, torch.cat(pix) if pix else None,
                       torch.cat(grid) if grid else None)


@dataclass
class RolloutBatch:
    trajectories: list[Trajectory]
    prompts: list[Encoded]
    timings: dict[str, float]

    @property
    def rewards(self) -> torch.Tensor:
        return torch.tensor([t.reward for t in self.trajectories], dtype=torch.float32)

    @property
    def group_index(self) -> torch.Tensor:
        return torch.tensor([t.group for t in self.trajectories], dtype=torch.long)


# ==============================================================================================
# Generators
# ==============================================================================================
class HFGenerator:
    """Batched sampling with a transformers model (left padding; pixel inputs for a VLM)."""

    def __init__(self, model, encoder: ChatEncoder, max_new_tokens: int = 48, temperature: float = 1.0,
                 top_p: float = 1.0, greedy: bool = False, share_prompts: bool = True) -> None:
        self.model, self.encoder = model, encoder
        self.max_new_tokens, self.temperature, self.top_p, self.greedy = max_new_tokens, temperature, top_p, greedy
        self.share_prompts = share_prompts

    def _prefill_once_per_context(self, ids: torch.Tensor, attn: torch.Tensor, device):
        """The key/value cache of every row but its last token, each *distinct* row computed once
        and repeated for its copies (a GRPO group's n copies start from one context): ``generate``
        then only runs the last prompt token and the new ones. ``None`` when nothing repeats or the
        model has no cache to hand over. Text policies only (a VLM's prompt carries pixel inputs
        and rotary state that ``generate`` builds itself)."""
        rows = [tuple(r) for r in ids.tolist()]
        first: dict[tuple, int] = {}
        mapping = [first.setdefault(r, len(first)) for r in rows]
        if len(first) == len(rows) or ids.shape[1] < 2:
            return None
        keep = torch.tensor([rows.index(r) for r in first])
        u_ids, u_attn = ids[keep, :-1].to(device), attn[keep, :-1].to(device)
        positions = (u_attn.long().cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded rows
        try:
            out = self.model(input_ids=u_ids, attention_mask=u_attn, position_ids=positions, use_cache=True)
        except TypeError:  # a model without position_ids / cache arguments: generate does it all
            return None
        cache = getattr(out, "past_key_values", None)
        if cache is None or not hasattr(cache, "batch_select_indices"):
            return None
        cache.batch_select_indices(torch.tensor(mapping, device=device))
        return cache

    @torch.no_grad()
    def generate(self, contexts: Sequence[Encoded], convs: Sequence[Conversation] = ()) -> list[list[int]]:
        pad, eos = self.encoder.pad_token_id, self.encoder.eos_token_id
        width = max(len(c.ids) for c in contexts)
        ids = torch.full((len(contexts), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, c in enumerate(contexts):
            ids[i, width - len(c.ids):] = torch.tensor(c.ids)
            attn[i, width - len(c.ids):] = 1
        device = next(self.model.parameters()).device
        kwargs: dict[str, Any] = {"input_ids": ids.to(device), "attention_mask": attn.to(device)}
        pix = [c.pixel_values for c in contexts if c.pixel_values is not None]
        if pix:
            kwargs.update(pixel_values=torch.cat(pix).to(device, self.model.dtype),
                          image_grid_thw=torch.cat([c.image_grid_thw for c in contexts if c.image_grid_thw is not None]).to(device),
                          mm_token_type_ids=mm_token_type_ids(ids, self.encoder.image_pad_id()).to(device))
        sampling = {"do_sample": False} if self.greedy else {"do_sample": True, "temperature": self.temperature,
                                                             "top_p": self.top_p, "top_k": 0}
        if self.encoder.is_vlm:  # a sampled image pad would desynchronise tokens and pixel inputs
            sampling["suppress_tokens"] = self.encoder.vision_token_ids()
        was_training = self.model.training
        self.model.eval()
        if self.share_prompts and not self.encoder.is_vlm:  # a VLM's rotary positions are its own
            shared = self._prefill_once_per_context(ids, attn, device)
            if shared is not None:
                kwargs["past_key_values"] = shared
        out = self.model.generate(**kwargs, max_new_tokens=self.max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                                  **sampling)
        self.model.train(was_training)
        result = []
        for row in out[:, width:].tolist():
            if eos in row:
                row = row[: row.index(eos) + 1]
            result.append(row)
        return result


class ScriptedGenerator:
    """Turns from a function of the conversation (gold trajectories for SFT, tests)."""

    def __init__(self, encoder: ChatEncoder, script: Callable[[Conversation], str]) -> None:
        self.encoder, self.script = encoder, script

    def generate(self, contexts: Sequence[Encoded], convs: Sequence[Conversation]) -> list[list[int]]:
        return [self.encoder.tokenizer(self.script(c), add_special_tokens=False)["input_ids"]
                + [self.encoder.eos_token_id] for c in convs]


# ==============================================================================================
# Collection
# ==============================================================================================
def group_requests(items: Sequence[tuple[int, int]], n: int) -> tuple[list[ResetRequest], list[int]]:
    """``[(seed, index), ...]`` -> one reset request per slot (each repeated ``n`` times, so a
    group's copies see the identical episode) and the group number of each slot.

    >>> group_requests([(7, 3)], 2)
    ([(7, {'index': 3}), (7, {'index': 3})], [0, 0])
    """
    if n < 1:
        raise ValueError(f"expected a group size n >= 1, got {n!r}")
    requests, groups = [], []
    for g, (seed, index) in enumerate(items):
        for _ in range(n):
            requests.append((int(seed), {"index": int(index)}))
            groups.append(g)
    return requests, groups


def collect_rollouts(generator: Generator, pool: EnvPool, encoder: ChatEncoder, requests: Sequence[ResetRequest],
                     groups: Sequence[int] | None = None, micro_batch: int = 16, max_total_tokens: int = 2048,
                     observation_style: str = "observation_tag") -> RolloutBatch:
    """Play one episode per request until each ends (answer or ``max_turns``).

    ``requests[i]`` resets pool slot ``i``; ``groups[i]`` is its GRPO group (default: ``i``).
    A sequence longer than ``max_total_tokens`` stops with ``hit_token_limit`` set and the
    reward of "no answer" (the env is stepped with an empty turn until it truncates).
    """
    start = time.perf_counter()
    groups = list(groups) if groups is not None else list(range(len(requests)))
    timings = Counter()
    resets = pool.reset(requests)
    timings["reset_s"] += time.perf_counter() - start
    convs = [Conversation.start(obs, info, observation_style) for obs, info in resets]
    prompts = [encoder.conversation(c) for c in convs]
    trajs = [Trajectory(slot=i, group=g, prompt_ids=list(p.ids), record_id=info.get("record_id"),
                        answer_type=info.get("answer_type"))
             for i, (p, g, (_, info)) in enumerate(zip(prompts, groups, resets))]
    texts: dict[int, str] = {}
    active = list(range(len(trajs)))
    while active:
        handles = []
        for k in range(0, len(active), micro_batch):
            chunk = active[k:k + micro_batch]
            t0 = time.perf_counter()
            outs = generator.generate([trajs[i].context(prompts[i]) for i in chunk], [convs[i] for i in chunk])
            timings["generation_s"] += time.perf_counter() - t0
            actions = {}
            for i, ids in zip(chunk, outs):
                trajs[i].turn_starts.append(len(trajs[i].response_ids))
                trajs[i].extend(Encoded(ids), trained=True)
                timings["generated_tokens"] += len(ids)
                text = encoder.decode(ids)
                if len(trajs[i].prompt_ids) + len(trajs[i].response_ids) > max_total_tokens:
                    trajs[i].hit_token_limit = True
                texts[i] = text
                actions[i] = text
                trajs[i].turn_texts.append(text)
            handles.append(pool.step_async(actions))
        t0 = time.perf_counter()
        results: dict[int, Any] = {}
        for h in handles:
            results.update(h.result())
        timings["env_wait_s"] += time.perf_counter() - t0
        next_active = []
        for i in active:
            obs, reward, terminated, truncated, info = results[i]
            traj = trajs[i]
            for call in info.get("tool_calls", ()):
                traj.tool_calls.append(call["name"])
                traj.tool_errors += int(call.get("error") is not None)
                traj.tool_latency_s += float(call.get("latency_s") or 0.0)
            traj.invalid_turns += int((info.get("parsed") or {}).get("kind") == "invalid")
            if terminated or truncated:
                _finish(traj, reward, info)
                continue
            traj.turn_rewards += float(reward)  # the env's format penalty for a turn that did nothing
            convs[i].add_turn(texts[i], obs)
            if not traj.response_ids or traj.response_ids[-1] != encoder.eos_token_id:
                traj.extend(Encoded([encoder.eos_token_id]), trained=False)  # close a cut-off turn
            t1 = time.perf_counter()
            enc = encoder.observation(convs[i], after_turn=True)
            timings["encode_s"] += time.perf_counter() - t1
            traj.extend(enc, trained=False)
            if traj.hit_token_limit:
                _drain(pool, i, traj)
                continue
            next_active.append(i)
        active = next_active
    timings["total_s"] = time.perf_counter() - start
    return RolloutBatch(trajs, prompts, dict(timings))


class FilledBatch(NamedTuple):
    """What :func:`fill_groups` gathered: the kept groups (renumbered 0..k-1), how many generation
    rounds it took, and every trajectory sampled on the way (for honest rollout metrics)."""

    batch: RolloutBatch
    rounds: int
    sampled: list[Trajectory]


def fill_groups(sample_round: Callable[[int], RolloutBatch], want_groups: int,
                keep: Callable[[RolloutBatch], torch.Tensor] | None = None, max_rounds: int = 1) -> FilledBatch:
    """DAPO's dynamic sampling with refill: call ``sample_round(r)`` for r = 0, 1, ... and keep the
    groups ``keep(batch)`` marks (a bool per trajectory, equal within a group) until
    ``want_groups`` groups are kept or ``max_rounds`` rounds are spent (verl's
    ``max_num_gen_batches``). Extra kept groups of the last round are dropped, as verl does. With
    ``keep=None`` every group is kept and one round suffices. Fewer than ``want_groups`` groups come
    back only when the rounds ran out; the caller logs it.

    >>> from train.algorithms import dynamic_sampling_keep
    >>> def round_(r):  # slots 2k and 2k+1 form group k; a group whose rewards are equal is dropped
    ...     rewards = [[1, 1, 1, 0], [0, 1, 0, 1]][r]
    ...     ts = [Trajectory(slot=i, group=i // 2, prompt_ids=[r], reward=x) for i, x in enumerate(rewards)]
    ...     return RolloutBatch(ts, [None] * 4, {})
    >>> out = fill_groups(round_, 2, keep=lambda b: dynamic_sampling_keep(b.rewards, b.group_index), max_rounds=3)
    >>> out.rounds, len(out.sampled), [(t.group, t.prompt_ids) for t in out.batch.trajectories]
    (2, 8, [(0, [0]), (0, [0]), (1, [1]), (1, [1])])
    """
    if want_groups < 1 or max_rounds < 1:
        raise ValueError(f"expected want_groups >= 1 and max_rounds >= 1, got {want_groups!r}, {max_rounds!r}")
    trajs: list[Trajectory] = []
    prompts: list[Encoded] = []
    sampled: list[Trajectory] = []
    timings: Counter = Counter()
    kept = 0
    rounds = 0
    while kept < want_groups and rounds < max_rounds:
        batch = sample_round(rounds)
        rounds += 1
        sampled.extend(batch.trajectories)
        timings.update(batch.timings)
        mask = keep(batch).tolist() if keep is not None else [True] * len(batch.trajectories)
        members: dict[int, list[int]] = {}
        for i, t in enumerate(batch.trajectories):
            members.setdefault(t.group, []).append(i)
        for idx in members.values():
            if kept >= want_groups:
                break
            if not all(mask[i] for i in idx):
                continue
            for i in idx:
                trajs.append(replace(batch.trajectories[i], group=kept))
                prompts.append(batch.prompts[i])
            kept += 1
    timings["gen_rounds"] = rounds
    return FilledBatch(RolloutBatch(trajs, prompts, dict(timings)), rounds, sampled)


def _finish(traj: Trajectory, reward: float, info: dict) -> None:
    comps = dict(info.get("reward_components") or {})
    traj.reward = float(reward) + traj.turn_rewards  # the episode's return: earlier turns' penalties too
    traj.components = comps
    traj.correct = info.get("correct")
    traj.format_ok = info.get("format_ok")
    traj.end_reason = info.get("end_reason") or "max_turns"
    traj.ground_truth = info.get("ground_truth")
    traj.answer = info.get("answer")


def _drain(pool: EnvPool, slot: int, traj: Trajectory) -> None:
    """End an over-long episode: empty turns until the env truncates (bounded by its max_turns)."""
    for _ in range(64):
        obs, reward, terminated, truncated, info = pool.step({slot: ""})[slot]
        traj.invalid_turns += int((info.get("parsed") or {}).get("kind") == "invalid")
        if terminated or truncated:
            _finish(traj, reward, info)
            return
        traj.turn_rewards += float(reward)
    traj.end_reason = "token_limit"

