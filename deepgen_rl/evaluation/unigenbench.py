"""UniGenBench judge client and standalone scorer.

The judge is an OpenAI-compatible chat-completions server (``bash scripts/eval_unigenbench_evalmodel.sh`` serves
``CodeGoat24/UniGenBench-EvalModel-qwen3vl-32b-v1`` with vLLM). For each image the judge sees the image (base64 data
URL), the prompt and its test points with descriptions, and answers ``<score>[1, 0, …]</score>``: one 0/1 per test
point, in order. The instruction text below is our own wording (English and Chinese), not the official one.

Environment: ``UNIGENBENCH_API_URL`` (default ``http://localhost:8000``; with or without ``/v1``),
``UNIGENBENCH_MODEL_NAME`` (default ``UniGenBench-EvalModel``, the launch script's ``--served-model-name``),
``UNIGENBENCH_WORKERS`` (default 32 concurrent requests), ``UNIGENBENCH_TIMEOUT`` (seconds per request, default 300),
``UNIGENBENCH_MAX_RETRIES`` (default 3).

Sampling is deterministic (temperature 0, fixed seed). Connection errors, timeouts, HTTP 429 and 5xx are retried
with exponential backoff (at most ``max_retries`` retries); other 4xx are not. A failed request or a malformed
answer (no ``<score>`` list, non-0/1 values, wrong length) is recorded as such and excluded from accuracy; the
failure count is reported separately. Malformed answers are not retried (sampling is deterministic).

Standalone::

    python -m deepgen_rl.evaluation.unigenbench --images DIR --csv test_prompts_en.csv --language en [--out DIR]

scores ``DIR/<index>.<dup>.png`` and writes ``unigenbench_summary.json``, ``unigenbench_dimensions.csv``,
``judgments.jsonl`` and ``index.html`` to ``--out`` (default: ``DIR``).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import httpx
from PIL import Image
from tqdm.auto import tqdm

from deepgen_rl.evaluation.config import EvalPrompt, load_unigenbench_csv

logger = logging.getLogger(__name__)

DEFAULT_API_URL = "http://localhost:8000"
DEFAULT_MODEL_NAME = "UniGenBench-EvalModel"

JUDGE_INSTRUCTIONS = {
    "en": (
        "You are a strict evaluator of text-to-image generation. The attached image was generated from the prompt "
        "below. For each numbered test point, check only the aspect it names (its description says what to look "
        "for) and decide whether the image satisfies it: 1 if it clearly does, 0 otherwise.\n\n"
        "Prompt: {prompt}\n\nTest points:\n{testpoints}\n\n"
        "Reason briefly about each test point, then give the final verdicts as a list of exactly {n} integers "
        "(0 or 1), in the order of the test points, inside <score></score> tags, e.g. <score>{example}</score>."
    ),
    "zh": (
        "你是一名严格的文生图评测员。附图是根据下面的提示词生成的。请针对每个编号的考点，只检查该考点所指的方面"
        "（考点描述说明了要看什么），判断图像是否满足：明确满足记 1，否则记 0。\n\n"
        "提示词：{prompt}\n\n考点：\n{testpoints}\n\n"
        "请先对每个考点做简要分析，然后按考点顺序给出恰好 {n} 个整数（0 或 1）组成的列表，放在 <score></score> "
        "标签内，例如 <score>{example}</score>。"
    ),
}
_TESTPOINT_LINE = {"en": "{i}. {name}: {description}", "zh": "{i}. {name}：{description}"}
_SCORE_TAG = re.compile(r"<score>(.*?)</score>", re.DOTALL | re.IGNORECASE)


@dataclass
class JudgeConfig:
    api_url: str = DEFAULT_API_URL
    model: str = DEFAULT_MODEL_NAME
    workers: int = 32
    timeout: float = 300.0
    max_retries: int = 3
    backoff: float = 1.0  # seconds before the first retry, doubled each retry
    max_tokens: int = 4096
    seed: int = 42

    @classmethod
    def from_env(cls, **overrides) -> "JudgeConfig":
        env = os.environ
        cfg = cls(
            api_url=env.get("UNIGENBENCH_API_URL", DEFAULT_API_URL),
            model=env.get("UNIGENBENCH_MODEL_NAME", DEFAULT_MODEL_NAME),
            workers=int(env.get("UNIGENBENCH_WORKERS", 32)),
            timeout=float(env.get("UNIGENBENCH_TIMEOUT", 300)),
            max_retries=int(env.get("UNIGENBENCH_MAX_RETRIES", 3)),
        )
        return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


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
    """The verdict for one image. ``status``: ``ok`` | ``failed`` (request) | ``malformed`` (answer) | ``skipped``."""

    dataset: str
    index: int
    dup: int
    rel_path: str
    status: str
    verdicts: list[int] | None = None
    error: str | None = None
    response: str | None = None
    attempts: int = 0

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


def build_judge_prompt(item: EvalPrompt, language: str) -> str:
    if language not in JUDGE_INSTRUCTIONS:
        raise ValueError(f"language must be one of {sorted(JUDGE_INSTRUCTIONS)}, got {language!r}")
    lines = "\n".join(_TESTPOINT_LINE[language].format(i=i, name=tp.name, description=tp.description)
                      for i, tp in enumerate(item.testpoints, start=1))
    n = len(item.testpoints)
    example = "[" + ", ".join("1" if i % 2 == 0 else "0" for i in range(n)) + "]"
    return JUDGE_INSTRUCTIONS[language].format(prompt=item.prompt, testpoints=lines, n=n, example=example)


def image_data_url(image: Image.Image | str | Path) -> str:
    if isinstance(image, (str, Path)):
        data = Path(image).read_bytes()
        mime = "image/png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "image/jpeg"
    else:
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="PNG")
        data, mime = buf.getvalue(), "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def parse_score(text: str | None, num_testpoints: int) -> list[int]:
    """The 0/1 list inside the last ``<score>…</score>``; raises ValueError unless it has ``num_testpoints`` values."""
    if not text:
        raise ValueError("empty answer")
    found = _SCORE_TAG.findall(text)
    if not found:
        raise ValueError("no <score>…</score> in the answer")
    body = found[-1].strip().strip("[]()").strip()
    tokens = [t for t in re.split(r"[,\s]+", body) if t]
    values = []
    for tok in tokens:
        try:
            v = float(tok)
        except ValueError:
            raise ValueError(f"non-numeric score {tok!r}") from None
        if v not in (0.0, 1.0):
            raise ValueError(f"score {tok!r} is not 0 or 1")
        values.append(int(v))
    if len(values) != num_testpoints:
        raise ValueError(f"{len(values)} scores for {num_testpoints} test points")
    return values


class _Retryable(Exception):
    pass


class UniGenBenchJudge:
    """Thread-pooled chat-completions client. Thread-safe; one shared ``httpx.Client``."""

    def __init__(self, config: JudgeConfig | None = None):
        self.config = config or JudgeConfig.from_env()
        self.url = chat_completions_url(self.config.api_url)
        self._client = httpx.Client(timeout=self.config.timeout,
                                    limits=httpx.Limits(max_connections=max(1, self.config.workers)))

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def is_reachable(self, timeout: float = 5.0) -> tuple[bool, str]:
        """Probe the server once (GET ``/v1/models``); any HTTP answer counts as reachable."""
        url = self.url.rsplit("/chat/completions", 1)[0] + "/models"
        try:
            self._client.get(url, timeout=timeout)
            return True, ""
        except httpx.HTTPError as exc:
            return False, f"judge unreachable at {self.config.api_url}: {type(exc).__name__}: {exc}"

    def _payload(self, req: JudgeRequest, language: str) -> dict[str, Any]:
        content = [
            {"type": "image_url", "image_url": {"url": image_data_url(req.image_path)}},
            {"type": "text", "text": build_judge_prompt(req.item, language)},
        ]
        return {"model": self.config.model, "messages": [{"role": "user", "content": content}],
                "temperature": 0.0, "top_p": 1.0, "seed": self.config.seed, "max_tokens": self.config.max_tokens}

    def _post(self, payload: dict[str, Any]) -> str | None:
        try:
            resp = self._client.post(self.url, json=payload)
        except httpx.HTTPError as exc:  # connection errors and timeouts
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        resp.raise_for_status()
        return resp.json()["choices"][0]["message"].get("content")

    def judge(self, req: JudgeRequest, language: str) -> Judgment:
        base = dict(dataset=req.dataset, index=req.item.index, dup=req.dup, rel_path=req.rel_path)
        try:
            payload = self._payload(req, language)
        except (OSError, ValueError) as exc:
            return Judgment(**base, status="failed", error=f"cannot read image: {exc}")
        attempts, delay = 0, self.config.backoff
        while True:
            attempts += 1
            try:
                text = self._post(payload)
                break
            except _Retryable as exc:
                if attempts > self.config.max_retries:
                    return Judgment(**base, status="failed", error=str(exc), attempts=attempts)
                time.sleep(delay)
                delay *= 2
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                return Judgment(**base, status="failed", error=f"{type(exc).__name__}: {exc}", attempts=attempts)
        try:
            verdicts = parse_score(text, len(req.item.testpoints))
        except ValueError as exc:
            return Judgment(**base, status="malformed", error=str(exc), response=text, attempts=attempts)
        return Judgment(**base, status="ok", verdicts=verdicts, response=text, attempts=attempts)

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


_IMAGE_NAME = re.compile(r"^(\d+)\.(\d+)\.(png|jpg|jpeg|webp)$", re.IGNORECASE)


def collect_image_requests(images_dir: str | Path, prompts: Sequence[EvalPrompt], dataset: str,
                           rel_root: str | Path | None = None) -> tuple[list[JudgeRequest], list[str]]:
    """Requests for ``images_dir/<index>.<dup>.png`` files; also returns files whose index is not in ``prompts``."""
    images_dir = Path(images_dir)
    rel_root = Path(rel_root) if rel_root is not None else images_dir
    by_index = {p.index: p for p in prompts}
    requests, unknown = [], []
    files = sorted(images_dir.iterdir(), key=lambda p: p.name) if images_dir.is_dir() else []
    for f in files:
        m = _IMAGE_NAME.match(f.name)
        if not m:
            continue
        index, dup = int(m.group(1)), int(m.group(2))
        if index not in by_index:
            unknown.append(f.name)
            continue
        rel = os.path.relpath(f.resolve(), Path(rel_root).resolve()).replace(os.sep, "/")
        requests.append(JudgeRequest(dataset, by_index[index], dup, f, rel))
    requests.sort(key=lambda r: (r.item.index, r.dup))
    return requests, unknown


def score_image_folder(images_dir: str | Path, csv_path: str | Path, language: str, out_dir: str | Path | None = None,
                       *, dataset: str | None = None, config: JudgeConfig | None = None,
                       progress: bool = True) -> dict[str, Any]:
    """Judge an existing folder of ``<index>.<dup>.png`` images and write summary/CSV/HTML. Returns the summary."""
    from deepgen_rl.evaluation.metrics import compute_unigenbench_summary, write_eval_reports

    images_dir, out_dir = Path(images_dir), Path(out_dir or images_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dataset = dataset or f"unigenbench_{language}"
    prompts, malformed = load_unigenbench_csv(csv_path)
    requests, unknown = collect_image_requests(images_dir, prompts, dataset, rel_root=out_dir)
    if not requests:
        raise FileNotFoundError(f"no <index>.<dup>.png images for {csv_path} found in {images_dir}")
    if unknown:
        logger.warning("%d images have no row in %s (ignored): %s", len(unknown), csv_path, unknown[:10])
    with UniGenBenchJudge(config or JudgeConfig.from_env()) as judge:
        judgments = judge.judge_many(requests, language, progress=progress)
    used = {r.item.index for r in requests}
    summary = compute_unigenbench_summary(dataset, [p for p in prompts if p.index in used], judgments,
                                          language=language, malformed_rows=malformed)
    summary["unmatched_images"] = unknown
    write_eval_reports(out_dir, {dataset: summary}, {dataset: prompts}, judgments, title=f"UniGenBench {dataset}")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score a folder of <index>.<dup>.png images with the UniGenBench "
                                                 "judge (OpenAI-compatible server).")
    parser.add_argument("--images", required=True, help="folder with <index>.<dup>.png images")
    parser.add_argument("--csv", required=True, help="UniGenBench prompt CSV (index,prompt,sub_dims)")
    parser.add_argument("--language", required=True, choices=sorted(JUDGE_INSTRUCTIONS))
    parser.add_argument("--out", default=None, help="output folder for summary/CSV/HTML (default: --images)")
    parser.add_argument("--dataset", default=None, help="dataset name in reports (default: unigenbench_<language>)")
    parser.add_argument("--api_url", default=None, help=f"judge URL (default $UNIGENBENCH_API_URL or {DEFAULT_API_URL})")
    parser.add_argument("--model", default=None, help="served model name (default $UNIGENBENCH_MODEL_NAME)")
    parser.add_argument("--workers", type=int, default=None, help="concurrent requests (default $UNIGENBENCH_WORKERS)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per request")
    parser.add_argument("--max_retries", type=int, default=None)
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = JudgeConfig.from_env(api_url=args.api_url, model=args.model, workers=args.workers,
                                  timeout=args.timeout, max_retries=args.max_retries)
    summary = score_image_folder(args.images, args.csv, args.language, args.out, dataset=args.dataset,
                                 config=config, progress=not args.no_progress)
    keys = ("overall_acc", "primary_mean_acc", "num_images", "num_judged", "num_failed", "num_malformed_answers",
            "success_rate", "num_malformed_rows")
    print(json.dumps({k: summary.get(k) for k in keys}, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
