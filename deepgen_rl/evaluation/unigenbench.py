"""UniGenBench judge client and standalone scorer.

The judge is an OpenAI-compatible chat-completions server (``bash scripts/eval_unigenbench_evalmodel.sh`` serves
``CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1`` with vLLM). One request per image: ONE user message whose content
is the image (re-encoded as RGB JPEG quality 95, ``data:image/jpeg;base64,…``) followed by the instruction text
(:mod:`deepgen_rl.evaluation.judge_prompt`: the project template, or the official one with ``--official_repo``).
The answer holds an ``<analysis>`` list and a ``<score>`` list (one 0/1 per test point), read by
:func:`~deepgen_rl.evaluation.judge_prompt.parse_answer`.

Two protocols (``protocol`` in every summary):

- project (default): our own instruction, greedy and reproducible decoding (temperature 0, top_p 1, seed 42),
  served model name ``UniGenBench-EvalModel``. Not leaderboard-comparable.
- official (``--official_repo PATH`` / ``$UNIGENBENCH_OFFICIAL_REPO``): the official instruction; temperature, top_p
  and seed are left unset like the official client (the server's defaults apply), served model name ``QwenVL``
  (the launcher's ``--mode official``).

A malformed answer is re-requested up to ``answer_retries`` times (default 10, as the official client; each
re-request is a new sample when the judge samples, and the seed, if set, is ``seed + attempt``); after that the
image is excluded and counted (``num_malformed_answers``). HTTP-level: connection errors, timeouts, 429 and 5xx are
retried with capped exponential backoff or the server's ``Retry-After`` (at most ``max_retries`` retries per answer;
the one retry policy of :mod:`deepgen_rl.utils.http`); other 4xx are not. A request that
still fails is excluded and counted (``num_request_failed``). Nothing is ever scored 0 for a failure.

Environment: ``UNIGENBENCH_API_URL`` (default ``http://localhost:8000``; with or without ``/v1``),
``UNIGENBENCH_MODEL_NAME`` (default: the launcher's served name for the protocol), ``UNIGENBENCH_OFFICIAL_REPO``,
``UNIGENBENCH_WORKERS`` (32), ``UNIGENBENCH_TIMEOUT`` (300 s), ``UNIGENBENCH_MAX_RETRIES`` (3),
``UNIGENBENCH_ANSWER_RETRIES`` (10), ``UNIGENBENCH_TEMPERATURE`` / ``UNIGENBENCH_TOP_P`` / ``UNIGENBENCH_SEED``
(``none`` = unset).

Standalone::

    python -m deepgen_rl.evaluation.unigenbench --images DIR --csv test_prompts_en.csv [--language en] \\
        [--official_repo UNIGENBENCH_CLONE] [--images_per_prompt 4] [--allow_missing] [--out DIR]

scores ``DIR/<index>_<k>.png`` (official layout) or ``DIR/<index>.<k>.png`` (ours), k = 0..N-1, and writes
``unigenbench_summary.json``, ``unigenbench_dimensions.csv``, ``judgments.jsonl`` and ``index.html`` to ``--out``
(default: ``DIR``). Missing images are listed and fail the run unless ``--allow_missing``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import os
import re
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import httpx
from PIL import Image
from tqdm.auto import tqdm

from deepgen_rl.evaluation.config import EvalPrompt, load_unigenbench_csv
from deepgen_rl.evaluation.judge_prompt import (
    LANGUAGES,
    OFFICIAL_REPO_ENV,
    MalformedAnswer,
    OfficialLayoutError,
    load_judge_template,
    parse_answer,
)
from deepgen_rl.utils.http import RequestFailed, post_json_with_retries

logger = logging.getLogger(__name__)

DEFAULT_API_URL = "http://localhost:8000"
# served model name per protocol; scripts/eval_unigenbench_evalmodel.sh --mode <protocol> serves the same names
SERVED_MODEL_NAMES = {"project": "UniGenBench-EvalModel", "official": "QwenVL"}
DEFAULT_MODEL_NAME = SERVED_MODEL_NAMES["project"]
PROJECT_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "seed": 42}
JPEG_QUALITY = 95
MODE_DEFAULT = "mode-default"  # a JudgeConfig field left to the protocol's default
JUDGE_CAVEAT = ("The leaderboard was most likely judged by Gemini-2.5-Pro; the offline UniGenBench-EvalModel "
                "approximates it (the 72B model agrees with it on about 94% of verdicts), so even official-protocol "
                "numbers are comparable, not identical.")


@dataclass
class JudgeConfig:
    """Client settings. Fields left at ``MODE_DEFAULT`` follow the protocol (official when ``official_repo``)."""

    api_url: str = DEFAULT_API_URL
    model: str = MODE_DEFAULT
    workers: int = 32
    timeout: float = 300.0
    max_retries: int = 3  # HTTP-level retries per answer
    backoff: float = 1.0  # seconds before the first HTTP retry, doubled each retry (deepgen_rl.utils.http)
    max_backoff: float = 30.0  # cap of one retry's wait (and of a server's Retry-After)
    answer_retries: int = 10  # re-requests of a malformed answer
    max_tokens: int = 4096
    temperature: float | None | str = MODE_DEFAULT
    top_p: float | None | str = MODE_DEFAULT
    seed: int | None | str = MODE_DEFAULT
    official_repo: str | None = None
    sampling_overridden: bool = field(default=False, init=False)

    def __post_init__(self):
        mode = self.protocol
        if self.model == MODE_DEFAULT:
            self.model = SERVED_MODEL_NAMES[mode]
        for key in ("temperature", "top_p", "seed"):
            value = getattr(self, key)
            if value == MODE_DEFAULT:
                setattr(self, key, PROJECT_SAMPLING[key] if mode == "project" else None)
            elif mode == "official" and value is not None:
                self.sampling_overridden = True
        if self.answer_retries < 0 or self.max_retries < 0:
            raise ValueError(f"answer_retries/max_retries must be >= 0, got {self.answer_retries}/{self.max_retries}")

    @property
    def protocol(self) -> str:
        return "official" if self.official_repo else "project"

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling fields sent with every request (unset ones are not sent)."""
        return {k: getattr(self, k) for k in ("temperature", "top_p", "seed") if getattr(self, k) is not None}

    @classmethod
    def from_env(cls, **overrides) -> "JudgeConfig":
        """Settings from ``UNIGENBENCH_*`` env vars; ``overrides`` (None = not given) win."""
        env = os.environ
        values: dict[str, Any] = {
            "api_url": env.get("UNIGENBENCH_API_URL", DEFAULT_API_URL),
            "model": env.get("UNIGENBENCH_MODEL_NAME") or MODE_DEFAULT,
            "workers": int(env.get("UNIGENBENCH_WORKERS", 32)),
            "timeout": float(env.get("UNIGENBENCH_TIMEOUT", 300)),
            "max_retries": int(env.get("UNIGENBENCH_MAX_RETRIES", 3)),
            "answer_retries": int(env.get("UNIGENBENCH_ANSWER_RETRIES", 10)),
            "official_repo": env.get(OFFICIAL_REPO_ENV) or None,
        }
        for key, conv in (("temperature", float), ("top_p", float), ("seed", int)):
            raw = env.get(f"UNIGENBENCH_{key.upper()}")
            values[key] = MODE_DEFAULT if raw is None else optional_number(raw, conv)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def optional_number(raw: Any, conv=float):
    """``"none"``/``""`` -> None (leave unset), else ``conv(raw)``."""
    if raw is None or str(raw).strip().lower() in ("", "none", "unset", "null"):
        return None
    return conv(raw)


