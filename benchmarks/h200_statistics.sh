#!/usr/bin/env bash
# The H200 run of a noise-aware study (issue 24, point 9), on the GPU machine, from the
# repository root there (the device tool's `run`, carry [".whl"]):
#   OUT=$OUT bash benchmarks/h200_statistics.sh
# Needs: the wheels the machine lacks in .whl/h200/ (docs/validation/h200-statistics.md lists
# them: those of docs/validation/h200-transformers.md plus scipy), cleanslate's source in
# $CS_SRC (default src; .whl/cs-src/src when that exists: a `git archive` of one commit, so that
# the run does not depend on uncommitted edits in the working tree).
# Writes to $OUT: env.txt, tune.log, stats.db, report.json, summary.txt, summary.json, final.txt.
set -u
START=$(date +%s)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
DEADLINE_S=${DEADLINE_S:-450}    # SIGINT to tune this many seconds after START (store survives)
if [ -z "${CS_SRC:-}" ]; then
  if [ -d .whl/cs-src/src ]; then CS_SRC=.whl/cs-src/src; else CS_SRC=src; fi
fi
MODEL=${MODEL:-/tmp/tiny-llama-0.8b}
STUDY=examples/h200-statistics.yaml
NAME=h200-statistics
WORK=/tmp/cs-stats
DB=$WORK/stats.db
stamp() { echo "== $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s $*"; }

# A fresh install folder every time (pip --target keeps stale files in an existing one).
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/h200/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/$CS_SRC PYTHONUNBUFFERED=1
PYBIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
command -v transformers >/dev/null || export PATH=$PYBIN:$PATH
# PYTHONDONTWRITEBYTECODE is set there: compile once, or every process start compiles again.
python3 -m compileall -q /tmp/site "$CS_SRC" >/dev/null 2>&1
python3 -c "import cleanslate.cli, optuna, scipy.stats, fastapi, uvicorn, openai" || exit 1
stamp installed

{
  date -u; uname -a; nproc
  echo "cleanslate source: $CS_SRC commit $(cat .whl/cs-src/COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
  python3 - <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "transformers", "tokenizers", "numpy", "scipy", "optuna", "sqlalchemy",
             "pydantic", "fastapi", "uvicorn", "openai", "pynvml", "psutil", "httpx"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "not importable:", e)
PY
} > "$OUT/env.txt" 2>&1
stamp env

if [ ! -f "$MODEL/model.safetensors" ]; then
  python3 - "$MODEL" <<'PY' >> "$OUT/env.txt" 2>&1 || exit 1
import os, sys, time
t0 = time.time()
from cleanslate.testing.tiny_model import build_tiny_llama
out = build_tiny_llama(sys.argv[1], hidden_size=2048, num_hidden_layers=16,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       intermediate_size=5632, max_position_embeddings=2048)
size = os.path.getsize(os.path.join(out, "model.safetensors"))
print(f"model {out} built in {time.time() - t0:.1f} s: {size / 2 / 1e9:.3f} B parameters")
PY
fi
stamp model

mkdir -p "$WORK"
left=$(( START + DEADLINE_S - $(date +%s) ))
stamp "tune (SIGINT after ${left}s)" | tee "$OUT/tune.log"
timeout -s INT -k 40 "$left" python3 -m cleanslate tune "$STUDY" --store "sqlite:///$DB" \
  --gpu-backend nvml >> "$OUT/tune.log" 2>&1
echo "tune exit $?" >> "$OUT/tune.log"
stamp "tune done" | tee -a "$OUT/tune.log"

python3 -m cleanslate report "$NAME" --store "sqlite:///$DB" --format json \
  --out "$OUT/report.json" > "$OUT/final.txt" 2>&1
# A rerun resumes the study: with every trial done it runs none and prints the summary.
timeout -s INT -k 10 40 python3 -m cleanslate tune "$STUDY" --store "sqlite:///$DB" \
  --gpu-backend nvml > "$OUT/summary.txt" 2>&1
echo "exit $?" >> "$OUT/summary.txt"
timeout -s INT -k 10 40 python3 -m cleanslate tune "$STUDY" --store "sqlite:///$DB" \
  --gpu-backend nvml --json > "$OUT/summary.json" 2>> "$OUT/final.txt"
cp "$DB" "$OUT/stats.db"
{
  stamp final
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv
} >> "$OUT/final.txt" 2>&1
stamp all done
