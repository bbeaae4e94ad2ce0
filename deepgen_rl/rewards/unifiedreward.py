"""``unifiedreward_think``: pairwise VLM judge (UnifiedReward-Think served by vLLM's OpenAI-compatible API).

For every prompt group (``metadata[i]["group_id"]``; the images of one prompt share it) each unordered pair {i, j}
is judged once as (i, j), or twice as (i, j) and (j, i) with ``both_orders=True`` (cancels position bias). The judge
reasons inside ``<think>`` and answers ``<answer>Image 1 is better</answer>`` / ``<answer>Image 2 is better</answer>``.

reward(i) = wins(i) / judged(i) over the judgements of i that produced a parseable answer. Unparseable answers and
requests that failed after the bounded retries are counted (``info["num_unparseable"]``,
``info["num_request_failed"]``) and excluded -- never scored as a tie. An image with no judged pair (alone in its
group, or all its judgements failed) is ``valid=False``. Sampling is greedy (temperature 0).
"""
from __future__ import annotations

import itertools
import logging
import os
import re
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import torch

from .base import Reward, register_reward
from deepgen_rl.utils.http import JsonServiceClient, RequestFailed, image_to_data_url

logger = logging.getLogger(__name__)

DEFAULT_URL = "http://localhost:18087"
DEFAULT_MODEL_NAME = "UnifiedReward"

PAIRWISE_INSTRUCTION = (
    "You are an expert judge of text-to-image generation. You are shown two images, Image 1 (the first image) and "
    "Image 2 (the second image), both generated for the caption below.\n"
    "Caption: {prompt}\n\n"
    "Decide which image matches the caption better, taking into account how faithfully it depicts every element "
    "of the caption, its visual quality and its plausibility. First reason step by step inside <think></think>. "
    "Then give your verdict inside <answer></answer>, writing exactly <answer>Image 1 is better</answer> or "
    "<answer>Image 2 is better</answer>."
)

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_VERDICT = re.compile(r"image\s*([12])\s*is\s*better", re.IGNORECASE)


def parse_pairwise_answer(text: str) -> int | None:
    """1 or 2 for "Image k is better" in the last <answer> block (after any </think>); None if unparseable.

    An answer naming both images, or neither, is unparseable.
    """
    if not isinstance(text, str):
        return None
    tail = text.rsplit("</think>", 1)[-1]
    answers = _ANSWER.findall(tail)
    if not answers:
        return None
    verdicts = {int(v) for v in _VERDICT.findall(answers[-1])}
    return verdicts.pop() if len(verdicts) == 1 else None


