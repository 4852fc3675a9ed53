#!/usr/bin/env bash
# Capacity under an SLO on one H200 (issue 25, the last Must-show), on the GPU machine, from the
# repository root there (the device tool's `run`, carry [".whl"]):
#   OUT=$OUT DEADLINE_S=185 bash benchmarks/h200_capacity.sh     (two searches: 159 s there)
#   OUT=$OUT DEADLINE_S=120 CYCLES=1 bash benchmarks/h200_capacity.sh   (one search)
# Twice in one call: `cleanslate serve --detach` (verified clean before, ready, smoked) of the
# best configuration of docs/validation/h200-statistics.md (trial #1: transformers serve,
# continuous batching, CUDA graphs, cb-max-memory-percent 0.3), one capacity search under p99
# TPOT 200 ms (`cleanslate bench --find-max concurrency`), `cleanslate stop`
# (verified clean after); the second search on a new server.
# Needs: the wheels in .whl/h200/ (docs/validation/h200-statistics.md), cleanslate's source in
# $CS_SRC (default .whl/cs-src/src when that exists: a `git archive` of one commit, with its
# hash in .whl/cs-src/COMMIT; here, before the call:
#   rm -rf .whl/cs-src && mkdir -p .whl/cs-src && git archive HEAD src | tar -x -C .whl/cs-src \
#     && git rev-parse HEAD > .whl/cs-src/COMMIT).
# Locally (no GPU) SERVER_FILE=... GPU_BACKEND=auto runs the same steps against another server file (the sim), skipping the install and the model
# (SERVE_ARGS=--no-preflight where other people's servers make the host dirty).
# Writes to $OUT: env.txt, run.log (with a line per probe as it is decided), s1.json, s2.json
# (bench --json: every probe with its level), cycle1.json, cycle2.json (serve's and stop's JSON).
set -u
START=$(date +%s)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
DEADLINE_S=${DEADLINE_S:-185}   # everything ends by START + this (a search is stopped before)
STOP_RESERVE_S=${STOP_RESERVE_S:-12}  # kept for `cleanslate stop` and the last readings
if [ -z "${CS_SRC:-}" ]; then
  if [ -d .whl/cs-src/src ]; then CS_SRC=.whl/cs-src/src; else CS_SRC=src; fi
fi
MODEL=${MODEL:-/tmp/tiny-llama-0.8b}
GPU_BACKEND=${GPU_BACKEND:-nvml}
WORK=${WORK:-/tmp/cs-capacity}
DB=$WORK/cs.db
# The statistics validation's workload (128-token prompts, 32-token outputs, no ignore_eos:
# transformers serve refuses it with a 422, and the random model has no EOS). 384 requests per
# measurement: a p99 needs 381 to pass at 95 % (CapacitySLO.min_requests), and at c=384 every
# slot is filled once.
SEARCH_ARGS=${SEARCH_ARGS:---slo p99_tpot_ms=200 --start 128 --max-load 384 --tolerance 0.25 --max-extensions 1 --num-prompts 384 --warmup 32 --workload random:input_len=128,output_len=32 --no-ignore-eos}
LOG=$OUT/run.log
stamp() { echo "== $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s $*" | tee -a "$LOG"; }
rm -rf "$WORK"; mkdir -p "$WORK"; : > "$LOG"

