"""Text rows the DiT sees: prompt lengths of the recipe's files, truncation, DiT FLOPs and the cost of the mask.

    OMP_NUM_THREADS=1 python bench/prompt_rows.py [--data-dir DIR] [--image-size 512] [--iters 5] [--smoke]

1. Prompt lengths of the recipe's public files (``../shared/data`` or, after ``scripts/download_data.sh``,
   ``assets/rl_datasets/deepgen``). No Qwen2.5 tokenizer is available offline, so tokens are estimated from the
   Qwen2 pre-tokenizer split (its published regex: words with their leading space, single digits, punctuation runs),
   which on English text is ≈ 1.3 pieces per whitespace word: central estimate 1 token per piece (a 151k-vocabulary
   BPE keeps almost every English word whole; every CJK character counts as one piece), upper estimate 1.5 tokens
   per piece, plus 13 template tokens.
2. Share truncated at the old limit (256 tokens) and at the new one (1024), central and upper estimates.
3. Analytic DiT FLOPs per 512² forward (``bench/gpu_throughput.dit_forward_flops``, checked there against
   FlopCounterMode) for the recipe's training mix (datasets drawn ∝ size × sample_weight, as
   ``sampling_mode: sample_proportional``): before, every prompt was padded to 256 + 128 = 384 rows; after, a prompt
   alone gives n + 128 rows and a rollout micro-batch (32 images = 4 prompts × 8) runs at its longest prompt.
4. CPU step time (DiT forward + backward, as in the policy loss) on the "small" tiny preset with the text-masked
   attention versus the same rows unmasked (same shapes): the mask's own cost.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, TINY_CONFIG, load_note, median, print_ratio, print_rerun, print_table, setup_env  # noqa: E402

PRETOKEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
            r"|\s+(?!\S)|\s+")
TEMPLATE_TOKENS = 13  # <|im_start|> user \n Generate ␣an ␣image : … <|im_end|> \n <|im_start|> assistant \n
UPPER_FACTOR = 1.5
# NEW_LIMIT is the real model config's max_prompt_tokens (= DEFAULT_MAX_PROMPT_TOKENS, deepgen_rl/models/deepgen/
# model.py), a literal so that importing this file loads no torch; tests/models/test_prompt_limit.py keeps them equal
OLD_LIMIT, NEW_LIMIT, OLD_ROWS, QUERIES = 256, 1024, 256 + 128, 128
TRAIN_FILES = {  # the recipe's YAML: file -> sample_weight
    "unigenbench_train_data_ocr.txt": 3.0, "qwenimage_textrender.txt": 3.0, "text_render_less.txt": 3.0,
    "unigenbench_train_data_general.txt": 1.0, "blip3o_60k.txt": 1.0, "share_4o_img.txt": 1.0, "corebench.txt": 1.0,
}
EVAL_FILES = ("geneval_prompt.txt", "prompts_dpgbench.jsonl", "unigenbench/test_prompts_en.csv",
              "unigenbench/test_prompts_en_long.csv", "unigenbench/test_prompts_zh.csv",
              "unigenbench/test_prompts_zh_long.csv")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="folder with the prompt files (default: ../shared/data, then "
                   "assets/rl_datasets/deepgen and its eval/)")
    p.add_argument("--image-size", type=int, default=512, help="image side of the FLOP figures")
    p.add_argument("--micro-batch-prompts", type=int, default=4, help="prompts per rollout micro-batch (32 / 8)")
    p.add_argument("--timing-image-size", type=int, default=256, help="image side of the CPU timing")
    p.add_argument("--timing-batch", type=int, default=4, help="images per timed DiT forward+backward")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per variant (interleaved)")
    p.add_argument("--preset", default="small", choices=["tiny", "small"], help="tiny model preset for the timing")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny preset, 64 px, 2 iterations, 300 prompts per file")
    a = p.parse_args(argv)
    if a.smoke:
        a.preset, a.timing_image_size, a.iters, a.timing_batch = "tiny", 64, 2, 2
    return a


def find_file(name: str, data_dir: str | None) -> Path | None:
    dirs = [Path(data_dir)] if data_dir else [ROOT.parent / "shared" / "data", ROOT / "assets/rl_datasets/deepgen",
                                              ROOT / "assets/rl_datasets/deepgen/eval"]
    for d in dirs:
        if (d / name).is_file():
            return d / name
    return None


def token_estimates(prompts: list[str]) -> tuple[list[int], list[int], list[int]]:
    """(words, central tokens, upper tokens) per prompt, template included in the token counts."""
    import regex

    pat, cjk = regex.compile(PRETOKEN), regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]")
    words = [len(p.split()) for p in prompts]
    # a run of CJK characters is one pre-token piece but several tokens: count every character as a piece
    pieces = [len(pat.findall(cjk.sub(lambda m: " " + m.group(0), p))) for p in prompts]
    return (words, [n + TEMPLATE_TOKENS for n in pieces],
            [math.ceil(UPPER_FACTOR * n) + TEMPLATE_TOKENS for n in pieces])


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_env(args.threads)
    import torch

    from deepgen_rl.data.prompts import read_prompt_file
    from gpu_throughput import FULL, dit_forward_flops

    limit = 300 if args.smoke else None
    # ---------------------------------------------------------------- 1-2: lengths and truncation
    rows, train = [], {}
    for name in list(TRAIN_FILES) + list(EVAL_FILES):
        path = find_file(name, args.data_dir)
        if path is None:
            rows.append([name, 0, float("nan"), float("nan"), float("nan"), "-", "-", "not present"])
            continue
        prompts = read_prompt_file(path)[:limit]
        words, central, upper = token_estimates(prompts)
        if name in TRAIN_FILES:
            train[name] = central
        n = len(prompts)
        share = lambda toks, lim: f"{100 * sum(t > lim for t in toks) / n:.1f}%"  # noqa: E731
        rows.append([name, n, float(max(words)), float(max(central)), float(max(upper)),
                     f"{share(central, OLD_LIMIT)} / {share(upper, OLD_LIMIT)}",
                     f"{share(central, NEW_LIMIT)} / {share(upper, NEW_LIMIT)}",
                     "train" if name in TRAIN_FILES else "eval"])
    print(f"prompt_rows: text rows of the recipe's prompts ({load_note()})")
    print_table("prompt lengths (tokens incl. the 13-token template; central = 1 per Qwen2 pre-token piece, "
                f"upper = {UPPER_FACTOR} per piece)",
                ["file", "prompts", "max words", "max tokens", "max upper", f"> {OLD_LIMIT} (old)",
                 f"> {NEW_LIMIT} (new)", "use"], rows, ["", "", ".0f", ".0f", ".0f", "", "", ""])
    if not train:
        print("no training prompt file found: run scripts/download_data.sh or pass --data-dir")
        return 1
    all_train = [t for toks in train.values() for t in toks]
    over_old = sum(t > OLD_LIMIT for t in all_train) / len(all_train)
    print(f"\ntraining prompts present: {len(all_train)} in {len(train)} of {len(TRAIN_FILES)} files; truncated at "
          f"{OLD_LIMIT}: {100 * over_old:.1f}% (central); at {NEW_LIMIT}: "
          f"{100 * sum(t > NEW_LIMIT for t in all_train) / len(all_train):.1f}%")

    # ---------------------------------------------------------------- 3: FLOPs of the mix
    latent = args.image_size // 8
    flops = lambda rows_: sum(dit_forward_flops(FULL["dit"], 1, latent, rows_).values())  # noqa: E731
    weights = {k: len(v) * TRAIN_FILES[k] for k, v in train.items()}  # sample_proportional over present files
    rng = random.Random(0)
    names = list(train)
    draws = [rng.choices(names, weights=[weights[k] for k in names])[0] for _ in range(20_000)]
    alone = [min(rng.choice(train[k]), NEW_LIMIT) + QUERIES for k in draws]
    mb = args.micro_batch_prompts
    batched = [max(alone[i:i + mb]) for i in range(0, len(alone) - mb + 1, mb) for _ in range(mb)]
    before = flops(OLD_ROWS)
    mean_alone = sum(flops(r) for r in alone) / len(alone)
    mean_batched = sum(flops(r) for r in batched) / len(batched)
    print_table(f"DiT FLOPs per {args.image_size}² forward, SD3.5-Medium config, recipe mix over the files present",
                ["variant", "mean text rows", "GFLOPs/image"],
                [[f"before: fixed {OLD_LIMIT}+{QUERIES} rows", float(OLD_ROWS), before / 1e9],
                 ["after: prompt alone, n+128 rows", sum(alone) / len(alone), mean_alone / 1e9],
                 [f"after: micro-batch of {mb} prompts (longest)", sum(batched) / len(batched), mean_batched / 1e9]],
                ["", ".1f", ".1f"])
    print_ratio(f"dit_flops after/before (prompt alone, {args.image_size}px)", mean_alone / before)
    print_ratio(f"dit_flops after/before (micro-batch of {mb} prompts, {args.image_size}px)", mean_batched / before)

    # ---------------------------------------------------------------- 4: masked vs unmasked step time
    from deepgen_rl.models import Conditioning, build_model

    model = build_model(TINY_CONFIG, tiny_preset=args.preset)
    dit = model.transformer.train()
    prompts = ["a cat", "two dogs run across a green field under a clear sky at night with many people and cars",
               "a red apple", "the word OPEN in bright yellow letters above the door"]
    prompts = (prompts * args.timing_batch)[: args.timing_batch]
    cond = model.encode_prompts(prompts)
    unmasked = Conditioning(cond.prompt_embeds, cond.pooled_embeds)  # same rows, every one attended
    g = torch.Generator().manual_seed(0)
    shape = model.latent_shape(args.timing_image_size, args.timing_image_size)
    latents = torch.randn((args.timing_batch, *shape), generator=g)
    sigma = torch.full((args.timing_batch,), 0.5)

    def step(c) -> float:
        dit.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        model.predict_velocity(latents, sigma, c).square().mean().backward()
        return time.perf_counter() - t0

    step(cond), step(unmasked)  # warm-up (also installs the masked processor)
    times = {"masked": [], "unmasked": []}
    for _ in range(args.iters):  # interleaved so drifting machine load hits both alike
        times["masked"].append(step(cond))
        times["unmasked"].append(step(unmasked))
    m, u = median(times["masked"]), median(times["unmasked"])
    real = cond.text_mask.sum(1)
    print_table(f"CPU DiT forward+backward, preset {args.preset!r}, {args.timing_batch} images of "
                f"{args.timing_image_size}², {cond.prompt_embeds.shape[1]} text rows "
                f"({int(real.min())}–{int(real.max())} real), median of {args.iters}",
                ["attention", "seconds"], [["text-masked", m], ["unmasked", u]], ["", ".4f"])
    print_ratio(f"step_time masked/unmasked ({args.preset}, CPU)", m / u)
    print_rerun(__file__, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
