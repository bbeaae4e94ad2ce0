"""OCR reward throughput: in-process (rapidocr + scoring, one thread) vs the HTTP service at several concurrencies.

    python bench/ocr_throughput.py [--num-images 32] [--image-size 512] [--batch-size 4] [--concurrency 1,8]
                                   [--threads 2] [--workers 1] [--ort-threads -1] [--smoke]

Starts the OCR service on a free port (``OcrServiceProcess``), renders text images with Pillow, and times
(a) ``recognize_text`` + ``ocr_score`` called directly, sequentially, in this process, and (b) the ``ocr`` reward
client (PNG encoding + HTTP + service) with ``max_concurrent_requests`` = each concurrency. Prints a table, the
HTTP/in-process ratios and the command line to rerun.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deepgen_rl.rewards import get_reward  # noqa: E402
from deepgen_rl.services.ocr import engine  # noqa: E402
from deepgen_rl.services.ocr.launch import OcrServiceProcess, render_text_image  # noqa: E402
from deepgen_rl.services.ocr.scoring import ocr_score  # noqa: E402

WORDS = ["OPEN", "SALE", "COFFEE", "DeepGen", "HELLO", "NEON", "BAKERY", "EXIT", "RL", "2026"]


def make_batch(n: int, size: int) -> tuple[list, list[str]]:
    images, prompts = [], []
    for i in range(n):
        text = f"{WORDS[i % len(WORDS)]} {WORDS[(3 * i + 1) % len(WORDS)]}"
        images.append(render_text_image(text, size=(size, size), font_size=max(16, size // 12)))
        prompts.append(f'a sign that says "{text}"')
    return images, prompts


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=32, help="images per measurement")
    parser.add_argument("--image-size", type=int, default=512, help="square image side in pixels")
    parser.add_argument("--batch-size", type=int, default=4, help="images per HTTP request")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated HTTP request concurrencies")
    parser.add_argument("--threads", type=int, default=2, help="OCR_THREADS of the service (per worker process)")
    parser.add_argument("--workers", type=int, default=1, help="OCR_WORKERS (uvicorn processes)")
    parser.add_argument("--ort-threads", type=int, default=-1, help="OCR_ORT_THREADS (onnxruntime intra-op threads)")
    parser.add_argument("--smoke", action="store_true", help="tiny run (2 images of 192 px) to check the bench works")
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_images, args.image_size, args.batch_size = 2, 192, 1
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    images, prompts = make_batch(args.num_images, args.image_size)
    rows = []

    engine.set_onnxruntime_threads(args.ort_threads)
    engine.recognize_text(images[0])  # warm-up: engine creation, first-run allocations
    start = time.perf_counter()
    local_scores = [ocr_score(p, engine.recognize_text(img)) for img, p in zip(images, prompts)]
    seconds = time.perf_counter() - start
    rows.append(("in-process (rapidocr + scoring)", 1, seconds, sum(local_scores) / len(local_scores)))

    env = {"OCR_THREADS": str(args.threads), "OCR_WORKERS": str(args.workers), "OCR_ORT_THREADS": str(args.ort_threads),
           "REWARD_API_TOKEN": ""}
    with OcrServiceProcess(env=env, startup_timeout_s=120) as service:
        for concurrency in args.concurrency:
            reward = get_reward("ocr", url=service.url, batch_size=args.batch_size,
                                max_concurrent_requests=concurrency, token="")
            reward(images[: max(1, args.workers * args.threads)], prompts[: max(1, args.workers * args.threads)])
            start = time.perf_counter()
            out = reward(images, prompts, [{}] * len(images))
            seconds = time.perf_counter() - start
            if not bool(out.valid.all()):
                print(f"WARNING: {int((~out.valid).sum())} images not scored: {out.info.get('errors')}")
            rows.append((f"HTTP (batch {args.batch_size})", concurrency, seconds, float(out.scores.mean())))

    base = args.num_images / rows[0][2]
    print(f"\nOCR throughput: {args.num_images} images of {args.image_size}x{args.image_size}, service "
          f"OCR_WORKERS={args.workers} OCR_THREADS={args.threads} OCR_ORT_THREADS={args.ort_threads}, "
          f"{os.cpu_count()} CPUs")
    header = f"{'mode':<34} {'concurrency':>11} {'seconds':>8} {'images/s':>9} {'vs in-proc':>10} {'mean score':>10}"
    print(header)
    print("-" * len(header))
    for mode, concurrency, seconds, mean_score in rows:
        rate = args.num_images / seconds
        print(f"{mode:<34} {concurrency:>11} {seconds:>8.2f} {rate:>9.2f} {rate / base:>9.2f}x {mean_score:>10.3f}")
    ratios = ", ".join(f"c={c}: {args.num_images / s / base:.2f}x" for _, c, s, _ in rows[1:])
    print(f"\nHTTP / in-process throughput ratios: {ratios}")
    print("rerun: python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__), *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
