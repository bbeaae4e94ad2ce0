"""Model rewards' CPU throughput with their tiny random models: in-process vs through the reward server.

    python bench/reward_throughput.py [--num-images 32] [--image-size 256] [--batch-size 4] [--concurrency 1,8]
                                      [--threads 2] [--micro-batch off] [--rewards pickscore,aesthetic,geneval]
                                      [--smoke]

Builds each reward's tiny model in the real format (deepgen_rl/rewards/testing.py), then in ONE run measures
(a) the reward called in this process on the whole list (its own internal batching), and (b) the same reward hosted
by ``python -m deepgen_rl.services.reward`` (one server for all of them, ``--threads`` scoring threads) through the
``remote`` client with requests of ``--batch-size`` images and ``--concurrency`` requests in flight. Served scores
are checked against the in-process ones. Tiny models make this a measure of the server's overhead (PNG encoding,
HTTP, decoding, queueing), not of real model speed; on real models the forward dominates.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import load_note, print_ratio, print_rerun, print_table, setup_env  # noqa: E402


def build_models(root: str) -> dict[str, dict]:
    """Tiny models on disk and each reward's kwargs."""
    from deepgen_rl.rewards.testing import (build_aesthetic_head, build_tiny_clip, build_tiny_hpsv2,
                                            build_tiny_imagereward, build_tiny_owlv2)

    clip = build_tiny_clip(os.path.join(root, "clip"))
    return {
        "pickscore": {"model_name_or_path": clip},
        "aesthetic": {"model_name_or_path": clip, "head_path": build_aesthetic_head(os.path.join(root, "head.pth"))},
        "hpsv2": build_tiny_hpsv2(root),
        "imagereward": build_tiny_imagereward(root),
        "geneval": {"detector_path": build_tiny_owlv2(os.path.join(root, "owlv2")), "threshold": 0.0,
                    "partial": True},
    }


def make_batch(n: int, size: int):
    from PIL import Image

    images = [Image.new("RGB", (size, size), ((37 * i) % 256, (91 * i) % 256, 120)) for i in range(n)]
    prompts = [f"a photo of a {'cat' if i % 2 else 'dog'} left of a bench" for i in range(n)]
    metadata = [{"include": [{"class": "dog", "count": 1}, {"class": "bench", "count": 1,
                                                            "position": ["right of", 0]}]} for _ in range(n)]
    return images, prompts, metadata


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4, help="images per HTTP request")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated request concurrencies")
    parser.add_argument("--threads", type=int, default=2, help="REWARD_THREADS of the server")
    parser.add_argument("--micro-batch", choices=("auto", "on", "off"), default="off")
    parser.add_argument("--rewards", default="pickscore,aesthetic,hpsv2,imagereward,geneval")
    parser.add_argument("--smoke", action="store_true", help="8 images of 64 px")
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_images, args.image_size = 8, 64
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.rewards = [r for r in args.rewards.split(",") if r]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(1)
    import torch

    from deepgen_rl.rewards import get_reward
    from deepgen_rl.services.reward.launch import RewardServerProcess

    images, prompts, metadata = make_batch(args.num_images, args.image_size)
    rows, local_scores, rates = [], {}, {}
    with tempfile.TemporaryDirectory() as root:
        kwargs = {name: kw for name, kw in build_models(root).items() if name in args.rewards}
        for name, kw in kwargs.items():
            reward = get_reward(name, **kw)
            reward(images[:2], prompts[:2], metadata[:2])  # warm-up
            start = time.perf_counter()
            out = reward(images, prompts, metadata)
            seconds = time.perf_counter() - start
            local_scores[name] = out.scores
            rates[(name, "in-process", 1)] = args.num_images / seconds
        env = {"REWARD_THREADS": str(args.threads), "REWARD_API_TOKEN": ""}
        server_args = ["--micro_batch", args.micro_batch]
        with RewardServerProcess(list(kwargs), json.loads(json.dumps(kwargs)), env=env, args=server_args) as server:
            for name in kwargs:
                for concurrency in args.concurrency:
                    client = get_reward(name, remote_url=server.url, batch_size=args.batch_size,
                                        max_concurrent_requests=concurrency, token="")
                    client(images[:2], prompts[:2], metadata[:2])  # warm-up (connections)
                    start = time.perf_counter()
                    out = client(images, prompts, metadata)
                    seconds = time.perf_counter() - start
                    if not bool(out.valid.all()) or not torch.allclose(out.scores, local_scores[name], atol=1e-4):
                        print(f"WARNING: {name} served scores differ from in-process or are invalid: "
                              f"{out.info.get('errors')}")
                    rates[(name, "served", concurrency)] = args.num_images / seconds
    for name in kwargs:
        base = rates[(name, "in-process", 1)]
        rows.append([name, "in-process", "-", base, 1.0])
        for concurrency in args.concurrency:
            rate = rates[(name, "served", concurrency)]
            rows.append([name, f"served (batch {args.batch_size})", str(concurrency), rate, rate / base])
    print_table(f"Reward throughput, tiny models, {args.num_images} images of {args.image_size}px, server "
                f"REWARD_THREADS={args.threads} micro_batch={args.micro_batch}; {load_note()}",
                ["reward", "mode", "concurrency", "images/s", "vs in-process"], rows, ["", "", "", ".1f", ".2f"])
    for name in kwargs:
        for concurrency in args.concurrency:
            print_ratio(f"reward_throughput {name} served c={concurrency} / in-process",
                        rates[(name, "served", concurrency)] / rates[(name, "in-process", 1)])
    print_rerun(__file__, threads=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