def decoding_description(config: JudgeConfig) -> str:
    if config.temperature is None:
        return "server defaults (temperature/top_p not sent, as the official client)"
    if config.temperature == 0:
        return f"greedy (temperature 0, seed {config.seed}): reproducible"
    return f"sampled (temperature {config.temperature}, top_p {config.top_p}, seed {config.seed})"


def protocol_info(config: JudgeConfig, template) -> dict[str, Any]:
    """What every summary records about how the judge was asked."""
    return {
        "name": config.protocol,
        "template": template.describe(),
        "model": config.model,
        "sampling": {**{k: getattr(config, k) for k in ("temperature", "top_p", "seed")},
                     "max_tokens": config.max_tokens},
        "decoding": decoding_description(config),
        "sampling_overridden": config.sampling_overridden,
        "answer_retries": config.answer_retries,
        "http_retries": config.max_retries,
        "image_encoding": f"RGB JPEG quality {JPEG_QUALITY}, one image per request, image part before the text part",
        "judge_caveat": JUDGE_CAVEAT,
    }


def chat_completions_url(api_url: str) -> str:
    """``http://h:8000``, ``http://h:8000/v1`` or ``…/v1/chat/completions`` -> ``http://h:8000/v1/chat/completions``."""
    url = api_url.strip().rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if not url.endswith("/v1"):
        url += "/v1"
    return url + "/chat/completions"


