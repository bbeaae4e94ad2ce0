"""Entry point: ``python -m deepgen_rl.grpo_deepgen [--config FILE.yaml] [--flag value ...]`` (``scripts/train.sh``).

Parses ModelArguments, DataArguments and GRPOConfig (a ``transformers.TrainingArguments``) with TRL's ``TrlParser``
(``HfArgumentParser`` plus ``--config FILE.yaml``: the YAML's keys are flag names and set their values; flags on the
command line override them; ``configs/train/deepgen_rl.yaml`` is the recipe). ``--help`` lists every flag.

Start-up errors: every set-up problem (a flag, the recipe YAML, the dataset / eval / SFT-aux configs, prompt files,
reward names and weights, the model config, OUTPUT_DIR) ends in ONE line ``deepgen_rl: error: …`` naming the flag,
file or field, exit status 2, no traceback (``DEEPGEN_DEBUG=1`` shows it). All of them except the model's own files
are checked before the model is built (:func:`preflight`), so a typo costs seconds, not a model load.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

import yaml
from transformers import set_seed
from transformers.utils import logging as hf_logging
from trl.scripts.utils import TrlParser

from deepgen_rl.config import DataArguments, GRPOConfig, ModelArguments, batch_layout

PROG = "deepgen_rl"


class SetupError(ValueError):
    """A set-up problem, reported as one ``deepgen_rl: error:`` line."""


class _Parser(TrlParser):
    def error(self, message):  # argparse: bad value / missing argument -> one line, not usage + error
        raise SetupError(message)


def _read_recipe(path: str) -> dict:
    """The ``--config`` YAML as a mapping of flag names; one-line errors name the file."""
    if not os.path.isfile(path):
        raise SetupError(f"--config {path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SetupError(f"--config {path}: not valid YAML{at} ({getattr(e, 'problem', None) or e})") from None
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise SetupError(f"--config {path}: expected a mapping of flag: value, got {type(cfg).__name__}")
    return cfg


def parse_args(argv=None):
    """(ModelArguments, DataArguments, GRPOConfig) from ``argv`` (default sys.argv[1:]) and an optional recipe
    YAML given with ``--config``; raises :class:`SetupError` / ValueError with a one-line message."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser((ModelArguments, DataArguments, GRPOConfig), prog=PROG)
    path = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise SetupError("--config needs a YAML file")
        path = argv[i + 1]
        cfg = _read_recipe(path)
        known = {a.dest for a in parser._actions}
        unknown = sorted(k for k in cfg if k not in known and k != "env")
        if unknown:
            raise SetupError(f"--config {path}: unknown key(s) {unknown} (keys are flag names without '--'; see "
                             "--help)")
    try:
        if "--config" in argv:
            return parser.parse_args_and_config(args=argv)
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as e:  # SetupError too
        msg = str(e)
        if msg.startswith("Some specified arguments are not used"):  # HfArgumentParser's unknown-flag message
            msg = f"unrecognized arguments: {msg.split(':', 1)[1].strip()} (see --help)"
        elif not isinstance(e, SetupError) and "--config" not in argv:
            raise
        raise SetupError(msg + (f" (with --config {path})" if "--config" in argv else "")) from None


def _resume_arg(args):
    return args.resume_from_checkpoint or (None if args.auto_resume else False)


def preflight(model_args, data_args, args) -> None:
    """Every check that does not need the model, in seconds: files, YAMLs, prompt files, rewards, batch layout, the
    DeepSpeed JSON (and, for an optimizer-offload config on a GPU node, whether DeepSpeed's CPU Adam can be built:
    :func:`deepgen_rl.trainer.deepspeed_utils.cpu_adam_problem`) and OUTPUT_DIR. Raises with a message naming the
    flag or file."""
    from deepgen_rl.checkpoints.training_state import check_output_dir
    from deepgen_rl.data.prompts import load_train_config
    from deepgen_rl.rewards import available_rewards

    if not os.path.isfile(model_args.model_config):
        raise SetupError(f"--model_config {model_args.model_config}: file not found (MODEL_CONFIG in train.sh)")
    from deepgen_rl.models.build import check_model_config

    check_model_config(model_args.model_config)
    if model_args.checkpoint and not os.path.exists(model_args.checkpoint):
        raise SetupError(f"--checkpoint {model_args.checkpoint}: not found (CHECKPOINT in train.sh)")
    world = int(os.environ.get("WORLD_SIZE", 1))
    batch_layout(args, world)
    data = load_train_config(data_args.dataset_config)
    known = set(available_rewards())
    unknown = [n for n in data.reward_names if n not in known]
    if unknown:
        raise SetupError(f"--dataset_config {data_args.dataset_config}: unknown reward(s) {unknown}; "
                         f"available: {sorted(known)}")
    bad_kwargs = [n for n in args.reward_kwargs_dict if n not in known]
    if bad_kwargs:
        raise SetupError(f"--reward_kwargs names unknown reward(s) {bad_kwargs}; available: {sorted(known)}")
    if data_args.eval_dataset_config and args.eval_freq:
        from deepgen_rl.evaluation.config import load_eval_config

        try:
            load_eval_config(data_args.eval_dataset_config)
        except FileNotFoundError as e:
            raise SetupError(f"--eval_dataset_config: {e} (EVAL_DATASET_CONFIG in train.sh; empty disables "
                             "evaluation)") from None
        except yaml.YAMLError as e:
            raise SetupError(f"--eval_dataset_config {data_args.eval_dataset_config}: not valid YAML "
                             f"({getattr(e, 'problem', None) or e})") from None
    if data_args.sftaux_dataset_config and args.sftaux_coef > 0 and not os.path.isfile(
            data_args.sftaux_dataset_config):
        raise SetupError(f"--sftaux_dataset_config {data_args.sftaux_dataset_config}: file not found "
                         "(SFTAUX_DATASET_CONFIG in train.sh; empty disables the SFT term)")
    if args.deepspeed_config:
        if isinstance(args.deepspeed_config, str):
            try:
                ds_config = json.loads(Path(args.deepspeed_config).read_text(encoding="utf-8"))
            except OSError as e:
                raise SetupError(f"--deepspeed {args.deepspeed_config}: {e.strerror or e}") from None
            except json.JSONDecodeError as e:
                raise SetupError(f"--deepspeed {args.deepspeed_config}: not valid JSON ({e})") from None
        else:
            ds_config = dict(args.deepspeed_config)
        from deepgen_rl.trainer.deepspeed_utils import cpu_adam_problem

        # ZeRO-Offload's CPU Adam is JIT-built on a GPU node: a missing toolkit would otherwise surface only after
        # the model is built and DeepSpeed starts compiling
        problem = cpu_adam_problem(ds_config) if isinstance(ds_config, dict) else None
        if problem:
            raise SetupError(f"--deepspeed {args.deepspeed_config}: {problem} (DEEPSPEED_CONFIG in train.sh)")
    if int(os.environ.get("RANK", 0)) == 0:
        check_output_dir(args.output_dir, _resume_arg(args), args.overwrite_output_dir)
        if args.resume_from_checkpoint:  # an explicit checkpoint must be whole: say so before the model loads
            from deepgen_rl.checkpoints.training_state import ResumeError, validate_resume_path

            problem = validate_resume_path(args.resume_from_checkpoint)
            if problem:
                raise ResumeError(problem)


