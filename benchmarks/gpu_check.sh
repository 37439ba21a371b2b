#!/usr/bin/env bash
# The GPU checks in one call of a lent machine (the device tool): the CUDA test suite, then step
# costs of the built-in shapes as chains and as token trees, and the trained heads' drafting rounds (random
# weights: cost depends on shapes).
#   bash benchmarks/gpu_check.sh            # writes logs and tables under $OUT (default: ./gpu-out)
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L
python3 -c "import torch, transformers, tokenizers, safetensors; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
for cmd in "--shape qwen2.5-1.5b --tokens 1,2,4,8,12,16,24 --heads 4" "--shape qwen2.5-0.5b --tokens 1,2,4"; do
  name=$(echo "$cmd" | awk '{print $2}')
  timeout 120 python3 benchmarks/step_cost.py $cmd --device cuda --dtype bfloat16 --context 512 --repeats 20 --tree \
    2>&1 | tee "$OUT/step-cost-$name.md"
done
timeout 420 python3 -m pytest -q -p no:cacheprovider --durations=8 tests/test_cuda.py \
  2>&1 | tee "$OUT/pytest-cuda.log" | tail -25