@dataclass
class Judgment:
    """The verdict for one image. ``status``: ``ok`` | ``failed`` (request) | ``malformed`` (answer) | ``skipped``.
    ``attempts``: HTTP requests sent; ``answers``: answers received (1 + re-requests of malformed answers)."""

    dataset: str
    index: int
    dup: int
    rel_path: str
    status: str
    verdicts: list[int] | None = None
    error: str | None = None
    response: str | None = None
    attempts: int = 0
    answers: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Judgment":
        return cls(**d)


@dataclass
class JudgeRequest:
    dataset: str
    item: EvalPrompt
    dup: int
    image_path: Path
    rel_path: str


def image_data_url(image: Image.Image | str | Path) -> str:
    """The image as the official client sends it: converted to RGB, JPEG quality 95, base64 data URL."""
    if isinstance(image, (str, Path)):
        with Image.open(image) as img:
            image = img.convert("RGB")
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=JPEG_QUALITY)
    return f"data:image/jpeg;base64,{base64.b64encode(buf.getvalue()).decode()}"


class UniGenBenchJudge:
    """Thread-pooled chat-completions client. Thread-safe; one shared ``httpx.Client``.

    Raises :class:`~deepgen_rl.evaluation.judge_prompt.OfficialLayoutError` at construction when ``official_repo``
    does not hold the supported layout."""

    def __init__(self, config: JudgeConfig | None = None, template=None):
        self.config = config or JudgeConfig.from_env()
        self.template = template or load_judge_template(self.config.official_repo)
        self.url = chat_completions_url(self.config.api_url)
        self._client = httpx.Client(timeout=self.config.timeout,
                                    limits=httpx.Limits(max_connections=max(1, self.config.workers)))

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def protocol(self) -> dict[str, Any]:
        return protocol_info(self.config, self.template)

    def check_prompts(self, prompts: Sequence[EvalPrompt], language: str) -> None:
        """Refuse (ValueError) test points the template cannot render (the official code raises on them too)."""
        unknown = self.template.unknown_testpoints(prompts, language)
        if unknown:
            raise ValueError(f"{len(unknown)} test point names have no definition in the {self.template.kind} "
                             f"template ({language}): {unknown[:10]}; is the CSV in the judge's language?")

    def is_reachable(self, timeout: float = 5.0) -> tuple[bool, str]:
        """Probe the server once (GET ``/v1/models``); any HTTP answer counts as reachable."""
        url = self.url.rsplit("/chat/completions", 1)[0] + "/models"
        try:
            self._client.get(url, timeout=timeout)
            return True, ""
        except httpx.HTTPError as exc:
            return False, f"judge unreachable at {self.config.api_url}: {type(exc).__name__}: {exc}"

    def payload(self, image_url: str, instruction: str, answer_try: int = 0) -> dict[str, Any]:
        """One user message: the image part, then the text part. Unset sampling fields are not sent; a set seed is
        ``seed + answer_try`` so a re-request is a new sample."""
        content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": instruction}]
        body = {"model": self.config.model, "messages": [{"role": "user", "content": content}],
                "max_tokens": self.config.max_tokens, **self.config.sampling}
        if self.config.seed is not None:
            body["seed"] = self.config.seed + answer_try
        return body

    def _post(self, payload: dict[str, Any]) -> tuple[str | None, int]:
        """(answer text, HTTP requests sent); raises :class:`RequestFailed` after ``max_retries`` retries
        (the one retry policy of :mod:`deepgen_rl.utils.http`: transport errors, 429 with ``Retry-After`` and 5xx
        are retried with capped exponential backoff; other 4xx fail at once)."""
        body, attempts = post_json_with_retries(
            self._client, self.url, payload, timeout_s=self.config.timeout, max_retries=self.config.max_retries,
            backoff_s=self.config.backoff, max_backoff_s=self.config.max_backoff)
        try:
            return body["choices"][0]["message"].get("content"), attempts
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise RequestFailed(f"malformed chat-completions response: {type(exc).__name__}: {exc}",
                                attempts=attempts) from None

    def judge(self, req: JudgeRequest, language: str) -> Judgment:
        base = dict(dataset=req.dataset, index=req.item.index, dup=req.dup, rel_path=req.rel_path)
        try:
            image_url = image_data_url(req.image_path)
        except (OSError, ValueError) as exc:
            return Judgment(**base, status="failed", error=f"cannot read image: {exc}")
        instruction = self.template.render(req.item, language)
        attempts, text, error = 0, None, None
        for answer_try in range(1 + self.config.answer_retries):
            try:
                text, n = self._post(self.payload(image_url, instruction, answer_try))
            except RequestFailed as exc:
                return Judgment(**base, status="failed", error=str(exc), attempts=attempts + exc.attempts,
                                answers=answer_try, response=text)
            attempts += n
            try:
                verdicts = parse_answer(text, len(req.item.testpoints))
            except MalformedAnswer as exc:
                error = str(exc)
                continue
            return Judgment(**base, status="ok", verdicts=verdicts, response=text, attempts=attempts,
                            answers=answer_try + 1)
        return Judgment(**base, status="malformed", error=f"{error} (last of {1 + self.config.answer_retries} "
                        "answers)", response=text, attempts=attempts, answers=1 + self.config.answer_retries)

    def judge_many(self, requests: Sequence[JudgeRequest], language: str, *, progress: bool = True,
                   check_reachable: bool = True) -> list[Judgment]:
        """Judge all requests concurrently (``config.workers`` threads); results in request order.

        With ``check_reachable`` an unreachable server fails every request at once (one probe, no retries).
        """
        if not requests:
            return []
        if check_reachable:
            ok, why = self.is_reachable()
            if not ok:
                logger.error("%s; %d judgments recorded as failed", why, len(requests))
                return [Judgment(r.dataset, r.item.index, r.dup, r.rel_path, status="failed", error=why)
                        for r in requests]
        with ThreadPoolExecutor(max_workers=max(1, self.config.workers)) as pool:
            it = pool.map(lambda r: self.judge(r, language), requests)
            results = list(tqdm(it, total=len(requests), desc="unigenbench judge", disable=not progress))
        failed = sum(not j.ok for j in results)
        if failed:
            logger.warning("unigenbench: %d/%d judgments failed or malformed", failed, len(requests))
        return results


