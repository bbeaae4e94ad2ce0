# Pre-trained toy DeepGen for the toy compositional world (deepgen_rl/toy, docs/toy_world.md): the real model's
# classes (tiny Qwen2.5-VL, connector, SD3 DiT, AutoencoderKL) saved with save_pretrained + an SFT-layout checkpoint,
# pre-trained on 64x64 images of coloured shapes. build_model() builds it once (a few CPU minutes, announced, with
# progress bars; $DEEPGEN_TOY_VARIANT=NAME picks a build of deepgen_rl.toy.model.VARIANTS, e.g. slots)
# into deepgen_rl.toy.model.toy_dir() ($DEEPGEN_TOY_DIR, else deepgen_toy next to $DEEPGEN_TINY_DIR,
# else ~/.cache/deepgen_rl/toy-vN) and then loads it exactly like the real model. Sizes mirror
# deepgen_rl.toy.model.TOY_CONFIG["deepgen"]. Images: 64x64 (8x8 latents).
prebuilt = "deepgen_rl.toy.model:ensure_toy_deepgen"  # builds the files once; its folder fills {prebuilt_dir}
lmm_path_env = None
sd3_path_env = None
lmm_path = "{prebuilt_dir}/qwen"
sd3_path = "{prebuilt_dir}/sd3"
default_checkpoint = "{prebuilt_dir}/deepgen_toy.pth"

dtype = "float32"
vae_dtype = None
num_queries = 8
max_prompt_tokens = 24
prompt_template = "<|im_start|>user\nGenerate an image: {prompt}<|im_end|>\n<|im_start|>assistant\n"
connector = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
lora_rank = 4
lora_alpha = 8
init_seed = 0
