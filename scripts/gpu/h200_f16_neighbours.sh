#!/bin/bash
# On the GPU machine (device tool, from the repository root): the neighbours of the schedules
# in use at the f16 sizes that were below 85% of the bound on the H200 (docs/gpu-notes.md,
# version 36), then `bench --gpu` over those sizes with the shipped entries and with the
# tuned ones, alternated (a b b a). It tunes for whichever GPU it runs on.
# $1: the carried folder holding `smallgemm` built here (default carry/gpu).
dir=${1:-carry/gpu}
sizes=8,13,19,22,31,33,35,65,97,99,105,106,107,113,114,115,117,119
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv
cd "$dir" || exit 1
s=$(date +%s)
timeout 330 ./smallgemm tune --gpu --dtype f16 --neighbours --sizes $sizes --reps 5 --db "$OUT/nb.json" > "$OUT/tune.log" 2>&1
echo "tune rc $? in $(( $(date +%s) - s )) s"; grep -E "best" "$OUT/tune.log"
for run in a b c d; do
  s=$(date +%s)
  db=/nonexistent.json; case $run in b|c) db=$OUT/nb.json;; esac
  SMALLGEMM_TUNING_DB=$db timeout 50 ./smallgemm bench --gpu --f16-only --f16-sizes $sizes --out /tmp/b$run > "$OUT/bench_$run.log" 2>&1
  echo "bench $run ($db) rc $? in $(( $(date +%s) - s )) s"
done