# <index>.<k>.png (this project) or <index>_<k>.png (official)
_IMAGE_NAME = re.compile(r"^(\d+)([._])(\d+)\.(png|jpg|jpeg|webp)$", re.IGNORECASE)


@dataclass
class ImageScan:
    """What an image folder holds for a prompt file: ``requests`` to judge (sorted by index, k), ``missing``
    expected ``"<index>_<k>"`` slots without a file, ``unknown`` files without a CSV row, ``ignored`` files with
    k >= images_per_prompt."""

    requests: list[JudgeRequest]
    missing: list[str]
    unknown: list[str]
    ignored: list[str]


def collect_image_requests(images_dir: str | Path, prompts: Sequence[EvalPrompt], dataset: str,
                           rel_root: str | Path | None = None, images_per_prompt: int | None = None) -> ImageScan:
    """Find ``<index>.<k>.<ext>`` and ``<index>_<k>.<ext>`` images. With ``images_per_prompt`` N, every prompt must
    have k = 0..N-1 (the rest is listed as missing) and files with k >= N are ignored (listed). Raises ValueError
    when one slot has files in both layouts."""
    images_dir = Path(images_dir)
    rel_root = Path(rel_root) if rel_root is not None else images_dir
    if images_per_prompt is not None and images_per_prompt < 1:
        raise ValueError(f"--images_per_prompt must be >= 1, got {images_per_prompt}")
    by_index = {p.index: p for p in prompts}
    found: dict[tuple[int, int], Path] = {}
    unknown, ignored = [], []
    files = sorted(images_dir.iterdir(), key=lambda p: p.name) if images_dir.is_dir() else []
    for f in files:
        m = _IMAGE_NAME.match(f.name)
        if not m:
            continue
        index, k = int(m.group(1)), int(m.group(3))
        if index not in by_index:
            unknown.append(f.name)
        elif images_per_prompt is not None and k >= images_per_prompt:
            ignored.append(f.name)
        elif (index, k) in found:
            raise ValueError(f"{images_dir}: image {index}/{k} exists twice ({found[index, k].name} and {f.name}); "
                             "keep one layout, <index>_<k>.png or <index>.<k>.png")
        else:
            found[index, k] = f
    requests = []
    for (index, k), f in sorted(found.items()):
        rel = os.path.relpath(f.resolve(), rel_root.resolve()).replace(os.sep, "/")
        requests.append(JudgeRequest(dataset, by_index[index], k, f, rel))
    missing = []
    if images_per_prompt is not None:
        missing = [f"{p.index}_{k}" for p in prompts for k in range(images_per_prompt) if (p.index, k) not in found]
    return ImageScan(requests, missing, unknown, ignored)


