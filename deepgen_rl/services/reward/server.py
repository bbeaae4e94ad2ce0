"""``python -m deepgen_rl.services.reward --reward NAME [--reward NAME ...]``: serve registered rewards over HTTP.

Every reward registered in :mod:`deepgen_rl.rewards` can be hosted (``--reward pickscore --reward aesthetic``);
clients use the ``remote`` reward (or ``{"remote_url": ...}`` in ``--reward_kwargs``) to score through it.

Parallelism: ``--devices cuda:0,cuda:1`` builds one replica of each reward per device, each driven by its own scoring
thread that pulls from a shared queue (data parallel); without devices, ``--threads`` scoring threads share one
replica (rewards are thread-safe by contract). ``--workers`` starts several uvicorn processes, each with its own
replicas. Micro-batching (several requests' images in one reward call, at most ``--max_batch``) is on by default when
CUDA is available (``--micro_batch auto``, :func:`micro_batch_enabled`).

Start-up loads every model once: the parent first checks each reward's kwargs and weights paths without loading
anything (:func:`deepgen_rl.rewards.base.preflight_reward`); with one worker it then builds the app itself and serves
it in-process; with several, only the workers build (the parent holds no model), and a worker that cannot build its
rewards exits with uvicorn's STARTUP_FAILURE status, which stops the whole server instead of a restart loop.
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys

from .app import RewardScorer, create_app
from .config import ServiceConfig
from .protocol import STARTUP_FAILURE, serve

logger = logging.getLogger("deepgen_rl.reward_server")

SPEC_ENV = "DEEPGEN_REWARD_SERVER_SPEC"  # JSON written by main(): worker processes rebuild the app from it


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _accepts_device(name: str) -> bool:
    from deepgen_rl.rewards.base import _REGISTRY

    try:
        return "device" in inspect.signature(_REGISTRY[name]).parameters
    except (TypeError, ValueError):
        return False


def build_scorers(rewards: list[str], reward_kwargs: dict, devices: list[str], threads: int) -> dict:
    """{name: replicas}: one replica per device (``device=`` passed to the reward) for rewards that take a device,
    else one replica shared by ``len(devices)`` (or ``threads``) scoring threads."""
    from deepgen_rl.rewards import get_reward

    scorers = {}
    for name in rewards:
        kwargs = dict(reward_kwargs.get(name, {}))
        if devices and _accepts_device(name):
            scorers[name] = [RewardScorer(get_reward(name, **kwargs, device=device)) for device in devices]
        else:
            scorer = RewardScorer(get_reward(name, **kwargs))
            scorers[name] = [scorer] * max(1, len(devices) or threads)
    return scorers


def micro_batch_enabled(mode: str) -> bool:
    """``--micro_batch``: "on", "off", or "auto" = on exactly when ``torch.cuda.is_available()``."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"--micro_batch must be auto, on or off, got {mode!r}")
    return _cuda_available() if mode == "auto" else mode == "on"


def app_from_spec(spec: dict):
    """The app for ``spec`` ({rewards, reward_kwargs, devices, micro_batch}) and the ``REWARD_*`` env vars."""
    config = ServiceConfig.from_env("REWARD_")
    scorers = build_scorers(spec["rewards"], spec["reward_kwargs"], spec["devices"], config.threads)
    return create_app(config, scorers, micro_batch=micro_batch_enabled(spec["micro_batch"]))


