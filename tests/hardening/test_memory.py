"""Memory stays bounded over long runs: the tool result caches evict by bytes as well as by count.

Found by ``benchmarks/soak.py``: env workers grew ~150 MiB a minute because each toolbox cached
up to 2048 results with their images (0.9 GB for 336-px zooms; several GB for overlays of large
scans), so thousands of parallel envs could run a node out of memory over days.
"""

from __future__ import annotations

import pickle
import random

from PIL import Image

from medvqa_env.parser import ToolCall
from tool_backends.base import ToolContext, ToolResult
from tool_backends.toolbox import Toolbox, ToolCache, result_nbytes

MiB = 1024 * 1024


def test_a_long_run_of_distinct_calls_keeps_the_cache_within_its_byte_budget():
    cache = ToolCache(max_entries=10_000, max_bytes=8 * MiB)
    box = Toolbox.from_config({"image_zoom_in": "local"}, cache=cache)
    image = Image.radial_gradient("L").resize((512, 512)).convert("RGB")
    rng = random.Random(0)
    calls = []
    for _ in range(200):
        x, y = rng.randrange(400), rng.randrange(400)
        calls.append(ToolCall("image_zoom_in", {"bbox": [x, y, x + 80, y + 80]}))
        box.call(calls[-1], [image], ToolContext(record_id="r"))
        assert cache.nbytes <= 8 * MiB
    assert 0 < len(cache) < 200  # evicted by bytes long before the entry limit
    # its own pixels and text, plus the source image the undrawn crops keep alive, counted once
    assert cache.nbytes == sum(result_nbytes(r) for r in cache._data.values()) + 512 * 512 * 3
    again = box.call(calls[-1], [image], ToolContext(record_id="r"))
    assert again.cached, "the newest results are still served from the cache"
    assert not box.call(calls[0], [image], ToolContext(record_id="r")).cached


def test_an_oversized_result_is_not_cached_and_the_budget_survives_pickling():
    cache = ToolCache(max_entries=4, max_bytes=MiB)
    cache.put("big", ToolResult("x", images=[Image.new("RGB", (1024, 1024))]))
    cache.put("small", ToolResult("y"))
    assert cache.get("big") is None and cache.get("small").text == "y"
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.max_entries, copy.max_bytes, len(copy), copy.nbytes) == (4, MiB, 0, 0)


def test_cached_results_count_the_source_images_they_keep_alive():
    """Undrawn result images hold their source image: six 4000^2 scans kept that way were +318 MB
    outside a 128 MiB budget (issue 28). Each source now counts once, and is let go on eviction."""
    import gc
    import weakref

    from medvqa_env.images import LazyImage

    def crop_of(source, k):  # as tools draw their crops: the source in the closure
        return LazyImage(lambda: source.crop((k, 0, k + 10, 10)), (10, 10))

    cache = ToolCache(max_entries=100, max_bytes=64 * MiB)
    alive = []
    for i in range(8):
        source = Image.new("RGB", (2000, 2000), (i, 0, 0))  # 12 MB of pixels each
        alive.append(weakref.ref(source))
        for k in range(3):  # three crops of each: the source is counted once
            cache.put(f"{i}-{k}", ToolResult("crop", images=[crop_of(source, k)]))
        del source
        assert cache.nbytes <= 64 * MiB
    gc.collect()
    kept = [r() for r in alive if r() is not None]
    assert 1 <= len(kept) <= 5, f"{len(kept)} source images of 12 MB kept alive by a 64 MiB cache"
    assert sum(im.width * im.height * 3 for im in kept) <= cache.nbytes <= 64 * MiB
    assert cache.get("0-0") is None and cache.get("7-2") is not None  # the oldest went, with their sources


def test_replacing_an_entry_does_not_double_count_it():
    cache = ToolCache(max_entries=4, max_bytes=MiB)
    for _ in range(3):
        cache.put("k", ToolResult("same"))
    assert len(cache) == 1 and cache.nbytes == result_nbytes(ToolResult("same"))
