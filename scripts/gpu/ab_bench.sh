#!/bin/bash
# On the GPU machine (device tool, from the repository root): the GPU tests of build B, then
# `bench --gpu` with builds A and B alternated (A B B A A B ...), each run's table kept.
# $1, $2: carried folders holding `smallgemm` (and `gpu-tests` in $2); $3: rounds (default 3).
a=$1 b=$2 rounds=${3:-3}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
s=$(date +%s)
timeout 240 "$b/gpu-tests" > "$OUT/tests.log" 2>&1; echo "tests rc $? in $(( $(date +%s) - s )) s"
grep -E "test result|FAILED|panicked" "$OUT/tests.log" | head
order=""
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then order="$order A B"; else order="$order B A"; fi
done
i=0
for run in $order; do
  i=$((i + 1)); dir=$a; [ $run = B ] && dir=$b
  s=$(date +%s)
  timeout 170 "$dir/smallgemm" bench --gpu --out "/tmp/$i$run" > "$OUT/bench_$i$run.log" 2>&1
  echo "bench $i$run rc $? in $(( $(date +%s) - s )) s"
done
