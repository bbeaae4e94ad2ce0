# Sourced by scripts/quickstart_env.sh (so by both quickstarts and scripts/toy_prompt_following.sh) and run by
# bench/cpu_malloc.py. glibc malloc settings for CPU training: torch allocates and frees activation-sized buffers (MBs)
# many times per step; by default glibc serves them with fresh mmaps or gives freed heap back to the kernel, so each
# step page-faults the same memory in again. A fixed 1 GiB mmap threshold and a 4 GiB trim threshold keep that
# memory in the process: the same numbers to the last digit, fewer page faults, faster updates (bench/cpu_malloc.py;
# docs/toy_world.md, "glibc's malloc"). The price is that a process keeps its peak heap until it exits. Values
# already set in the environment win; other C libraries ignore these variables.
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1073741824}" \
  MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}"