if [ -z "${SERVER_FILE:-}" ]; then
  # PYTHONDONTWRITEBYTECODE is set there: with it unset each module is compiled once, on its
  # first import, instead of on every process start (cheaper than compileall of everything).
  unset PYTHONDONTWRITEBYTECODE
  # The model builds on the GPU (torch's default device) while the wheels are unpacked.
  PYTHONPATH=$PWD/$CS_SRC python3 - "$MODEL" > "$WORK/model.txt" 2>&1 <<'PY' &
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
  # A fresh folder every time; a wheel is a zip, unpacked as pip --target would lay it out.
  rm -rf /tmp/site
  python3 - .whl/h200/*.whl <<'PY' || exit 1
import sys, zipfile
for wheel in sys.argv[1:]:
    zipfile.ZipFile(wheel).extractall("/tmp/site")
PY
  export PYTHONPATH=/tmp/site:$PWD/$CS_SRC PYTHONUNBUFFERED=1
  PYBIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
  command -v transformers >/dev/null || export PATH=$PYBIN:$PATH
  # Warms the engine's imports (and their bytecode) for serve's flag validation and start;
  # waited for before the first serve (a stray engine process would make the host dirty).
  transformers serve --help > /dev/null 2>&1 &
  HELP_PID=$!
  stamp installed
  {
    date -u; uname -a; nproc
    echo "cleanslate source: $CS_SRC commit $(cat .whl/cs-src/COMMIT 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
    python3 - <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "transformers", "tokenizers", "numpy", "scipy", "pydantic", "fastapi",
             "uvicorn", "openai", "aiohttp", "pynvml", "psutil"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "not importable:", e)
PY
  } > "$OUT/env.txt" 2>&1
  wait "$MODEL_PID"; echo "model build exit $?" >> "$WORK/model.txt"
  wait "$HELP_PID"; echo "transformers serve --help exit $?" >> "$WORK/model.txt"
  cat "$WORK/model.txt" >> "$OUT/env.txt"
  [ -f "$MODEL/model.safetensors" ] || { stamp "no model"; exit 1; }
  stamp model
  SERVER_FILE=$WORK/server.yaml
  cat > "$SERVER_FILE" <<EOF
# The best configuration of docs/validation/h200-statistics.md, runs 3 and 4: trial #1.
engine: transformers
model: $MODEL
port: 8000
gpus: [0]
flags: {device: cuda, dtype: bfloat16, continuous-batching: true, cb-use-cuda-graph: true,
        cb-max-memory-percent: 0.3}
ready_timeout_s: 120
smoke_timeout_s: 60
grace_s: 15
EOF
else
  export PYTHONPATH=$PWD/$CS_SRC PYTHONUNBUFFERED=1
  echo "server file $SERVER_FILE (local run); commit $(git rev-parse HEAD 2>/dev/null)" \
    > "$OUT/env.txt"
fi
cp "$SERVER_FILE" "$WORK/server-used.yaml"
SERVED_MODEL=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['model'])" \
  "$SERVER_FILE")

cycle() {  # $1: 1 or 2; $2: epoch seconds the search must end by
  local i=$1 until=$2 run url
  stamp "serve $i"
  python3 -m cleanslate serve "$SERVER_FILE" --detach --json --store "sqlite:///$DB" \
    --gpu-backend "$GPU_BACKEND" ${SERVE_ARGS:-} > "$WORK/serve$i.json" 2> "$WORK/serve$i.err"
  echo "serve exit $?" >> "$LOG"
  run=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" \
    "$WORK/serve$i.json" 2>/dev/null)
  url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['url'])" \
    "$WORK/serve$i.json" 2>/dev/null)
  if [ -z "$run" ] || [ -z "$url" ]; then
    stamp "serve $i failed"; tail -c 3000 "$WORK/serve$i.err" >> "$LOG"
    cp "$WORK/serve$i.json" "$OUT/cycle$i.json" 2>/dev/null
    return 1
  fi
  stamp "ready $i: run $run url $url; search until +$(( until - START ))s"
  if [ $(( until - $(date +%s) )) -lt 10 ]; then  # (timeout 0 would mean no limit at all)
    stamp "no time left for search $i"
  else
  # SIGINT at the deadline: the probe in flight ends as interrupted and the JSON is written.
  # shellcheck disable=SC2086
  timeout -s INT -k 20 $(( until - $(date +%s) )) python3 -m cleanslate bench --url "$url" \
    --model "$SERVED_MODEL" --find-max concurrency $SEARCH_ARGS \
    --seed $(( (i - 1) * 100000 )) --json "$OUT/s$i.json" --no-live >> "$LOG" 2>&1
  echo "search exit $?" >> "$LOG"
  fi
  stamp "stop $i"
  python3 -m cleanslate stop "$run" --json --store "sqlite:///$DB" --gpu-backend "$GPU_BACKEND" \
    --grace 15 --deadline 30 > "$WORK/stop$i.json" 2>> "$LOG"
  echo "stop exit $?" >> "$LOG"
  python3 - "$WORK/serve$i.json" "$WORK/stop$i.json" > "$OUT/cycle$i.json" <<'PY'
import json, sys
docs = {}
for key, path in zip(("serve", "stop"), sys.argv[1:]):
    try:
        docs[key] = json.load(open(path))
    except Exception as e:  # noqa: BLE001
        docs[key] = {"unreadable": str(e)}
print(json.dumps(docs, indent=1))
PY
  stamp "stopped $i"
}

END=$(( START + DEADLINE_S ))
now=$(date +%s)
if [ "${CYCLES:-2}" = 1 ]; then  # one search (the second machine's): all the time left
  cycle 1 $(( END - STOP_RESERVE_S ))
else
  # The first search gets half of what is left after two starts and two stops (about 20 s
  # and 6 s each on the H200), the second the rest.
  first_until=$(( now + (END - now - 2 * 26) / 2 + 20 ))
  cycle 1 "$first_until"
  cycle 2 $(( END - STOP_RESERVE_S ))
fi
stamp final
{
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv 2>&1
} >> "$LOG" 2>&1
stamp "all done"
