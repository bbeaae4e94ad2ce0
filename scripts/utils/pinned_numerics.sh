# Sourced by scripts/test.sh and scripts/toy_prompt_following.sh. Pinned CPU numerics (deepgen_rl/toy/model.py,
# "Pinned numerics"): on x86-64 with AVX2, torch's, MKL's, oneDNN's and numpy's kernels are held to AVX2 on one
# thread (MKL in its strict reproducible mode: on Intel its plain AVX2 mode depends on buffer alignment), so that the
# toy model's build and the toy RL runs give the same numbers on every such machine of one CPU vendor (not across
# vendors: docs/toy_world.md, "A build on both cores; an Intel machine"); an AVX-512 machine otherwise trains a
# different toy model. numpy picks its SIMD loops at import (its AVX-512 groups are X86_V4, AVX512_ICL and AVX512_SPR)
# and the toy reward's scores change in the last bits with them (docs/toy_world.md, "A
# slower machine"). Values already set in the environment win.
if [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}" MKL_CBWR="${MKL_CBWR:-AVX2,STRICT}" \
    ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX2}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}" \
    NPY_DISABLE_CPU_FEATURES="${NPY_DISABLE_CPU_FEATURES:-X86_V4 AVX512_ICL AVX512_SPR}"
fi