def image_sizes(paths: Sequence[str | Path]) -> list[dict[str, int]]:
    """``[{"height", "width", "num_images"}, …]`` over ``paths`` (reads image headers only), most common first."""
    counts: Counter = Counter()
    for p in paths:
        try:
            with Image.open(p) as img:
                counts[(img.height, img.width)] += 1
        except OSError:
            continue
    return [{"height": h, "width": w, "num_images": n} for (h, w), n in counts.most_common()]


def _infer_language(prompts: Sequence[EvalPrompt], csv_path) -> str:
    langs = sorted({p.meta.get("language") for p in prompts})
    if len(langs) != 1 or langs[0] not in LANGUAGES:
        raise ValueError(f"cannot infer the language of {csv_path} (test point keys {langs}); pass --language")
    return langs[0]


def score_image_folder(images_dir: str | Path, csv_path: str | Path, language: str | None = None,
                       out_dir: str | Path | None = None, *, dataset: str | None = None,
                       config: JudgeConfig | None = None, images_per_prompt: int | None = 4,
                       allow_missing: bool = False, progress: bool = True) -> dict[str, Any]:
    """Judge an existing image folder and write summary/CSV/JSONL/HTML. Returns the summary.

    Raises FileNotFoundError when images are missing (unless ``allow_missing``) or none match, ValueError for a
    prompt file in the wrong language or test points the template cannot render, OfficialLayoutError for an
    unsupported official repository. Nothing is sent to the judge before these checks pass."""
    from deepgen_rl.evaluation.metrics import compute_unigenbench_summary, write_eval_reports

    images_dir, out_dir = Path(images_dir), Path(out_dir or images_dir)
    prompts, malformed = load_unigenbench_csv(csv_path, language)
    language = language or _infer_language(prompts, csv_path)
    dataset = dataset or f"unigenbench_{language}"
    scan = collect_image_requests(images_dir, prompts, dataset, rel_root=out_dir,
                                  images_per_prompt=images_per_prompt)
    if not scan.requests:
        raise FileNotFoundError(f"no <index>_<k>.png or <index>.<k>.png images for {csv_path} found in {images_dir}")
    if scan.missing and not allow_missing:
        raise FileNotFoundError(
            f"{len(scan.missing)} images missing in {images_dir} for --images_per_prompt {images_per_prompt} "
            f"(<index>_<k>): {scan.missing[:20]}{' …' if len(scan.missing) > 20 else ''}; generate them, or pass "
            "--allow_missing to score the images that exist")
    if scan.unknown:
        logger.warning("%d images have no row in %s (ignored): %s", len(scan.unknown), csv_path, scan.unknown[:10])
    used = {r.item.index for r in scan.requests}
    used_prompts = [p for p in prompts if p.index in used]
    with UniGenBenchJudge(config or JudgeConfig.from_env()) as judge:
        judge.check_prompts(used_prompts, language)
        out_dir.mkdir(parents=True, exist_ok=True)
        judgments = judge.judge_many(scan.requests, language, progress=progress)
        protocol = judge.protocol()
    summary = compute_unigenbench_summary(dataset, used_prompts, judgments, language=language,
                                          malformed_rows=malformed, protocol=protocol,
                                          image_size=image_sizes([r.image_path for r in scan.requests]))
    summary.update(images_per_prompt=images_per_prompt, num_missing_images=len(scan.missing),
                   missing_images=scan.missing, unmatched_images=scan.unknown, ignored_images=scan.ignored)
    if scan.missing:
        summary["leaderboard_comparable"] = False
        summary["not_comparable_because"].append(f"{len(scan.missing)} images missing (--allow_missing)")
    write_eval_reports(out_dir, {dataset: summary}, {dataset: prompts}, judgments, title=f"UniGenBench {dataset}")
    return summary


