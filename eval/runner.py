"""The evaluation loop: many live episodes at once, the agent called on all that wait for it.

``evaluate(agent, dataset, config, out_dir)`` keeps ``config.batch_size`` episodes live. Env work
(reset, image loading, tools, per-episode scores) runs in the workers of a
:class:`medvqa_env.pool.EnvPool`; the agent runs here and gets every conversation that is waiting
in one ``act_batch`` call. What loads a model is here once per run, not once per worker: the env
reward (scored by the pool, in batches) and the open-answer metrics (the MiniLM encoders; every
OPEN episode finished in a round is measured in one batch before its row is written). With ``overlap``, two
such waves of episodes are live and take turns: the workers step one while the agent acts on the
other, so a model's time hides the env work. Each finished episode is appended to
``episodes.jsonl`` at once (see :mod:`eval.results`); a rerun skips what is there. Episode
``(record, sample)`` always gets the same seed, so K samples per question differ while a rerun
repeats them exactly.

Failures are data, per episode: a missing image (``dataset_error``), an agent that raises
(``agent_error``; a failing batch is retried one conversation at a time to find the culprit), a
broken env or tool (``env_error``), a dead worker (``worker_crash``: only the episode that killed it,
named with its record and files; the others it held start again, the suspects alone), a judge that times out
(``judge_error``, the episode is kept with ``judge: null``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agents.base import Agent
from medvqa_env.chat import Conversation
from medvqa_env.images import LazyImage
from medvqa_env.records import VQADataset, VQARecord
from medvqa_env.pool import EnvPool, PoolSpec
from eval.failures import episode_failures, is_run_failure, describe_source, tool_servers
from eval.results import RESULTS_FILE, ResultsWriter, episode_key, load_results
from eval.scoring import OpenMetrics, tool_stats
from eval.selection import describe_selection, of_answer_types, select_records
from eval.summary import EvalSummary

log = logging.getLogger(__name__)

EXPIRED_IMAGE = ("this episode is over and its images' shared memory is reused; an agent that keeps a "
                 "conversation's images past its episode must read them (np.asarray, .copy()) before it ends")
Judge = Callable[[str, str, str], Mapping[str, Any]]  # (question, ground_truth, prediction) -> {"correct", "reason"}


@dataclass
class EvalConfig:
    """How to run an evaluation (saved to ``run.json``; identity fields must match on resume)."""

    k: int = 1
    """Samples per question (seed 004's pass@K); sample ``s`` of a question gets its own seed."""
    seed: int = 0
    """Base seed; episode seeds derive from it, the record id and the sample index."""
    limit: int | None = None
    """Evaluate ``limit`` questions: the first of the split, or of the ``shuffle``/``stratify``
    order (:mod:`eval.selection`; a larger limit extends the same selection). ``None``: all."""
    shuffle: bool = False
    """Take the questions in a seeded random order (``shuffle_seed``) before ``limit`` applies."""
    stratify: str | None = None
    """Keep each group of this record field (``answer_type``, ``dataset``, ``modality``, ``organ``,
    ``question_type``) at its share of the split when ``limit`` takes N questions."""
    shuffle_seed: int | None = None
    """Seed of the ``shuffle``/``stratify`` draw (``None``: ``seed``)."""
    answer_types: str | None = None
    """Ask only questions of these answer types (comma list: ``CLOSED,MCQ``), before ``limit``
    applies -- the trainers' held-out selection (``--answer-types``, ``--eval-size``). ``None``: all."""
    workers: int = 2
    """Env worker processes; 0 runs envs in this process (serial, for debugging and baselines)."""
    batch_size: int = 32
    """Live episodes at once (the most conversations one ``act_batch`` call can get)."""
    tools: Any = field(default=None, metadata={"none_is_a_value": True})
    """Tool config for the env (see ``tool_backends.config``); ``None`` = default tools; ``none`` or ``[]`` = none."""
    max_turns: int = 3
    """Tool turns per episode (seed 000: 3)."""
    answer_protocol: str = "boxed"
    """``boxed`` (seed 000) or ``xml`` (MediX-R1)."""
    observation_style: str = "observation_tag"
    """How tool outputs reach the agent (see ``MedVQAEnv``)."""
    reward: str = "rule"
    """Env reward recorded per episode: ``rule`` (default: rule ±1 for CLOSED/MCQ, exact match for
    OPEN -- cheap and stateless), ``default`` (the training reward, :func:`rewards.default_reward`)
    or a registry name. Its adaptive state never moves during an evaluation."""
    open_metrics: bool = True
    """Compute BLEU-1/ROUGE-1/BERTScore/CosSim for OPEN answers (needs the ``rewards`` extra)."""
    metrics_options: dict = field(default_factory=dict)
    """``ARMedConfig`` fields for the open metrics' encoders (e.g. the seed's PubMedBERT folder)."""
    retry_errors: bool = False
    """On resume, rerun episodes whose row records an error."""
    progress: bool = True
    """Show a progress bar with live accuracy on stderr."""
    bootstrap: int = 1000
    """Bootstrap resamples for confidence intervals (0 = none)."""
    gather: str = "all"
    """``all``: wait for every busy env worker before calling the agent, so ``act_batch`` gets
    every waiting conversation (best for batched models, whose cost is per call); ``any``: call
    the agent as soon as one worker answers, overlapping its work with the other workers' steps
    (best for agents whose cost is per conversation, e.g. a concurrent API client)."""
    overlap: bool = False
    """Keep two waves of up to ``batch_size`` episodes live and call the agent on one wave while
    the env workers step the other, so env work hides behind the agent's time instead of adding
    to it (for agents that take real time: a model). Each ``act_batch`` still gets at most
    ``batch_size`` conversations; twice as many envs are live. Needs ``gather="all"``. With
    ``workers=0`` the envs step in a thread of this process, which overlaps too while the agent
    waits outside the GIL (a GPU, a server)."""
    judge_workers: int = 8
    """Concurrent requests to the LLM judge."""
    fsync: bool = True
    """fsync each appended row (what makes a killed run lose nothing finished)."""
    image_ablation: str | None = None
    """Also run every episode with the images ``blank`` (black) or ``shuffle``d (another record's),
    or both (``blank,shuffle``), tools included, into ``out/ablation_<mode>/``; the summary reports
    each headline metric's drop (:mod:`eval.ablation`): does the agent use the image?"""

    IDENTITY = ("seed", "tools", "max_turns", "answer_protocol", "observation_style", "reward", "metrics_options",
                "image_ablation")


def episode_seed(base_seed: int, record_id: str, sample: int) -> int:
    """A stable 31-bit seed per (base seed, record, sample).

    >>> episode_seed(0, "q1", 0) == episode_seed(0, "q1", 0) != episode_seed(0, "q1", 1)
    True
    """
    digest = hashlib.blake2b(f"{base_seed}|{record_id}|{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@dataclass
class _Episode:
    key: str
    index: int
    sample: int
    seed: int
    record: VQARecord
    wave: int = 0
    worker: int = -1
    slot: int = -1
    conversation: Conversation | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)
    pending_action: Any = None
    started: float = field(default_factory=time.perf_counter)
    agent_s: float = 0.0
    env_s: float = 0.0
    suspect: bool = False
    """It was in the command list a worker died running: it runs again alone, and dies alone if it is the cause."""
    restarts: int = 0
    """Times a dead worker took it and it started again from its reset."""

    def again(self, suspect: bool) -> "_Episode":
        """The same episode from its start (same seed): what a dead worker took from it is gone."""
        return _Episode(self.key, self.index, self.sample, self.seed, self.record,
                        suspect=self.suspect or suspect, restarts=self.restarts + 1)


MAX_ANNOUNCED = 10
"""Failure sources named on stderr as they happen (all of them are named at the end)."""
MAX_RESTARTS = 3
"""An episode a dead worker took this many times is recorded as ``worker_crash`` whatever the cause."""


@dataclass
class _Batch:
    """One command list for one worker, all from one wave (what a worker has in flight).

    A wave's commands travel apart from the other wave's, so its answers come back while the
    other wave's commands are still being stepped."""

    wave: int
    commands: list[tuple] = field(default_factory=list)
    episodes: list[_Episode] = field(default_factory=list)
    alone: bool = False
    """One suspect's one command: if the worker dies running it, that episode is the cause."""


class _Progress:
    """tqdm when installed, else silence; shows live accuracy."""

    def __init__(self, total: int, enabled: bool, desc: str) -> None:
        self.bar = None
        self.correct = self.scored = self.errors = self.failed = 0
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, row: Mapping[str, Any]) -> None:
        if row.get("error"):
            self.errors += 1
        elif row.get("correct") is not None:
            self.scored += 1
            self.correct += bool(row["correct"])
        self.failed += any(is_run_failure(f["kind"]) for f in row.get("failures") or ())
        if self.bar is not None:
            acc = self.correct / self.scored if self.scored else 0.0
            self.bar.set_postfix(acc=f"{acc:.3f}", errors=self.errors, failed=self.failed, refresh=False)
            self.bar.update(1)

    def note(self, text: str) -> None:
        """One line on stderr, above the bar when there is one."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _call_agent(agent: Agent, convs: Sequence[Conversation]) -> list[tuple[Any, str | None]]:
    """``act_batch`` on all; if it raises or answers wrongly, one by one to isolate failures."""
    try:
        actions = agent.act_batch(list(convs))
        if not isinstance(actions, (list, tuple)) or len(actions) != len(convs):
            raise TypeError(f"act_batch must return a list of {len(convs)} turns, got {type(actions).__name__}"
                            f"{' of length ' + str(len(actions)) if hasattr(actions, '__len__') else ''}")
        return [(a, None) for a in actions]
    except Exception as batch_error:
        if len(convs) == 1:
            return [(None, f"{type(batch_error).__name__}: {batch_error}")]
    out = []
    for c in convs:
        out.extend(_call_agent(agent, [c]))
    return out


def _as_action(action: Any) -> Any:
    """Text goes to the env as is; anything else (``None``, a number) as ``None``, which the
    env's parser turns into a format error the episode records."""
    return action if isinstance(action, (str, bytes)) else None


