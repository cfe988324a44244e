#!/bin/bash
# On the H100 (device tool, from the repository root): the GPU tests, then `bench --gpu` with
# the planner's kernels and with the shipped H200 entries relabelled for this GPU.
# $1: the carried folder holding `smallgemm` and `gpu-tests` built here (default carry/gpu).
dir=${1:-carry/gpu}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv
python3 scripts/gpu/relabel_h200_entries.py jit-runtime/tuning/shipped-gpu.json /tmp/h200as.json
cd "$dir" || exit 1
s=$(date +%s)
timeout 240 ./gpu-tests > "$OUT/tests.log" 2>&1; echo "tests rc $? in $(( $(date +%s) - s )) s"
grep -E "test result|FAILED|panicked" "$OUT/tests.log" | head
for run in planner h200as; do
  s=$(date +%s)
  db=/nonexistent.json; [ $run = h200as ] && db=/tmp/h200as.json
  SMALLGEMM_TUNING_DB=$db timeout 170 ./smallgemm bench --gpu --out "$OUT/$run" > "$OUT/$run.log" 2>&1
  echo "bench $run rc $? in $(( $(date +%s) - s )) s"; rm -f "$OUT/$run/bench.svg"; tail -12 "$OUT/$run.log"
done
