"""Shared client for rewards that ask an OpenAI-compatible VLM endpoint (vLLM, SGLang, ...) about one image.

:class:`PointwiseVlmReward` sends, per image, one chat-completions request (the image as a data URL, then the
reward's instruction; greedy decoding), parses the answer with the subclass's ``parse``, and runs the requests on a
thread pool. A request that fails after the bounded retries (:mod:`deepgen_rl.utils.http`) or an unparseable answer
marks that image ``valid=False`` (counted in ``info["num_request_failed"]`` / ``info["num_unparseable"]``, with the
reason in ``info["image_errors"][i]``); it never becomes a score.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from .base import Reward
from deepgen_rl.utils.http import JsonServiceClient, RequestFailed, image_to_data_url

logger = logging.getLogger(__name__)


class PointwiseVlmReward(Reward):
    url_env: str = ""  # env var holding the endpoint url
    model_env: str = ""  # env var holding the served model name
    default_url: str = "http://localhost:8000"
    default_model: str = "default"

    def __init__(self, url: str | None = None, model_name: str | None = None, *, workers: int = 32,
                 timeout_s: float = 300.0, max_retries: int = 3, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 max_tokens: int = 512, image_format: str = "PNG", token: str | None = None,
                 trust_env: bool = False):
        self.url = (url or os.environ.get(self.url_env) or self.default_url).rstrip("/")
        self.model_name = model_name or os.environ.get(self.model_env) or self.default_model
        if workers < 1 or max_retries < 0:
            raise ValueError("workers must be >= 1 and max_retries >= 0")
        self.workers, self.max_tokens, self.image_format = workers, max_tokens, image_format
        self.http = JsonServiceClient(timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                      max_backoff_s=max_backoff_s, token=token, trust_env=trust_env,
                                      max_connections=workers)

    # -- subclass hooks (and Reward.wants: False means valid=False, counted as skipped, no request) -------------
    def instruction(self, prompt: str, meta: dict) -> str:
        raise NotImplementedError

    def parse(self, answer: str, prompt: str, meta: dict) -> tuple[float | None, dict]:
        """(score or None when unparseable, per-image extras)."""
        raise NotImplementedError

    # -- plumbing ---------------------------------------------------------------------------------------------------
    def endpoint(self) -> str:
        return self.url if self.url.endswith("/chat/completions") else f"{self.url}/v1/chat/completions"

    def build_request(self, image_url: str, text: str) -> dict:
        return {"model": self.model_name,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                          {"type": "text", "text": text}]}],
                "temperature": 0.0, "top_p": 1.0, "max_tokens": self.max_tokens}

    def _ask(self, image, prompt: str, meta: dict) -> tuple[str | None, int]:
        body, attempts = self.http.post(self.endpoint(), self.build_request(
            image_to_data_url(image, self.image_format), self.instruction(prompt, meta)))
        try:
            text = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            text = None
        return (text if isinstance(text, str) else None), attempts

    def score(self, images, prompts, metadata):
        n = len(images)
        scores, valid = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        info = {"num_skipped_no_target": 0, "num_unparseable": 0, "num_request_failed": 0, "num_requests": 0,
                "num_retries": 0, "answers": [""] * n, "image_errors": [None] * n, "errors": []}
        todo = [i for i in range(n) if self.wants(prompts[i], metadata[i])]
        info["num_skipped_no_target"] = n - len(todo)
        if not todo:
            return scores, valid, info
        with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
            futures = {i: pool.submit(self._ask, images[i], prompts[i], metadata[i]) for i in todo}
            for i, future in futures.items():
                try:
                    answer, attempts = future.result()
                except RequestFailed as exc:
                    logger.error("%s: images[%d] request failed: %s", self.name, i, exc)
                    info["num_request_failed"] += 1
                    info["num_requests"] += exc.attempts
                    info["num_retries"] += exc.attempts - 1
                    info["image_errors"][i] = f"request failed: {exc}"
                    if len(info["errors"]) < 10:
                        info["errors"].append(str(exc))
                    continue
                info["num_requests"] += attempts
                info["num_retries"] += attempts - 1
                info["answers"][i] = answer or ""
                value, extras = self.parse(answer, prompts[i], metadata[i]) if answer is not None else (None, {})
                for key, item in extras.items():
                    info.setdefault(key, [None] * n)[i] = item
                if value is None:
                    info["num_unparseable"] += 1
                    info["image_errors"][i] = f"unparseable answer: {(answer or '')[-200:]!r}"
                    continue
                scores[i], valid[i] = float(value), True
        return scores, valid, info
