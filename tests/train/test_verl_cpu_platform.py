"""The CPU platform for verl and its named patches, one by one (the whole trainer runs in
``test_verl_trainer_cpu.py``, in its own venv)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
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


def test_fsdp_already_on_cpu():
    fsdp_utils = types.SimpleNamespace(load_fsdp_model_to_gpu=None)
    patch("fsdp_already_on_cpu").apply(fsdp_utils)
    assert fsdp_utils.load_fsdp_model_to_gpu(object()) is None


def test_fsdp_patches_act_only_while_verl_builds_its_fsdp_module():
    """``fsdp_sync_on_cpu`` and ``no_param_offload`` wrap ``FSDPEngine._build_fsdp_module``: inside
    it torch's CPU-tensor check for ``sync_module_states`` is lifted and ``CPUOffload(offload_params=
    True)`` builds no offload; outside it (before, after, anywhere else in the process) torch is
    untouched -- ``Tensor.pin_memory`` included, which no patch replaces any more."""
    import torch.distributed.fsdp as fsdp
    import torch.distributed.fsdp._init_utils as init_utils

    check, pin = init_utils._check_module_states_for_sync_module_states, torch.Tensor.pin_memory
    seen = {}

    class FSDPEngine:
        def _build_fsdp_module(self, module):
            seen["check"] = init_utils._check_module_states_for_sync_module_states([torch.zeros(1)])
            seen["offload"] = fsdp.CPUOffload(offload_params=True).offload_params
            return module

    transformer_impl = types.SimpleNamespace(FSDPEngine=FSDPEngine)
    patch("fsdp_sync_on_cpu").apply(transformer_impl)
    patch("no_param_offload").apply(transformer_impl)
    patch("no_param_offload").apply(transformer_impl)  # idempotent: one wrapper per patch
    assert FSDPEngine()._build_fsdp_module("m") == "m"
    assert seen == {"check": None, "offload": False}
    assert init_utils._check_module_states_for_sync_module_states is check
    assert fsdp.CPUOffload(offload_params=True).offload_params is True
    assert torch.Tensor.pin_memory is pin
    with pytest.raises(ValueError, match="CPU parameters"):  # torch's own check, outside verl's call
        check([torch.zeros(1)])


def test_verls_reference_wrap_builds_on_cpu_only_inside_the_patches(tmp_path):
    """The real thing: FSDP1 around a module on the CPU with what verl passes for its reference
    policy (``sync_module_states=True``, ``CPUOffload(offload_params=True)``) on a gloo group fails
    as torch stands and builds inside the two patches' contexts, with no parameter offload."""
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        def wrap():
            return fsdp.FullyShardedDataParallel(torch.nn.Linear(4, 4), device_id=torch.device("cpu"),
                                                 sync_module_states=True,
                                                 cpu_offload=fsdp.CPUOffload(offload_params=True))

        with pytest.raises((ValueError, RuntimeError)):
            wrap()
        with cpu_platform.fsdp_sync_on_cpu_context(), cpu_platform.no_param_offload_context():
            model = wrap()
        assert not model.cpu_offload.offload_params
        x = torch.randn(2, 4)
        assert torch.allclose(model(x), model.module(x))
    finally:
        dist.destroy_process_group()


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
    p = cpu_platform.Patch("fake", "medvqa_fake_accel", "medvqa_fake_accel.f", "test", "never",
                           lambda m: setattr(m, "f", lambda: "cpu"))
    finder = cpu_platform._PatchOnImport({"medvqa_fake_accel": [p]})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "medvqa_fake_accel", raising=False)
    monkeypatch.setattr(cpu_platform, "_APPLIED", set())
    from medvqa_fake_accel import f  # the importer already sees the patched name

    assert f() == "cpu" and cpu_platform.applied() == ["fake"]


def test_vllm_imports_smart_resize_from_the_pil_module_while_it_loads():
    """``vllm_qwen2vl_pil_resize``: while vLLM's ``qwen2_vl`` module executes, its import of
    ``smart_resize`` from transformers' torchvision image processor resolves to the PIL module (the
    same function); afterwards that module name is unbound again."""
    import importlib

    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the patch does nothing")
    name = cpu_platform.TORCHVISION_IMAGE_PROCESSOR
    assert name not in sys.modules
    with cpu_platform.pil_smart_resize_context():
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    assert smart_resize is pil.smart_resize and name not in sys.modules
    with pytest.raises(ImportError):  # as transformers stands without torchvision
        importlib.import_module(name)


def test_a_patch_can_be_in_force_while_its_module_executes(tmp_path, monkeypatch):
    (tmp_path / "medvqa_fake_vllm_model.py").write_text("from medvqa_fake_missing import f\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    from contextlib import contextmanager

    @contextmanager
    def provide():
        sys.modules["medvqa_fake_missing"] = types.SimpleNamespace(f=lambda: "stand-in")
        try:
            yield
        finally:
            del sys.modules["medvqa_fake_missing"]

    p = cpu_platform.Patch("fake_around", "medvqa_fake_vllm_model", "import", "test", "never", cpu_platform._no_op,
                           around=provide)
    finder = cpu_platform._PatchOnImport({"medvqa_fake_vllm_model": [p]})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "medvqa_fake_vllm_model", raising=False)
    monkeypatch.setattr(cpu_platform, "_APPLIED", set())
    import medvqa_fake_vllm_model

    assert medvqa_fake_vllm_model.f() == "stand-in" and "medvqa_fake_missing" not in sys.modules
    assert cpu_platform.applied() == ["fake_around"]


