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
# 256 covers T2I benchmark prompts (GenEval/OCR < 100 tokens, long UniGenBench prompts ~100-200) while keeping the
# DiT's text sequence (256 + 128 think tokens = 384) well below the 1024 image tokens of a 512x512 image.
max_prompt_tokens = 256
prompt_template = "<|im_start|>user\nGenerate an image: {prompt}<|im_end|>\n<|im_start|>assistant\n"
connector = dict(hidden_size=2048, num_hidden_layers=6, num_attention_heads=32, intermediate_size=11946)
lora_rank = 64
lora_alpha = 128
init_seed = 0
