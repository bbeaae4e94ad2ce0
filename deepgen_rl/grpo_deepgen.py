"""Entry point: ``python -m deepgen_rl.grpo_deepgen [--flag value ...]`` (``scripts/train.sh`` runs it).

Parses ModelArguments, DataArguments and GRPOConfig (a ``transformers.TrainingArguments``) with HfArgumentParser,
builds the DeepGen model, and trains its DiT with MR-GRPO (``DeepGenGRPOTrainer``). ``--help`` lists every flag.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from transformers import HfArgumentParser, set_seed
from transformers.utils import logging as hf_logging

from deepgen_rl.config import DataArguments, GRPOConfig, ModelArguments


def parse_args(argv=None):
    parser = HfArgumentParser((ModelArguments, DataArguments, GRPOConfig))
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv=None):
    model_args, data_args, args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    hf_logging.set_verbosity_warning()
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
    except (OSError, ValueError, KeyError) as e:  # set-up problems: say what is wrong, no traceback
        if os.environ.get("DEEPGEN_RL_TRACEBACK"):
            raise
        print(f"deepgen_rl: error: {type(e).__name__}: {e}\n(set DEEPGEN_RL_TRACEBACK=1 for the traceback)",
              file=sys.stderr)
        raise SystemExit(2) from None
    if dist.rank() == 0:
        (Path(args.output_dir) / "run_args.json").write_text(json.dumps(
            {"model": vars(model_args), "data": vars(data_args), "argv": sys.argv[1:] if argv is None else argv},
            indent=2, default=str))
    resume = args.resume_from_checkpoint or (None if args.auto_resume else False)
    trainer.train(resume_from_checkpoint=resume)
    dist.barrier()
    if dist.is_dist():
        import torch.distributed as tdist

        tdist.destroy_process_group()
    return trainer


if __name__ == "__main__":
    main()
