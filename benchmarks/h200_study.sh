#!/usr/bin/env bash
# Drive the H200 validation (issue 9) on the GPU machine, from the repository root there:
#   bash benchmarks/h200_study.sh            # env, GPU tests, model, study (until DEADLINE_S)
#   PHASES="model tune tests" bash benchmarks/h200_study.sh   # phases run in the order given
# Needs: wheels in .whl/h200/ (the packages the machine lacks, see docs/validation/
# h200-transformers.md), cleanslate's source in $CS_SRC (default: src). Writes to $OUT (default
# ./out): env.txt, gpu_tests.log, gpu_tests.jsonl, tune.log, h200.db, artifacts.tgz, final.txt.
# The store starts from $STORE_IN when that file exists (a store carried from an earlier run).
set -u
START=$(date +%s)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PHASES=${PHASES:-"env tests model tune"}
DEADLINE_S=${DEADLINE_S:-520}          # send SIGINT to tune this many seconds after START
CS_SRC=${CS_SRC:-src}
MODEL=${MODEL:-/tmp/tiny-llama-0.8b}
STORE_IN=${STORE_IN:-.whl/state/h200.db}
WORK=/tmp/cs-h200
stamp() { echo "== $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s $*"; }

# Install into a fresh folder (pip --target keeps stale files in an existing one).
if [ ! -f /tmp/site/.cs-h200 ]; then
  rm -rf /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/h200/*.whl || exit 1
  touch /tmp/site/.cs-h200
fi
export PYTHONPATH=/tmp/site:$PWD/$CS_SRC PYTHONUNBUFFERED=1
PYBIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
command -v transformers >/dev/null || export PATH=$PYBIN:$PATH
python3 -c "import cleanslate.cli, optuna, sqlalchemy, fastapi, uvicorn, openai" || exit 1
stamp installed

phase_env() {
  {
    stamp env; date -u; uname -a; nproc
    nvidia-smi
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
    python3 - <<'PY'
import importlib, platform, sys
import torch
print("python", platform.python_version(), sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn",
      torch.backends.cudnn.version(), "devices", torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
for name in ("transformers", "tokenizers", "pynvml", "psutil", "aiohttp", "pydantic",
             "fastapi", "uvicorn", "openai", "optuna", "sqlalchemy", "anyio", "httpx"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "not importable:", e)
PY
    echo "transformers CLI: $(command -v transformers)"
    stamp "transformers serve --help"
    COLUMNS=160 timeout 120 transformers serve --help
    stamp "cleanslate check --gpu-backend nvml --json"
    python3 -m cleanslate check --gpu-backend nvml --json; echo "exit $?"
    stamp "cleanslate check --gpu-backend nvidia-smi --json"
    python3 -m cleanslate check --gpu-backend nvidia-smi --json; echo "exit $?"
  } > "$OUT/env.txt" 2>&1
  stamp env done
}

phase_tests() {
  stamp gpu tests
  CLEANSLATE_GPU_TEST_LOG=$OUT/gpu_tests.jsonl timeout 150 python3 -m pytest -p no:cacheprovider \
    -v -s -m gpu tests/gpu tests/probe/gpu/test_gpu_real.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -30
  stamp gpu tests done
}

phase_model() {
  [ -f "$MODEL/model.safetensors" ] && return 0
  stamp model
  python3 - "$MODEL" <<'PY' || exit 1
import sys, time
t0 = time.time()
from cleanslate.testing.tiny_model import build_tiny_llama
out = build_tiny_llama(sys.argv[1], hidden_size=2048, num_hidden_layers=16,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       intermediate_size=5632, max_position_embeddings=2048)
import json, os
cfg = json.load(open(os.path.join(out, "config.json")))
size = os.path.getsize(os.path.join(out, "model.safetensors"))
print(f"built {out} in {time.time() - t0:.1f} s: vocab {cfg['vocab_size']}, "
      f"{size / 2**30:.2f} GiB of bf16 weights = {size / 2 / 1e9:.3f} B parameters")
PY
  stamp model done
}

phase_tune() {
  mkdir -p "$WORK"
  [ -f "$STORE_IN" ] && [ ! -f "$WORK/h200.db" ] && cp "$STORE_IN" "$WORK/h200.db"
  left=$(( START + DEADLINE_S - $(date +%s) ))
  stamp "tune (SIGINT after ${left}s)"
  timeout -s INT -k 40 "$left" python3 -m cleanslate tune examples/h200-transformers.yaml \
    --store "sqlite:///$WORK/h200.db" --gpu-backend nvml 2>&1 | tee -a "$OUT/tune.log"
  stamp "tune exited ${PIPESTATUS[0]}"
  cp "$WORK/h200.db" "$OUT/h200.db"
  [ -d "$WORK/artifacts" ] && tar -C "$WORK" -czf "$OUT/artifacts.tgz" artifacts
}

for phase in $PHASES; do "phase_$phase" || exit 1; done

{
  stamp final
  nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv
  python3 -m cleanslate check --gpu-backend nvml --json; echo "exit $?"
} > "$OUT/final.txt" 2>&1
stamp all done
