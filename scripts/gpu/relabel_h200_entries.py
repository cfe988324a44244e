"""Writes a tuning database that holds the shipped H200 GPU entries under this machine's GPU
name (from nvidia-smi), so that another GPU (the H100) runs the H200's winners:
python3 relabel_h200_entries.py jit-runtime/tuning/shipped-gpu.json OUT.json"""
import json
import subprocess
import sys

name = subprocess.check_output(
    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
).decode().splitlines()[0].strip()
shipped = json.load(open(sys.argv[1]))
out = {"version": 1, "cpu": {}, "gpu": {}}
for key, schedule in shipped["gpu"].items():
    device, shape = key.split(" | ", 1)
    if device == "NVIDIA H200":
        out["gpu"][f"{name} | {shape}"] = schedule
json.dump(out, open(sys.argv[2], "w"))
print(f"{name}: {len(out['gpu'])} entries relabelled")