class Runner:
    """One evaluation run (see the module docstring). Use :func:`evaluate`."""

    def __init__(self, agent: Agent, dataset: VQADataset, config: EvalConfig, out_dir: str | Path | None,
                 judge: Judge | None = None) -> None:
        if config.k < 1:
            raise ValueError(f"expected k >= 1, got {config.k!r}")
        if config.gather not in ("all", "any"):
            raise ValueError(f"expected gather 'all' or 'any', got {config.gather!r}")
        if config.overlap and config.gather != "all":
            raise ValueError("overlap calls the agent on one whole wave at a time; use it with gather='all'")
        if config.batch_size < 1:
            raise ValueError(f"expected batch_size >= 1, got {config.batch_size!r}")
        self.agent, self.config, self.judge = agent, config, judge
        self.dataset = select_records(of_answer_types(dataset, config.answer_types), config.limit, config.shuffle,
                                      config.stratify, selection_seed(config))
        # what the envs hold: the selected questions; under a "shuffle" ablation the whole split, so that a
        # question's swapped-in image comes from the split whatever the selection (--limit 3 may hold one image)
        self.env_dataset = dataset if config.image_ablation == "shuffle" else self.dataset
        self.env_index = ([dataset.index_of(r.id) for r in self.dataset] if self.env_dataset is not self.dataset
                          else list(range(len(self.dataset))))
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.rows: dict[str, dict[str, Any]] = {}  # rows written in this call, by key (latest)
        self._metrics: OpenMetrics | None = None  # loaded on the first OPEN answer
        self._metrics_error: str | None = None
        self.servers = _tool_servers(config.tools)  # tool -> its server's URL or "local", to name failures
        self._sources_seen: set[tuple] = set()  # failure sources already announced on stderr

    # ---- bookkeeping --------------------------------------------------------------------------
    def _todo(self, done: set[str]) -> deque[_Episode]:
        todo: deque[_Episode] = deque()
        for index, record in enumerate(self.dataset):
            for sample in range(self.config.k):
                key = episode_key(record.id, sample)
                if key not in done:
                    todo.append(_Episode(key, index, sample, episode_seed(self.config.seed, record.id, sample), record))
        return todo

    def _row(self, ep: _Episode, final: Mapping[str, Any] | None, error: Mapping[str, Any] | None) -> dict[str, Any]:
        r = ep.record
        info = (final or {}).get("info", {})
        score = (final or {}).get("score", {})
        row: dict[str, Any] = {
            "key": ep.key, "record_id": r.id, "sample": ep.sample, "seed": ep.seed, "index": ep.index,
            "dataset": r.dataset, "split": r.split, "answer_type": r.answer_type.value,
            "modality": r.modality, "organ": r.organ, "question_type": r.question_type,
            "question": r.question, "ground_truth": r.answer, "options": dict(r.options),
            "prediction": info.get("answer"),
            "format_ok": bool(score.get("format_ok", False)),
            "correct": bool(score.get("correct", False)),
            "exact_match": bool(score.get("exact_match", False)),
            "metrics": score.get("metrics", {}),
            "reward": (final or {}).get("reward"),
            "reward_components": info.get("reward_components", {}),
            "end_reason": info.get("end_reason") if error is None else "error",
            "turns": len(ep.trace),
            "trace": ep.trace,
            "tool_stats": tool_stats(ep.trace),
            "timing": {"total_s": time.perf_counter() - ep.started, "agent_s": ep.agent_s, "env_s": ep.env_s,
                       "score_s": 0.0},
            "error": dict(error) if error else None,
            "judge": None,
        }
        if ep.conversation is not None and ep.conversation.usage:  # tokens the agent reported (API agents)
            row["usage"] = dict(ep.conversation.usage)
        if score.get("metrics_error"):
            row["metrics_error"] = score["metrics_error"]
        if score.get("references"):  # every accepted answer (VQA-Med's '#'): scored as the best of them
            row["references"] = score["references"]
        # what failed under this episode, named (eval.failures); tools_failed marks it in episodes.jsonl
        row["image_paths"] = [str(p) for p in r.image_paths]
        row["failures"] = episode_failures(row, self.servers, row["image_paths"])
        row["tools_failed"] = any(f["kind"] in ("tool_unavailable", "tool_crash") for f in row["failures"])
        return row

    def _announce(self, row: Mapping[str, Any], progress: "_Progress") -> None:
        """Say on stderr, once per source (a tool at a server, a file), that something failed; after
        :data:`MAX_ANNOUNCED` sources one line says the rest are counted and listed at the end."""
        for f in row["failures"]:
            key = (f["kind"], f["tool"], f["server"]) if f["tool"] else (f["kind"], f["reason"][:80])
            if key in self._sources_seen or not is_run_failure(f["kind"]):
                continue
            self._sources_seen.add(key)
            if len(self._sources_seen) > MAX_ANNOUNCED:
                if len(self._sources_seen) == MAX_ANNOUNCED + 1:
                    progress.note(f"medvqa-eval: more than {MAX_ANNOUNCED} failure sources; the rest are counted "
                                  "and listed at the end")
                continue
            progress.note("medvqa-eval: failure: " + describe_source(
                {**f, "episodes": 1, "first": row["key"], "last": row["key"]}) + " -- counted in the report")

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        cfg = self.config
        writer = ResultsWriter(self.out_dir / RESULTS_FILE, fsync=cfg.fsync) if self.out_dir else None
        done = set(writer.done) if writer else set()
        if writer and cfg.retry_errors:
            done -= {row["key"] for row in load_results(writer.path) if row.get("error")}
        todo = self._todo(done)
        total = len(todo)
        rejudge = []  # rows of an earlier, interrupted run still waiting for the judge
        if writer and self.judge is not None:
            wanted = {episode_key(r.id, s) for r in self.dataset for s in range(cfg.k)}
            rejudge = [r for r in load_results(writer.path) if r.get("judge_status") == "pending" and r["key"] in wanted]
        if not total and not rejudge:
            if writer:
                writer.close()
            return []
        n_workers = max(1, cfg.workers)
        n_waves = 2 if cfg.overlap else 1
        per_wave = -(-min(cfg.batch_size * n_waves, total) // n_waves)
        slots_per_wave = max(1, -(-per_wave // n_workers))  # per worker; wave v owns local slots v*S..(v+1)*S-1
        spec = PoolSpec({"dataset": self.env_dataset, "tools": cfg.tools, "max_turns": cfg.max_turns,
                         "answer_protocol": cfg.answer_protocol, "observation_style": cfg.observation_style,
                         "image_ablation": cfg.image_ablation},
                        episode_hook="eval.scoring:EpisodeScorer")
        # worker processes hand images back as views of shared memory, valid until the slot's next
        # reset: an episode's conversation is dropped when it finishes, before its slot is reused
        backend_options = {"image_views": True} if cfg.workers else {}
        pool = _start_pool(spec, size=n_workers * n_waves * slots_per_wave, backend="process" if cfg.workers else "thread",
                           workers=n_workers, reward=eval_reward(cfg.reward), **backend_options) if total else None
        free = [[list(range(v * slots_per_wave, (v + 1) * slots_per_wave)) for _ in range(n_workers)]
                for v in range(n_waves)]  # free[wave][worker]: local slots with no live episode
        queued: list[list[_Batch]] = [[] for _ in range(n_workers)]  # per worker, sent in order
        inflight: list[_Batch | None] = [None] * n_workers
        ready: list[list[_Episode]] = [[] for _ in range(n_waves)]  # per wave, waiting for the agent
        judge_pool = ThreadPoolExecutor(max(1, cfg.judge_workers)) if self.judge else None
        judging: list[tuple[dict[str, Any], Future]] = []
        progress = _Progress(total, cfg.progress, desc=getattr(self.agent, "name", "agent"))
        unwritten: list[dict[str, Any]] = []
        unmeasured: list[dict[str, Any]] = []  # rows of OPEN episodes waiting for their metrics

        def to_judge(row: dict[str, Any]) -> None:
            judging.append((row, judge_pool.submit(self._judge, row)))

        def finish(ep: _Episode, final=None, error=None) -> None:
            """The episode is over: its row is written now; a judge verdict, if any, follows as
            a second row with the same key (the last row of a key wins when loading)."""
            row = self._row(ep, final, error)
            free[ep.wave][ep.worker].append(ep.slot)
            if cfg.workers and ep.conversation is not None:  # its images are views the slot's next episode overwrites
                for image in ep.conversation.images:
                    if isinstance(image, LazyImage):
                        image.expire(EXPIRED_IMAGE)
            if cfg.open_metrics and (final or {}).get("score", {}).get("needs_open_metrics"):
                unmeasured.append(row)
            if judge_pool is not None and row["error"] is None:
                row["judge_status"] = "pending"
                to_judge(row)
            unwritten.append(row)

        def commit() -> None:
            """Make the rows finished so far durable (one fsync for all) before more work starts."""
            if unmeasured:
                self._measure_open(unmeasured)
                unmeasured.clear()
            if writer:
                writer.append_many(unwritten)
            for row in unwritten:
                if row["key"] not in self.rows:
                    progress.update(row)
                    self._announce(row, progress)
                self.rows[row["key"]] = row
            unwritten.clear()

        def enqueue(ep: _Episode, command: tuple) -> None:
            """Queue a command for the episode's worker, joining the last list if it is of the same wave."""
            batches = queued[ep.worker]
            if not batches or batches[-1].wave != ep.wave or batches[-1].alone or ep.suspect:
                batches.append(_Batch(ep.wave, alone=ep.suspect))
            batches[-1].commands.append(command)
            batches[-1].episodes.append(ep)

        def send_to_idle_workers() -> None:
            for w in range(n_workers):
                if queued[w] and inflight[w] is None and not pool.busy[w]:
                    inflight[w] = queued[w].pop(0)
                    pool.submit(w, inflight[w].commands)

        def env_pending(wave: int) -> bool:
            """Whether some of the wave's commands are still queued or in flight."""
            return any(b is not None and b.wave == wave for b in inflight) or \
                any(b.wave == wave for batches in queued for b in batches)

        def collect(answers) -> None:
            """Take the workers' answers: finished episodes are written, live ones wait for the agent."""
            for w, results in answers:
                batch, inflight[w] = inflight[w], None
                if results is None:  # the worker died (and was restarted): its live episodes are lost
                    self._lose_worker(w, batch, queued[w], ready, todo, free, finish)
                    continue
                for ep, res in zip(batch.episodes, results):
                    ep.env_s += res.get("env_s", 0.0)
                    if "error" in res:
                        finish(ep, error=res["error"])
                    elif res.get("kind") == "reset":
                        info = dict(res["info"], seed=ep.seed, sample=ep.sample, episode_key=ep.key)
                        ep.conversation = Conversation.start(res["obs"], info, cfg.observation_style)
                        ready[ep.wave].append(ep)
                    else:
                        self._record_step(ep, res)
                        if res["terminated"] or res["truncated"]:
                            finish(ep, final=res)
                        else:
                            turn = ep.pending_action if isinstance(ep.pending_action, str) else ""
                            ep.conversation.add_turn(turn, res["obs"])
                            ready[ep.wave].append(ep)

        def refill(wave: int) -> None:
            """Start new episodes in the wave's free slots; their resets join the wave's next lists."""
            for w in range(n_workers):
                while todo and free[wave][w]:
                    ep = todo.popleft()
                    ep.wave, ep.worker, ep.slot = wave, w, free[wave][w].pop()
                    ep.started = time.perf_counter()
                    enqueue(ep, ("reset", ep.slot, ep.seed, {"index": self.env_index[ep.index]}))

        for row in rejudge:
            to_judge(row)

        # Each round serves one wave (with one wave, always wave 0): its env answers, then the agent
        # on its conversations, then its next commands. Rounds alternate between the waves, so each
        # worker holds one wave's list in flight and the other's queued behind it.
        for v in range(n_waves):
            refill(v)
        wave = 0
        try:
            while todo or any(inflight) or any(queued) or any(ready):
                # 1. send queued commands to idle workers; 2. collect answers until this wave's are
                # all in (gather=all) or any came (gather=any). A worker that answers gets its next
                # list at once: with two waves, the other wave's, stepped while the agent acts.
                send_to_idle_workers()
                if cfg.gather == "any":
                    collect(pool.poll())
                    send_to_idle_workers()
                while cfg.gather == "all" and env_pending(wave):
                    collect(pool.poll())
                    send_to_idle_workers()
                commit()
                # 3. the agent acts on every conversation of this wave that waits for it; its turns
                # and the wave's new episodes are queued
                acting, ready[wave] = ready[wave], []
                if acting:
                    t0 = time.perf_counter()
                    answers = _call_agent(self.agent, [ep.conversation for ep in acting])
                    share = (time.perf_counter() - t0) / len(acting)
                    for ep, (action, err) in zip(acting, answers):
                        ep.agent_s += share
                        if err is not None:
                            finish(ep, error={"kind": "agent_error", "message": err})
                            continue
                        ep.pending_action = _as_action(action)
                        enqueue(ep, ("step", ep.slot, ep.pending_action))
                refill(wave)
                wave = (wave + 1) % n_waves
                # 4. write rows whose judge has answered
                if judging:
                    still = []
                    for row, fut in judging:
                        if fut.done():
                            unwritten.append(self._judged(row, fut))
                        else:
                            still.append((row, fut))
                    judging[:] = still
                commit()
            for row, fut in judging:
                unwritten.append(self._judged(row, fut))
            commit()
        finally:
            try:  # an interrupt (Ctrl-C) still keeps every finished row
                commit()
            except Exception:  # noqa: BLE001 -- the original error matters more
                log.exception("could not write the last rows")
            progress.close()
            if pool is not None:
                pool.close()
            if judge_pool is not None:
                judge_pool.shutdown(wait=False, cancel_futures=True)
            if writer:
                writer.close()
        return list(self.rows.values())

    def _record_step(self, ep: _Episode, res: Mapping[str, Any]) -> None:
        info = res["info"]
        action = ep.pending_action
        ep.trace.append({
            "turn": info.get("turn"),
            "action": action if isinstance(action, str) else None,
            "parsed": info.get("parsed"),
            "observation": res["obs"].get("text") if not (res["terminated"] or res["truncated"]) else None,
            "tool_calls": info.get("tool_calls", []),
            "reward": res.get("reward"),
            "env_s": res.get("env_s"),
        })

    def _measure_open(self, rows: list[dict[str, Any]]) -> None:
        """Fill the OPEN rows' ``metrics`` in one batched :class:`OpenMetrics` call (``timing.score_s``
        is each one's share). A metric failure costs the metrics (``metrics_error``), never the rows."""
        t0 = time.perf_counter()
        if self._metrics is None and self._metrics_error is None:
            try:
                self._metrics = OpenMetrics(**self.config.metrics_options)
            except ImportError as e:
                self._metrics_error = f"{type(e).__name__}: {e}"
                log.warning("open-answer metrics unavailable: %s", e)
        try:
            if self._metrics is None:
                raise RuntimeError(self._metrics_error)
            measured = self._metrics([r["prediction"] or "" for r in rows],
                                     [r.get("references") or r["ground_truth"] for r in rows])
        except Exception as e:  # noqa: BLE001 -- a metric failure costs the metrics, not the episodes
            if self._metrics is not None:
                log.warning("open-answer metrics failed: %s", e, exc_info=True)
            for row in rows:
                row["metrics_error"] = self._metrics_error or f"{type(e).__name__}: {e}"
            return
        share = (time.perf_counter() - t0) / len(rows)
        for row, metrics in zip(rows, measured):
            row["metrics"] = metrics
            row["timing"]["score_s"] = share

    def _lose_worker(self, worker: int, running: _Batch, queued: list[_Batch], ready: list[list[_Episode]],
                     todo: deque[_Episode], free: list[list[list[int]]], finish) -> None:
        """A dead worker took the envs of every episode it held. The one that killed it is found
        and recorded; the others start again, so a crash costs only its own episode:

        * the command list it was running: if it was one suspect's command run alone, that episode
          is the cause -- a ``worker_crash`` row naming its record and files; otherwise each of its
          episodes starts again as a *suspect*, whose commands run alone;
        * the episodes waiting for the agent and the ones with a step queued behind it: not
          running when it died, they start again (queued resets stay: the restarted worker runs them).

        An episode taken :data:`MAX_RESTARTS` times is recorded as a crash whatever the cause."""
        def crashed(ep: _Episode, why: str) -> None:
            files = ", ".join(map(str, ep.record.image_paths))
            finish(ep, error={"kind": "worker_crash", "message": f"the env worker process died {why} "
                              f"(record {ep.record.id!r}, image {files})"})

        lost: list[tuple[_Episode, bool]] = []  # (episode, was running)
        if running.alone and len(running.episodes) == 1:
            crashed(running.episodes[0], "running this episode alone")
        else:
            lost += [(ep, True) for ep in running.episodes]
        for waiting in ready:
            lost += [(ep, False) for ep in waiting if ep.worker == worker]
            waiting[:] = [ep for ep in waiting if ep.worker != worker]
        for batch in queued:
            lost += [(ep, False) for c, ep in zip(batch.commands, batch.episodes) if c[0] != "reset"]
            resets = [(c, ep) for c, ep in zip(batch.commands, batch.episodes) if c[0] == "reset"]
            batch.commands, batch.episodes = [c for c, _ in resets], [ep for _, ep in resets]
        queued[:] = [b for b in queued if b.commands]
        again = []
        for ep, was_running in lost:
            if ep.restarts + 1 >= MAX_RESTARTS:
                crashed(ep, f"under this episode {MAX_RESTARTS} times")
                continue
            free[ep.wave][ep.worker].append(ep.slot)
            if ep.conversation is not None and self.config.workers:
                for image in ep.conversation.images:
                    if isinstance(image, LazyImage):
                        image.expire(EXPIRED_IMAGE)
            again.append(ep.again(suspect=was_running))
        if again:
            log.warning("env worker %d died; %d episode(s) it held start again (%d run alone to find the cause)",
                        worker, len(again), sum(ep.suspect for ep in again))
        todo.extendleft(reversed(again))

    def _judge(self, row: Mapping[str, Any]) -> dict[str, Any]:
        if row["prediction"] is None:
            return {"correct": False, "reason": "no final answer"}
        verdict = self.judge(row["question"], row["ground_truth"], row["prediction"])
        return {"correct": bool(verdict["correct"]), "reason": str(verdict.get("reason", ""))}

    @staticmethod
    def _judged(row: Mapping[str, Any], fut: Future) -> dict[str, Any]:
        out = dict(row)
        try:
            out["judge"], out["judge_status"] = fut.result(), "done"
        except Exception as e:  # a timing-out or broken judge endpoint: keep the episode, note why
            out["judge"], out["judge_status"] = None, "error"
            out["judge_error"] = f"{type(e).__name__}: {e}"
        return out


def _start_pool(spec: PoolSpec, **kwargs: Any) -> EnvPool:
    """The env pool; a worker that could not start because of the user's config (an unknown tool
    or engine name in it) is that config's one-line error, as with ``workers=0``."""
    from medvqa_env.errors import ConfigError

    try:
        return EnvPool(spec, **kwargs)
    except RuntimeError as e:
        for kind in ("ConfigError: ", "DatasetError: "):
            head, sep, message = str(e).partition(" could not start: " + kind)
            if sep:
                raise ConfigError(message) from None
        raise


def check_tool_names(tools: Any) -> None:
    """A :class:`ConfigError` naming the closest tool when a local tool of the config is not
    registered -- before a run folder or a worker is made, so a typo costs one line at any ``workers``.

    >>> check_tool_names("image_zom_in")
    Traceback (most recent call last):
    ...
    medvqa_env.errors.ConfigError: Unknown tool 'image_zom_in'. Available: [...]. Did you mean 'image_zoom_in'?
    """
    from medvqa_env.errors import ConfigError, unknown_name_message
    from tool_backends.config import load_tool_config
    from tool_backends.registry import available_tools

    if hasattr(tools, "names"):  # a Toolbox handed in
        return
    known = available_tools()
    for name, entry in load_tool_config(tools).items():
        if entry.get("backend") == "local" and name not in known:
            raise ConfigError(unknown_name_message("tool", name, known))


def _tool_servers(tools: Any) -> dict[str, str]:
    """Tool -> server URL (or ``local``) for a tool config as :class:`EvalConfig` holds it."""
    if hasattr(tools, "names"):  # a Toolbox handed in
        return {}
    try:
        from tool_backends.config import load_tool_config

        return tool_servers(load_tool_config(tools))
    except Exception:  # noqa: BLE001 -- a bad config fails where the env builds it, with its own message
        return {}


def eval_reward(name: str):
    """The env reward an evaluation records per episode (see :attr:`EvalConfig.reward`)."""
    from rewards import ByAnswerType, ExactMatchReward, RuleReward, default_reward

    if name == "rule":
        rule = RuleReward()
        return ByAnswerType(closed=rule, mcq=rule, open=ExactMatchReward())
    if name == "default":
        return default_reward()
    from rewards.registry import build_reward

    return build_reward(name)


def check_resume(out_dir: Path, run_info: Mapping[str, Any], overwrite: bool = False) -> None:
    """Refuse to mix results of a different setup into ``out_dir`` (unless ``overwrite``)."""
    from medvqa_env.errors import ConfigError

    path = out_dir / "run.json"
    if not path.is_file() or overwrite:
        return
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError:
        return
    old = {**old, "agent": requested_agent_config(old.get("agent"))}
    new = {**run_info, "agent": requested_agent_config(run_info.get("agent"))}
    diffs = [k for k in ("agent", "dataset", "split", *EvalConfig.IDENTITY)
             if json.dumps(old.get(k), sort_keys=True, default=str) != json.dumps(new.get(k), sort_keys=True, default=str)]
    rows = load_results(out_dir / RESULTS_FILE)
    if diffs and not any(not r.get("error") for r in rows):
        # an attempt that measured nothing (a typo that stopped it, every episode an error) is not
        # a setup to protect: the corrected command starts the folder again
        if rows:
            log.warning("%s held %d episode(s) of an earlier setup, none scored; starting again", out_dir, len(rows))
            (out_dir / RESULTS_FILE).unlink()
        return
    if diffs:
        raise ConfigError(f"{out_dir} holds results of a different setup (differs in {diffs}); "
                          f"use another --out or pass --overwrite")
    from tool_backends.identity import check_tools

    check_tools(old.get("tool_identity"), run_info.get("tool_identity") or {}, str(out_dir),
                "Use another --out, or pass --overwrite to start its results again with these tools.")


def requested_agent_config(config: Any) -> Any:
    """An agent config as it was asked for: parameters the server rejected (recorded under
    ``dropped_parameters`` / ``renamed_parameters`` by :class:`agents.openai_agent.OpenAIAgent`,
    so the config holds what was sent) put back, so a resume compares like with like.

    >>> requested_agent_config({"top_p": 1, "dropped_parameters": {"temperature": {"requested": 0.0, "why": "400"}},
    ...                         "max_completion_tokens": 8, "renamed_parameters": {"max_tokens": "max_completion_tokens"}})
    {'top_p': 1, 'temperature': 0.0, 'max_tokens': 8}
    """
    if not isinstance(config, dict):
        return config
    out = {k: v for k, v in config.items() if k not in ("dropped_parameters", "renamed_parameters")}
    for name, entry in (config.get("dropped_parameters") or {}).items():
        out[name] = entry.get("requested") if isinstance(entry, dict) else entry
    for old, new in (config.get("renamed_parameters") or {}).items():
        if new in out:
            out[old] = out.pop(new)
    return out


def run_info(agent: Agent, dataset: VQADataset, config: EvalConfig, split: str | None = None) -> dict[str, Any]:
    """What ``run.json`` records: the agent, the dataset and its split (the records' own when the
    caller does not say), the identity fields with the tool config *resolved*, and provenance."""
    from medvqa_env.provenance import dataset_provenance, provenance
    from tool_backends.config import load_tool_config

    info = {"agent": agent.config(), "dataset": dataset.name, "split": split or dataset_split(dataset)}
    cfg = asdict(config)
    info.update({k: cfg[k] for k in EvalConfig.IDENTITY})
    info["tools"] = load_tool_config(config.tools) if not hasattr(config.tools, "names") else list(config.tools.names)
    if isinstance(info["tools"], dict):  # trained tools by content hash (built now if missing: the env would)
        from tool_backends.identity import describe_tools

        info["tool_identity"] = describe_tools(info["tools"], build=True, dataset=dataset)  # segment: the dataset's default engine
    info["provenance"] = provenance()
    loaded = dataset_provenance(dataset)  # the files read and the rows skipped (their list: skipped_records.jsonl)
    if loaded is not None:
        info["dataset_provenance"] = loaded.summary()
    info.update({"k": config.k, "limit": config.limit, "shuffle": config.shuffle, "stratify": config.stratify,
                 "shuffle_seed": selection_seed(config)})
    if config.answer_types:
        info["answer_types"] = config.answer_types
    return info


def dataset_split(dataset: VQADataset) -> str | None:
    """The split the records say they come from (``"mixed"`` when they disagree)."""
    splits = {getattr(r, "split", None) for r in dataset}
    splits.discard(None)
    return splits.pop() if len(splits) == 1 else ("mixed" if splits else None)


def selection_seed(config: EvalConfig) -> int:
    return config.seed if config.shuffle_seed is None else config.shuffle_seed


def evaluate(agent: Agent, dataset: VQADataset, config: EvalConfig | None = None,
             out_dir: str | Path | None = None, judge: Judge | None = None, split: str | None = None,
             overwrite: bool = False, write_report: bool = True) -> EvalSummary:
    """Run ``agent`` over ``dataset`` and return the :class:`~eval.summary.EvalSummary`.

    With ``out_dir``: episodes are appended to ``out_dir/episodes.jsonl`` (a rerun resumes),
    ``run.json`` records the setup, and the summary covers *every* row in the file; the reports
    (``summary.json``, ``report.md``, ``report.html``) are written unless ``write_report=False``.
    """
    from eval.ablation import ablation_drop, ablation_modes
    from eval.report import write_reports

    config = config or EvalConfig()
    modes = ablation_modes(config.image_ablation)
    summary = _evaluate_once(agent, dataset, replace(config, image_ablation=None), out_dir, judge, split, overwrite)
    for mode in modes:  # the same episodes again, with the images blanked or swapped
        ablated = _evaluate_once(agent, dataset, replace(config, image_ablation=mode),
                                 None if out_dir is None else Path(out_dir) / f"ablation_{mode}", judge, split, overwrite)
        if out_dir is not None and write_report:
            write_reports(Path(out_dir) / f"ablation_{mode}", ablated)
        summary.image_ablation[mode] = ablation_drop(summary, ablated)
    if out_dir is not None and write_report:
        write_reports(out_dir, summary)
    return summary


def _evaluate_once(agent: Agent, dataset: VQADataset, config: EvalConfig, out_dir: str | Path | None,
                   judge: Judge | None, split: str | None, overwrite: bool) -> EvalSummary:
    """One pass over the selected questions (see :func:`evaluate`), its summary not yet written."""
    from eval.metrics import summarize
    from medvqa_env.provenance import SKIPPED_FILE, check_not_all_skipped, dataset_provenance, write_skipped

    check_tool_names(config.tools)  # a typo: one line, no run folder, whatever the workers
    info = run_info(agent, dataset, config, split)
    if judge is not None:
        info["judge"] = judge.describe() if hasattr(judge, "describe") else repr(judge)

    def prepare_folder() -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        check_resume(out, info, overwrite)
        write_skipped(dataset, out)  # each row the loader skipped: file, line, id, reason (empty: none)

    prov = dataset_provenance(dataset)
    if not len(dataset) and prov is not None and prov.n_skipped:
        # the loader skipped every row: nothing to ask; the folder gets the list, the error says so
        if out_dir is not None:
            prepare_folder()
        check_not_all_skipped(dataset, None if out_dir is None else Path(out_dir) / SKIPPED_FILE)
    runner = Runner(agent, dataset, config, out_dir, judge)  # selects the questions; none is an error
    info["selection"] = describe_selection(dataset, runner.dataset, config.limit, config.shuffle, config.stratify,
                                           selection_seed(config))
    if out_dir is not None:
        prepare_folder()
        out = Path(out_dir)
        if overwrite and (out / RESULTS_FILE).exists():
            (out / RESULTS_FILE).unlink()
        (out / "run.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    start = time.perf_counter()
    new_rows = runner.run()
    wall = time.perf_counter() - start
    agent_usage = getattr(agent, "usage", None)
    if callable(agent_usage):  # who answered (the model the server reported) and the tokens, as the agent counted
        info["agent_usage"] = agent_usage()
        info["agent"] = agent.config()  # what was sent, after the server rejected any parameter
        if out_dir is not None:
            (Path(out_dir) / "run.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    if out_dir is not None:
        wanted = {episode_key(r.id, s) for r in runner.dataset for s in range(config.k)}
        rows = [r for r in load_results(Path(out_dir) / RESULTS_FILE) if r["key"] in wanted]
    else:
        rows = new_rows
    timing = {"wall_s": wall, "new_episodes": len(new_rows),
              "episodes_per_s": len(new_rows) / wall if new_rows and wall > 0 else None}
    summary = summarize(rows, k=config.k, run=info, timing=timing, resamples=config.bootstrap, seed=config.seed)
    if out_dir is not None:  # what failed, named, beside the setup it failed under
        info["failures"] = {"n_episodes": summary.n_episodes, "n_failed": summary.n_failed,
                            "failed_by_kind": summary.failed_by_kind, "failure_sources": summary.failure_sources}
        (Path(out_dir) / "run.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
        summary.run = dict(info)
    return summary