@register_reward("unifiedreward_think")
class UnifiedRewardThink(Reward):
    """Win rate in [0, 1] of each image against the other images of its group, judged pairwise."""

    name = "unifiedreward_think"

    def __init__(
        self,
        url: str | None = None,
        model_name: str | None = None,
        *,
        both_orders: bool = False,
        workers: int | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_tokens: int = 2048,
        image_format: str = "PNG",
        token: str | None = None,
        trust_env: bool = False,
    ):
        self.url = (url or os.environ.get("UNIFIEDREWARD_THINK_URL") or DEFAULT_URL).rstrip("/")
        self.model_name = model_name or os.environ.get("UNIFIEDREWARD_MODEL_NAME") or DEFAULT_MODEL_NAME
        self.both_orders = both_orders
        self.workers = int(workers or os.environ.get("UNIFIEDREWARD_THINK_WORKERS") or 64)
        if self.workers < 1 or max_retries < 0:
            raise ValueError("workers must be >= 1 and max_retries >= 0")
        self.max_tokens = max_tokens
        self.image_format = image_format
        self.http = JsonServiceClient(timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                      max_backoff_s=max_backoff_s, token=token, trust_env=trust_env,
                                      max_connections=self.workers)

    def _endpoint(self) -> str:
        return self.url if self.url.endswith("/chat/completions") else f"{self.url}/v1/chat/completions"

    def build_request(self, first_url: str, second_url: str, prompt: str) -> dict:
        """OpenAI chat-completions body: both images then the instruction in one user message, greedy decoding."""
        return {
            "model": self.model_name,
            "messages": [{
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": first_url}},
                    {"type": "image_url", "image_url": {"url": second_url}},
                    {"type": "text", "text": PAIRWISE_INSTRUCTION.format(prompt=prompt)},
                ],
            }],
            "temperature": 0.0,
            "top_p": 1.0,
            "max_tokens": self.max_tokens,
        }

    def _judge(self, first_url: str, second_url: str, prompt: str) -> tuple[int | None, int, str]:
        """(verdict 1/2 or None if unparseable, attempts, answer text); raises RequestFailed."""
        body, attempts = self.http.post(self._endpoint(), self.build_request(first_url, second_url, prompt))
        try:
            text = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            text = None
        return parse_pairwise_answer(text), attempts, text if isinstance(text, str) else repr(body)[:300]

    def score(self, images, prompts, metadata):
        n = len(images)
        groups: dict[object, list[int]] = defaultdict(list)
        for i, meta in enumerate(metadata):
            if "group_id" not in meta:
                raise KeyError(f"unifiedreward_think: metadata[{i}] has no 'group_id' (needed to form pairs)")
            groups[meta["group_id"]].append(i)
        for gid, members in groups.items():
            if len({prompts[i] for i in members}) > 1:
                raise ValueError(f"unifiedreward_think: group {gid!r} mixes different prompts")
        # (first, second) judgements; with both_orders every unordered pair appears in both orders.
        judgements = []
        for members in groups.values():
            for i, j in itertools.combinations(members, 2):
                judgements.append((i, j))
                if self.both_orders:
                    judgements.append((j, i))
        needed = sorted({i for pair in judgements for i in pair})
        wins, judged = torch.zeros(n), torch.zeros(n)
        info = {"num_groups": len(groups), "num_singletons": sum(len(m) == 1 for m in groups.values()),
                "num_judgements": len(judgements), "num_unparseable": 0, "num_request_failed": 0,
                "num_requests": 0, "num_retries": 0, "num_position_flips": 0, "errors": [], "unparseable_samples": []}
        if judgements:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(judgements))) as pool:
                urls = dict(zip(needed, pool.map(lambda i: image_to_data_url(images[i], self.image_format), needed)))
                futures = [pool.submit(self._judge, urls[i], urls[j], prompts[i]) for i, j in judgements]
                verdict_of: dict[tuple[int, int], int] = {}
                for (i, j), future in zip(judgements, futures):
                    try:
                        verdict, attempts, text = future.result()
                    except RequestFailed as exc:
                        logger.error("unifiedreward_think: pair (%d, %d) failed: %s", i, j, exc)
                        info["num_request_failed"] += 1
                        info["num_requests"] += exc.attempts
                        info["num_retries"] += exc.attempts - 1
                        if len(info["errors"]) < 10:
                            info["errors"].append(str(exc))
                        continue
                    info["num_requests"] += attempts
                    info["num_retries"] += attempts - 1
                    if verdict is None:
                        info["num_unparseable"] += 1
                        if len(info["unparseable_samples"]) < 5:
                            info["unparseable_samples"].append(text[-300:])
                        continue
                    winner = i if verdict == 1 else j
                    verdict_of[(i, j)] = winner
                    wins[winner] += 1
                    judged[i] += 1
                    judged[j] += 1
                # With both orders, a pair whose two judgements disagree reveals position bias.
                info["num_position_flips"] = sum(
                    1 for (i, j), w in verdict_of.items() if i < j and verdict_of.get((j, i), w) != w
                )
        valid = judged > 0
        scores = torch.where(valid, wins / judged.clamp(min=1), torch.zeros(n))
        return scores, valid, info