def test_qwen2vl_processor_loads_images_only(monkeypatch):
    """``qwen2vl_processor_images_only``: ``Qwen2VLProcessor`` asks for its image processor and
    tokenizer only (the video processor needs torchvision); its subclasses are left alone."""
    import transformers.models.qwen2_vl.processing_qwen2_vl as processing

    cls = processing.Qwen2VLProcessor
    monkeypatch.setattr(cls, "get_attributes", cls.get_attributes)
    before = cls.get_attributes()
    assert "video_processor" in before

    class Sub(cls):
        pass

    patch("qwen2vl_processor_images_only").apply(processing)
    if importlib.util.find_spec("torchvision") is not None:
        assert cls.get_attributes() == before
        return
    assert cls.get_attributes() == [a for a in before if a != "video_processor"]
    assert Sub.get_attributes() == before


def test_vllm_qwen2vl_serves_images_only():
    class Qwen2VLProcessingInfo:
        def get_supported_mm_limits(self):
            return {"image": None, "video": None}

    qwen2_vl = types.SimpleNamespace(Qwen2VLProcessingInfo=Qwen2VLProcessingInfo)
    patch("vllm_qwen2vl_images_only").apply(qwen2_vl)
    limits = Qwen2VLProcessingInfo().get_supported_mm_limits()
    assert limits == ({"image": None, "video": None} if importlib.util.find_spec("torchvision") else {"image": None})


def test_the_vllm_plugin_is_registered_by_its_dist_info(tmp_path):
    """vLLM loads ``vllm.general_plugins`` entry points first in each process it starts; the dist-info
    the setup writes names :func:`cpu_platform.vllm_plugin` there."""
    info = cpu_platform.vllm_plugin_dist(str(tmp_path))
    (dist,) = list(importlib.metadata.distributions(path=[str(tmp_path)]))
    (ep,) = [e for e in dist.entry_points if e.group == "vllm.general_plugins"]
    assert ep.value == "train.verl_integration.cpu_platform:vllm_plugin" and ep.load() is cpu_platform.vllm_plugin
    assert info.endswith("medvqa_verl_cpu-0.dist-info")


def test_docs_list_every_patch_with_what_removes_it():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "verl.md").read_text()
    for p in cpu_platform.PATCHES:
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{p.name}` |")), None)
        assert row is not None, f"docs/verl.md has no table row for patch {p.name}"
        assert f"| {p.remove_when} |" in row, (p.name, p.remove_when, row)


def test_alias_dist_is_found_under_vllm(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(version="0.32.0")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: fake)
    info = cpu_platform.alias_vllm_dist(str(tmp_path))
    monkeypatch.undo()
    dists = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(tmp_path)])}
    assert dists == {"vllm": "0.32.0+cpu"} and info.endswith("vllm-0.32.0+cpu.dist-info")


def test_mrope_position_ids_of_one_length_survive_verls_fix_and_the_mini_batch_split():
    """Position ids (bs, 4, seq) reassembled the way verl's padding and TransferQueue do
    (``torch.nested.as_nested_tensor``): with every sequence of one length torch nests them on the 4
    rows. verl's ``maybe_fix_3d_position_ids`` then sets the ragged index to 2 and its mini-batch split
    fails, as in CI; with the patch they are nested on the sequence and every row comes back."""
    from tensordict import TensorDict

    from verl.utils import tensordict_utils

    def batch(lengths):
        rows = [torch.arange(n).expand(4, n) + 10 * i for i, n in enumerate(lengths)]
        return rows, TensorDict({"position_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)},
                                batch_size=len(lengths))

    rows, data = batch([5, 5, 5])
    assert data["position_ids"]._ragged_idx == 1  # torch's choice: nested on the rows
    tensordict_utils.maybe_fix_3d_position_ids(data)
    with pytest.raises(RuntimeError):  # CI's run: "split_with_sizes expects split_sizes to sum exactly to ..."
        tensordict_utils.index_select_tensor_dict(data, torch.tensor([0, 2]))

    module = types.SimpleNamespace(**{name: getattr(tensordict_utils, name) for name in
                                      ("maybe_fix_3d_position_ids", "nested_tensor_from_tensor_list")})
    patch("mrope_ragged_positions").apply(module)
    for lengths in ([5, 5, 5], [3, 5, 4], [4]):
        rows, data = batch(lengths)
        module.maybe_fix_3d_position_ids(data)
        assert data["position_ids"]._ragged_idx == 2
        picked = tensordict_utils.index_select_tensor_dict(data, torch.tensor([len(lengths) - 1, 0]))
        got = picked["position_ids"].unbind()
        assert torch.equal(got[0], rows[-1]) and torch.equal(got[1], rows[0])
