# Tiny random DeepGen (< 2 M params) for CPU tests: no env var needed. build_model() creates the files once in
# deepgen_rl.models.tiny.tiny_dir() ($DEEPGEN_TINY_DIR or ~/.cache/deepgen_rl/tiny-v1) and then loads them exactly
# like the real model (from_pretrained + SFT-layout checkpoint). Sizes mirror deepgen_rl.models.tiny.PRESETS["tiny"].
# tiny_preset="small" (as a build_model override) gives a ~20 M-param DiT for CPU benchmarks (its own cache folder).
tiny_preset = "tiny"
lmm_path_env = None
sd3_path_env = None
lmm_path = "{tiny_dir}/qwen"
sd3_path = "{tiny_dir}/sd3"
# Random SFT-layout checkpoint with non-zero projector_2/3 (so conditioning matters); None -> fresh zero projectors.
default_checkpoint = "{tiny_dir}/deepgen_tiny.pth"

dtype = "float32"
vae_dtype = None
num_queries = 16
max_prompt_tokens = 64
prompt_template = "<|im_start|>user\nGenerate an image: {prompt}<|im_end|>\n<|im_start|>assistant\n"
connector = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
lora_rank = 4
lora_alpha = 8
init_seed = 0