def _one_line(e: BaseException) -> str:
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return text or type(e).__name__


def _fail(e: BaseException) -> None:
    if os.environ.get("DEEPGEN_DEBUG") or os.environ.get("DEEPGEN_RL_TRACEBACK"):
        raise e
    print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr, flush=True)
    raise SystemExit(2) from None


SETUP_ERRORS = (SetupError, OSError, ValueError, KeyError, TypeError, yaml.YAMLError)


def main(argv=None):
    # transformers warns on every parse that TrainingArguments' field name will change in v6: noise before any error
    warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning)
    try:
        model_args, data_args, args = parse_args(argv)
        preflight(model_args, data_args, args)
    except SETUP_ERRORS as e:  # set-up problems: say what is wrong, no traceback
        _fail(e)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    hf_logging.set_verbosity_warning()
    from deepgen_rl.checkpoints.training_state import ResumeError
    from deepgen_rl.models import build_model
    from deepgen_rl.trainer.grpo_trainer import DeepGenGRPOTrainer
    from deepgen_rl.utils import dist

    dist.init_process_group_if_needed(timeout_s=args.ddp_timeout)  # --ddp_timeout bounds every collective wait
    set_seed(args.seed)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    try:
        model = build_model(model_args.model_config, checkpoint=model_args.checkpoint)
        trainer = DeepGenGRPOTrainer(
            model, args, dataset_config=data_args.dataset_config, eval_dataset_config=data_args.eval_dataset_config,
            sftaux_dataset_config=data_args.sftaux_dataset_config,
            run_configs={"model_config": model_args.model_config, "dataset_config": data_args.dataset_config,
                         "eval_dataset_config": data_args.eval_dataset_config,
                         "sftaux_dataset_config": data_args.sftaux_dataset_config})
    except (OSError, ValueError, KeyError) as e:
        _fail(e)
    if dist.rank() == 0:
        (Path(args.output_dir) / "run_args.json").write_text(json.dumps(
            {"model": vars(model_args), "data": vars(data_args), "argv": sys.argv[1:] if argv is None else argv},
            indent=2, default=str))
    try:
        trainer.train(resume_from_checkpoint=_resume_arg(args))
    except ResumeError as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted(trainer.state.global_step, args.output_dir)
    dist.barrier()
    if dist.is_dist():
        import torch.distributed as tdist

        tdist.destroy_process_group()
    _final_line(trainer.counters, getattr(trainer, "counters_at_start", {}), step=trainer.state.global_step,
                rank=trainer.rank)
    return trainer


def _interrupted(step: int, output_dir) -> None:
    """Ctrl-C: say where the run stands and exit at once (status 130). Reward requests still in flight (possibly
    retrying a hung service for minutes, in threads a reward client may have started) are abandoned: ``os._exit``
    skips the interpreter's join of worker threads. A checkpoint being written stays ``checkpoint-N.tmp`` and is
    cleaned up on resume."""
    from deepgen_rl.checkpoints.rl_format import latest_checkpoint

    last = latest_checkpoint(output_dir)
    print(f"{PROG}: interrupted at step {step}; last complete checkpoint: "
          f"{last.name if last else 'none'} (rerun with the same --output_dir to resume)", file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(130)


def _final_line(counters: dict, before: dict, *, step: int, rank: int) -> None:
    """One closing line with this run's applied and skipped updates (``counters`` minus the resumed ``before``);
    a run that trained nothing exits 1."""
    applied = counters["optimizer_steps"] - before.get("optimizer_steps", 0)
    skipped = counters["skipped_updates"] - before.get("skipped_updates", 0)
    if rank == 0:
        print(f"{PROG}: finished at step {step}: {applied} optimizer update(s) applied, "
              f"{skipped} skipped (non-finite loss or gradient)", file=sys.stderr, flush=True)
    if skipped and not applied:
        print(f"{PROG}: error: every one of this run's {skipped} update(s) was skipped: the DiT was not trained "
              "(see train/nonfinite_losses in metrics.jsonl)", file=sys.stderr, flush=True)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
