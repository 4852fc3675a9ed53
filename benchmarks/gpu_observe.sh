#!/usr/bin/env bash
# GPU telemetry per level on the GPU machine (issue 36 item 3, "Must show"), from the
# repository root there (the device tool's `run`, carry [".whl"]):
#   OUT=$OUT bash benchmarks/gpu_observe.sh
# Needs the wheels in .whl/h200/ (docs/validation/h200-statistics.md, "Reproduce", plus
# prometheus-client). Steps: unpack the wheels into a fresh /tmp/site while the random-weight
# Llama builds on the GPU; start `transformers serve` (continuous batching, CUDA graphs,
# cb-max-memory-percent 0.3) and end it by its PID; `cleanslate bench` at c=1,4,16,64,256 with
# the observers on (GPU telemetry from NVML, the default for a URL on this machine), then the
# same levels with --no-observe; the host sampler script (NVML through ctypes, and nvidia-smi)
# for a few seconds each; the GPU-marked test (PHASES="levels samplers"). PHASES="ab cost": the
# observers' cost side by side (see below) and each NVML call's cost. PHASES=verdicts (issue 37):
# a short warm-up pass at every level, then the levels with the observers on, each level's
# bottleneck verdict printed (docs/validation/h100-bottleneck.md). Writes to $OUT: env.txt,
# run.log, on.json, off.json, samplers.txt, observed.tgz; ab.json, nvml_cost.txt; verdicts.json,
# verdicts.txt.
set -u
START=$(date +%s)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
MODEL=${MODEL:-/tmp/tiny-llama-0.8b}
DURATION=${DURATION:-12}
LEVELS=${LEVELS:-1,4,16,64,256}
PHASES=${PHASES:-levels samplers}   # of: levels samplers ab cost verdicts
ROUNDS=${ROUNDS:-2}
AB_LEVELS=${AB_LEVELS:-64,256}
LOG=$OUT/run.log
: > "$LOG"
stamp() { echo "== $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s $*" | tee -a "$LOG"; }
unset PYTHONDONTWRITEBYTECODE CLEANSLATE_SIM_GPU_DIR

PYTHONPATH=$PWD/src python3 - "$MODEL" > /tmp/model.txt 2>&1 <<'PY' &
import os, sys, time
t0 = time.time()
import torch
from cleanslate.testing.tiny_model import build_tiny_llama
with torch.device("cuda"):
    out = build_tiny_llama(sys.argv[1], hidden_size=2048, num_hidden_layers=16,
                           num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                           intermediate_size=5632, max_position_embeddings=2048)
