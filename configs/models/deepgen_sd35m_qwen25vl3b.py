# DeepGen 1.0 (5B): Qwen2.5-VL-3B-Instruct + Stacked Channel Bridging + SD3.5-Medium DiT (UniPic2-SD3.5M-Kontext-2B).
# Reads only the two model-path env vars at import time; the SFT checkpoint ($CHECKPOINT) is passed to build_model.
import os

lmm_path_env = "QWEN2_5_VL_MODEL_NAME_OR_PATH"
sd3_path_env = "SD3_5_MODEL_NAME_OR_PATH"
lmm_path = os.environ.get(lmm_path_env)
sd3_path = os.environ.get(sd3_path_env)
default_checkpoint = None

dtype = "bfloat16"
vae_dtype = None  # same as dtype
num_queries = 128  # think tokens
# Text tokens per prompt incl. the ~15-token template; longer prompts are truncated (counted and logged).
# Prompts are padded to the longest prompt of each batch and the DiT masks pad rows, so this limit costs nothing for
# short prompts. 1024 fits every prompt of the recipe's files with a margin: the longest (corebench) has 334 words
# = 433 Qwen2 pre-token pieces, at most ~1.5 tokens each + 13 template tokens = 663 (bench/prompt_rows.py,
# docs/recipe.md).
max_prompt_tokens = 1024
prompt_template = "<|im_start|>user\nGenerate an image: {prompt}<|im_end|>\n<|im_start|>assistant\n"
connector = dict(hidden_size=2048, num_hidden_layers=6, num_attention_heads=32, intermediate_size=11946)
lora_rank = 64
lora_alpha = 128
init_seed = 0
