"""Checkpoints, one home: the RL checkpoint format and atomic writes (``rl_format``), the trainer's training state
(``training_state``), and DeepGen SFT checkpoints (``sft``: .pth / DeepSpeed ZeRO folder read, key map, export)."""