def create_app_from_env():
    """uvicorn worker factory: :func:`app_from_spec` of ``$DEEPGEN_REWARD_SERVER_SPEC``. A reward that cannot be
    built exits the worker with STARTUP_FAILURE (one error line), so uvicorn stops the server instead of restarting
    the worker forever."""
    try:
        return app_from_spec(json.loads(os.environ[SPEC_ENV]))
    except Exception as exc:  # noqa: BLE001 -- any build failure: report it in one line and stop the server
        logger.error("deepgen_rl: error: reward server worker %d cannot build its rewards: %s: %s", os.getpid(),
                     type(exc).__name__, exc)
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit, not sys.exit: interpreter shutdown (torch, transformers) can outlast uvicorn's 5 s worker
        # health check, which then kills the worker (-9, not STARTUP_FAILURE) and starts another: a restart loop.
        os._exit(STARTUP_FAILURE)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DeepGen-RL reward server (limits from REWARD_* env vars)")
    parser.add_argument("--reward", action="append", required=True, help="registered reward to serve (repeatable)")
    parser.add_argument("--reward_kwargs", default="{}",
                        help='JSON {reward_name: {kwarg: value}} passed to get_reward, e.g. '
                             '\'{"aesthetic": {"head_path": "/w/sac+logos+ava1-l14-linearMSE.safetensors"}}\'')
    parser.add_argument("--host", help="overrides REWARD_HOST (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="overrides REWARD_PORT (default 18090)")
    parser.add_argument("--workers", type=int, help="overrides REWARD_WORKERS (uvicorn processes, default 1)")
    parser.add_argument("--threads", type=int, help="overrides REWARD_THREADS (scoring threads without --devices)")
    parser.add_argument("--devices", default="", help="comma-separated devices, one replica each (cuda:0,cuda:1)")
    parser.add_argument("--max_batch", type=int, help="overrides REWARD_MAX_BATCH (images per reward call)")
    parser.add_argument("--micro_batch", choices=("auto", "on", "off"), default="auto",
                        help="coalesce queued requests into one reward call (auto: on when CUDA is available)")
    parser.add_argument("--log-level", default=os.environ.get("REWARD_LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    try:
        kwargs = json.loads(args.reward_kwargs)
    except ValueError as exc:
        parser.error(f"--reward_kwargs is not valid JSON: {exc}")
    if not isinstance(kwargs, dict) or not all(isinstance(v, dict) for v in kwargs.values()):
        parser.error('--reward_kwargs must be a JSON object of objects: {"reward": {"kwarg": value}}')
    unknown = sorted(set(kwargs) - set(args.reward))
    if unknown:
        parser.error(f"--reward_kwargs names {unknown}, which are not served (--reward {args.reward})")
    from deepgen_rl.rewards import available_rewards

    missing = [name for name in args.reward if name not in available_rewards()]
    if missing:
        parser.error(f"--reward {missing}: not registered; available: {', '.join(available_rewards())}")
    args.reward_kwargs_dict = kwargs
    return args


def _fail(message: str) -> None:
    print(f"deepgen_rl: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    from deepgen_rl.rewards.base import preflight_reward

    args = parse_args(argv)
    for flag, env in (("host", "REWARD_HOST"), ("port", "REWARD_PORT"), ("workers", "REWARD_WORKERS"),
                      ("threads", "REWARD_THREADS"), ("max_batch", "REWARD_MAX_BATCH")):
        if getattr(args, flag) is not None:
            os.environ[env] = str(getattr(args, flag))
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    spec = {"rewards": args.reward, "reward_kwargs": args.reward_kwargs_dict, "devices": devices,
            "micro_batch": args.micro_batch}
    os.environ[SPEC_ENV] = json.dumps(spec)
    config = ServiceConfig.from_env("REWARD_")
    for name in args.reward:  # cheap: kwargs and weights paths, nothing loaded
        try:
            preflight_reward(name, **args.reward_kwargs_dict.get(name, {}))
        except ValueError as exc:
            _fail(str(exc))
    if config.workers > 1:  # each worker builds its own replicas; the parent loads nothing
        status = serve("deepgen_rl.services.reward.server:create_app_from_env", config, log_level=args.log_level)
    else:  # build once, here, and serve this very app (a build error is reported before binding the port)
        try:
            app = app_from_spec(spec)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            _fail(f"cannot build the rewards: {type(exc).__name__}: {exc}")
        status = serve(app, config, log_level=args.log_level)
    if status:
        raise SystemExit(status)