SUMMARY_PRINT_KEYS = ("overall", "overall_missing_primaries", "primary_mean_acc", "testpoint_micro_acc",
                      "leaderboard_comparable", "not_comparable_because", "num_images", "num_judged", "num_failed",
                      "num_malformed_answers", "success_rate", "num_missing_images", "num_malformed_rows")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score a folder of <index>_<k>.png (or <index>.<k>.png) images "
                                                 "with the UniGenBench judge (OpenAI-compatible server).")
    parser.add_argument("--images", required=True, help="folder with <index>_<k>.png or <index>.<k>.png images")
    parser.add_argument("--csv", required=True, help="UniGenBench prompt CSV (index,prompt,sub_dims or the official "
                                                     "index,prompt_en,sub_dims_en / prompt_zh,sub_dims_zh)")
    parser.add_argument("--language", default=None, choices=list(LANGUAGES),
                        help="judge language (default: from the CSV's test point keys)")
    parser.add_argument("--out", default=None, help="output folder for summary/CSV/HTML (default: --images)")
    parser.add_argument("--dataset", default=None, help="dataset name in reports (default: unigenbench_<language>)")
    parser.add_argument("--official_repo", default=None,
                        help=f"clone of the official UniGenBench repository: use its judge template (official "
                             f"protocol; default ${OFFICIAL_REPO_ENV})")
    parser.add_argument("--images_per_prompt", type=int, default=4,
                        help="images expected per prompt, k = 0..N-1 (default 4, as the official evaluator)")
    parser.add_argument("--allow_missing", action="store_true", help="score what exists when images are missing "
                                                                     "(listed in the summary)")
    parser.add_argument("--api_url", default=None,
                        help=f"judge URL (default $UNIGENBENCH_API_URL or {DEFAULT_API_URL})")
    parser.add_argument("--model", default=None, help="served model name (default $UNIGENBENCH_MODEL_NAME, else "
                                                      f"{SERVED_MODEL_NAMES})")
    parser.add_argument("--workers", type=int, default=None, help="concurrent requests (default $UNIGENBENCH_WORKERS)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per request")
    parser.add_argument("--max_retries", type=int, default=None, help="HTTP retries per answer (default 3)")
    parser.add_argument("--answer_retries", type=int, default=None, help="re-requests of a malformed answer "
                                                                         "(default 10)")
    parser.add_argument("--temperature", default=None, help="sampling temperature, or 'none' to leave it unset "
                                                            "(default: 0 for the project protocol, unset for official)")
    parser.add_argument("--top_p", default=None, help="top_p, or 'none' (default: 1 project, unset official)")
    parser.add_argument("--seed", default=None, help="request seed, or 'none' (default: 42 project, unset official)")
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        sampling = {k: optional_number(getattr(args, k), conv) for k, conv in
                    (("temperature", float), ("top_p", float), ("seed", int)) if getattr(args, k) is not None}
        config = JudgeConfig.from_env(api_url=args.api_url, model=args.model, workers=args.workers,
                                      timeout=args.timeout, max_retries=args.max_retries,
                                      answer_retries=args.answer_retries, official_repo=args.official_repo)
        if sampling:
            config = replace(config, **sampling)
        summary = score_image_folder(args.images, args.csv, args.language, args.out, dataset=args.dataset,
                                     config=config, images_per_prompt=args.images_per_prompt,
                                     allow_missing=args.allow_missing, progress=not args.no_progress)
    except (FileNotFoundError, OfficialLayoutError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = {k: summary.get(k) for k in SUMMARY_PRINT_KEYS}
    out["protocol"] = {k: summary["protocol"][k] for k in ("name", "model", "decoding")}
    out["template"] = summary["protocol"]["template"]["kind"]
    print(json.dumps(out, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