size = os.path.getsize(os.path.join(out, "model.safetensors"))
print(f"model {out} built in {time.time() - t0:.1f} s: {size / 2 / 1e9:.3f} B parameters")
PY
MODEL_PID=$!
rm -rf /tmp/site
python3 - .whl/h200/*.whl <<'PY' || exit 1
import sys, zipfile
for wheel in sys.argv[1:]:
    zipfile.ZipFile(wheel).extractall("/tmp/site")
PY
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
PYBIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
command -v transformers >/dev/null || export PATH=$PYBIN:$PATH
{
  date -u; uname -a; nproc
  echo "cleanslate tree: $(git rev-parse HEAD 2>/dev/null || echo '?') plus the working tree"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit,clocks.max.sm \
    --format=csv
  python3 -c "import platform, pynvml, torch, transformers; print('python', platform.python_version(), 'torch', torch.__version__, 'transformers', transformers.__version__, 'nvidia-ml-py', getattr(pynvml, '__version__', '?'))"
} > "$OUT/env.txt" 2>&1
wait "$MODEL_PID"; cat /tmp/model.txt >> "$OUT/env.txt"
[ -f "$MODEL/model.safetensors" ] || { stamp "no model"; exit 1; }
stamp "model and wheels ready"

# SERVE_FLAGS: the engine's tuning flags (issue 37 also ran a KV cache of 32 blocks of 32)
SERVE_FLAGS=${SERVE_FLAGS:---continuous-batching --cb-use-cuda-graph --cb-max-memory-percent 0.3}
# shellcheck disable=SC2086
transformers serve "$MODEL" --port 8000 --device cuda --dtype bfloat16 $SERVE_FLAGS \
  > /tmp/serve.log 2>&1 &
SERVER=$!
echo "$SERVER" > /tmp/serve.pid
trap 'kill -TERM $SERVER 2>/dev/null; sleep 3; kill -KILL $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 120); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null && break
  sleep 0.5
done
stamp "server ready (pid $SERVER)"

BENCH="python3 -m cleanslate bench --url http://127.0.0.1:8000 --model $MODEL \
  --warmup 32 --no-live --no-ignore-eos \
  --workload random:input_len=128,output_len=32 ${BENCH_EXTRA:-}"
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }

if has levels; then
stamp "bench with observers"
$BENCH --concurrency $LEVELS --duration $DURATION --observe-dir /tmp/observed --json "$OUT/on.json" >> "$LOG" 2>&1
echo "bench exit $?" >> "$LOG"
stamp "bench --no-observe"
$BENCH --concurrency $LEVELS --duration $DURATION --no-observe --json "$OUT/off.json" >> "$LOG" 2>&1
echo "bench exit $?" >> "$LOG"
tar czf "$OUT/observed.tgz" -C /tmp observed 2>/dev/null
fi

if has ab; then
# The observers' cost, side by side on one warm server: a warm-up pass first (CUDA graphs of
# every batch size captured), then rounds of four variants in turn at c=64 and c=256: none
# (--no-observe), the engine-metrics scraper alone (--gpus none), both (GPU telemetry from NVML
# in the bench's own process too), and GPU telemetry from the nvidia-smi host sampler.
stamp "ab warm-up pass"
$BENCH --concurrency $LEVELS --duration 6 --no-observe --json /tmp/warm.json >> "$LOG" 2>&1
for round in $(seq 1 "$ROUNDS"); do
  for variant in off metrics gpu smi; do
    case $variant in
      off) extra="--no-observe";; metrics) extra="--gpus none";; gpu) extra="--gpus 0";;
      smi) extra="--gpus 0 --gpu-source nvidia-smi";;
    esac
    stamp "ab round $round $variant"
    $BENCH --concurrency $AB_LEVELS --duration $DURATION $extra --json "/tmp/ab-$round-$variant.json" >> "$LOG" 2>&1
    echo "bench exit $?" >> "$LOG"
  done
done
python3 - /tmp/ab-*.json > "$OUT/ab.json" <<'PY'
import json, os, sys
print(json.dumps({os.path.basename(p): json.load(open(p)) for p in sys.argv[1:]}))
PY
fi

if has verdicts; then
stamp "verdicts: warm-up pass"
$BENCH --concurrency $LEVELS --duration 4 --no-observe --json /tmp/warm.json >> "$LOG" 2>&1
echo "bench exit $?" >> "$LOG"
stamp "verdicts: bench with observers"
$BENCH --concurrency $LEVELS --duration $DURATION --json "$OUT/verdicts.json" >> "$LOG" 2>&1
echo "bench exit $?" >> "$LOG"
python3 - "$OUT/verdicts.json" > "$OUT/verdicts.txt" 2>&1 <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for lv in doc["levels"]:
    b = lv.get("bottleneck") or {}
    print(f"{lv['label']}: {lv['output_throughput']:.0f} tok/s, {lv['completed']} done, "
          f"{lv['failed']} failed: {b.get('verdict')} ({b.get('confidence')}, rule {b.get('rule')})")
    for line in b.get("evidence", ()):
        print("  evidence:", line)
    for a in b.get("advice", ()):
        print("  advice:", a["text"])
    print("  missing:", ", ".join(b.get("missing", ())), "| also:", b.get("also"))
PY
cat "$OUT/verdicts.txt" >> "$LOG"
fi

if has samplers; then
stamp "host sampler script"
python3 - > "$OUT/samplers.txt" 2>&1 <<'PY'
import asyncio, time
from cleanslate.bench._gpu import GpuObserver, HostSampler, make_sampler
from cleanslate.bench import LevelEnd
from cleanslate.hosts.local import LocalExecutor

async def watch(sampler, seconds=3.0):
    observer = GpuObserver(sampler, (0,))
    t0 = time.perf_counter()
    await observer.start()
    await asyncio.sleep(seconds)
    observed = await observer.stop(LevelEnd(window=None, level_span=None, output_tokens=1,
                                            completed=1))
    return observed.summary[0], time.perf_counter() - t0

for label, sampler in (
        ("nvml thread (pynvml)", make_sampler(None, (0,), "nvml", 0.25)),
        ("host script, NVML via ctypes", HostSampler(LocalExecutor(), (0,), 0.25, "nvml")),
        ("host script, nvidia-smi -lms", HostSampler(LocalExecutor(), (0,), 0.25, "nvidia-smi"))):
    gpu, took = asyncio.run(watch(sampler))
    print(f"{label}: {took:.2f} s, {gpu.model_dump_json(exclude_none=True)}")
PY
stamp "gpu test"
python3 -m pytest -q -m gpu tests/bench/test_gpu_telemetry.py -p no:cacheprovider \
  >> "$OUT/samplers.txt" 2>&1
echo "pytest exit $?" >> "$OUT/samplers.txt"
fi

if has cost; then
stamp "nvml call costs"
python3 benchmarks/nvml_call_cost.py 40 > "$OUT/nvml_cost.txt" 2>&1
fi
tail -n 30 /tmp/serve.log > /tmp/serve-tail.txt; cat /tmp/serve-tail.txt >> "$LOG"
stamp "all done"
