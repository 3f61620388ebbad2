#!/usr/bin/env bash
# The codec kernels under a profiler: their timings (launch cost hidden and not) and launch
# configurations, then ncu's view of one default taco kernel at 64M bfloat16 elements
# (NCU_OPS: encode, decode_accumulate), then the GPU codec tests. Logs and JSON in $OUT.
# Usage, from the repository root: bash bench/scripts/h200_codec_probe.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "=== timings + tuning ($(date +%T))"
timeout 300 python3 -m coccl.bench.cli codec --device gpu --counts 64M,256M -d bfloat16,float16,float32 \
  --compressor taco,int8 -n 31 -c 0 --tuning --launch-cost --json "$OUT/codec.json" 2>&1 \
  | tee "$OUT/codec_log.txt" | grep -v "^ int8" | tail -60
for op in ${NCU_OPS:-encode}; do
  echo "=== ncu $op 64M ($(date +%T))"
  # the probe's first launch makes the payload; skip it and two more, profile the fourth
  timeout 120 ncu --clock-control none -k regex:coccl_codec --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section InstructionStats \
    --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 bench/scripts/codec_kernel_probe.py $op --count 64M > "$OUT/ncu-$op.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Executed Ipc A|Issue Slots Busy|Achieved Occupancy|Registers Per|Executed Instructions  |No Eligible|Stall|Warp Cycles Per Issued|Block Limit Reg|Theoretical Occ|L1/TEX Hit|Mem Busy|Max Bandwidth|One or More" "$OUT/ncu-$op.txt" | head -40
done
echo "=== tests ($(date +%T))"
timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_codec_gpu.py ${EXTRA_TESTS:-} 2>&1 | tail -8
echo "=== done ($(date +%T))"
