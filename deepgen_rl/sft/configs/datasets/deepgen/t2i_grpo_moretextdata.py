# SFT-auxiliary image–caption mixture for DeepGen GRPO training (SFTAUX_DATASET_CONFIG), weighted towards
# text-rendering data ("more text data"). Format: deepgen_rl/sft/data.py module docstring.
#
# Expected layout under $DATA_ROOT (JSONL, one {"image": ..., "caption": ...} per line; image paths relative to
# the annotation file's folder):
#   $DATA_ROOT/text_rendering/annotations.jsonl   images with rendered text, captions quoting the text
#   $DATA_ROOT/text_poster/annotations.jsonl      posters / signs / typography
#   $DATA_ROOT/general_t2i/annotations.jsonl      general high-aesthetic text-to-image pairs
# P(dataset) = weight / sum(weights), independent of dataset size.
import os

DATA_ROOT = os.environ.get("DATA_ROOT", "")

image_size = 512
batch_size = 4  # per rank; the trainer's --sftaux_micro_batch_size overrides it
num_workers = 4

datasets = [
    dict(name="text_rendering", annotation=os.path.join(DATA_ROOT, "text_rendering", "annotations.jsonl"),
         weight=3.0),
    dict(name="text_poster", annotation=os.path.join(DATA_ROOT, "text_poster", "annotations.jsonl"), weight=2.0),
    dict(name="general_t2i", annotation=os.path.join(DATA_ROOT, "general_t2i", "annotations.jsonl"), weight=1.0),
]
