"""The CPU platform for verl and its named patches, one by one (the whole trainer runs in
``test_verl_trainer_cpu.py``, in its own venv)."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from train.verl_integration import cpu_platform  # noqa: E402


def test_platform_answers_for_the_cpu():
    cls = cpu_platform._make_platform_class()
    from verl.plugin.platform.platform_manager import PlatformRegistry

    assert PlatformRegistry.get("cpu") is cls
    p = cls()
    assert (p.device_name, p.communication_backend_name(), p.ray_resource_name()) == ("cpu", "gloo", "GPU")
    assert p.current_device() == torch.device("cpu")  # verl does tensor.to(get_device_id())
    assert torch.ones(2).to(p.current_device()).device.type == "cpu"
    assert not p.is_ipc_supported() and p.is_available()
    dev = p.device_module
    dev.empty_cache(), dev.synchronize(), dev.set_device(0)  # verl's torch.cuda calls are harmless
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    state = dev.get_rng_state()
    a = torch.rand(3)
    dev.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))


def test_env_vars_name_this_module_and_are_strings():
    env = cpu_platform.cpu_env_vars()
    assert env["VERL_USE_EXTERNAL_MODULES"] == "train.verl_integration.cpu_platform"
    assert env["VERL_PLATFORM"] == "cpu" and env["VERL_ENGINE_DEVICE"] == "cuda"
    assert all(isinstance(v, str) for v in env.values())  # Ray's runtime_env wants strings


def patch(name):
    return next(p for p in cpu_platform.PATCHES if p.name == name)


def test_gloo_backend_rewrites_only_the_degenerate_string():
    calls = []
    dist = types.SimpleNamespace(init_process_group=lambda *a, **k: calls.append(k))
    patch("gloo_backend").apply(dist)
    dist.init_process_group(backend="cpu:gloo,cpu:gloo", rank=0)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl")
    assert [c["backend"] for c in calls] == ["gloo", "cpu:gloo,cuda:nccl"]


def test_fsdp_patches():
    init_utils = types.SimpleNamespace(_check_module_states_for_sync_module_states=None)
    patch("fsdp_sync_on_cpu").apply(init_utils)
    assert init_utils._check_module_states_for_sync_module_states([torch.zeros(1)]) is None
    fsdp_utils = types.SimpleNamespace(load_fsdp_model_to_gpu=None)
    patch("fsdp_already_on_cpu").apply(fsdp_utils)
    assert fsdp_utils.load_fsdp_model_to_gpu(object()) is None


def test_vllm_linears_read_the_live_weight():
    """After the patch a linear layer computes with whatever weight it holds now -- the weights
    verl's sync writes -- and keeps that weight (vLLM-CPU's prepack would empty it)."""
    original = []
    layer_utils = types.SimpleNamespace(dispatch_cpu_unquantized_gemm=lambda layer, rw: original.append(layer))
    patch("vllm_live_weights").apply(layer_utils)
    layer = torch.nn.Linear(4, 3)
    layer_utils.dispatch_cpu_unquantized_gemm(layer, True)
    x = torch.randn(2, 4)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(3, 4))  # a weight sync after loading
        assert torch.allclose(layer.cpu_linear(x, layer.weight, layer.bias), x @ layer.weight.T + layer.bias)
    conv = torch.nn.Conv1d(2, 2, 3)  # not a dense 2-D weight: vLLM's own dispatch
    layer_utils.dispatch_cpu_unquantized_gemm(conv, True)
    assert original == [conv]


def test_a_patch_runs_when_its_module_is_imported(tmp_path, monkeypatch):
    (tmp_path / "medvqa_fake_accel.py").write_text("def f():\n    return 'accelerator'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = cpu_platform.Patch("fake", "medvqa_fake_accel", "medvqa_fake_accel.f", "test",
                           lambda m: setattr(m, "f", lambda: "cpu"))
    finder = cpu_platform._PatchOnImport({"medvqa_fake_accel": [p]})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "medvqa_fake_accel", raising=False)
    monkeypatch.setattr(cpu_platform, "_APPLIED", set())
    from medvqa_fake_accel import f  # the importer already sees the patched name

    assert f() == "cpu" and cpu_platform.applied() == ["fake"]


def test_alias_dist_is_found_under_vllm(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(version="0.32.0")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: fake)
    info = cpu_platform.alias_vllm_dist(str(tmp_path))
    monkeypatch.undo()
    dists = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(tmp_path)])}
    assert dists == {"vllm": "0.32.0+cpu"} and info.endswith("vllm-0.32.0+cpu.dist-info")
