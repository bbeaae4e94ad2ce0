"""DeepGen-RL: MR-GRPO for DeepGen 1.0."""
__version__ = "0.1.0"
