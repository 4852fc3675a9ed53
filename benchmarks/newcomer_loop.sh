#!/usr/bin/env bash
# The operator loop of docs/validation/newcomer-loop.md (issue 38 "Must show"), by hand: serve a
# tiny random-weight Llama (cleanslate.testing.tiny_model.build_tiny_llama, built into $LOOP_DIR/tiny-llama
# first) with transformers serve on CPU, bench it by its run ID, kill -9 the supervisor, check,
# clean --run, runs, report. Each command timed, with its exit code.
cd "${LOOP_DIR:-/tmp/loop}"
rm -f cleanslate.db; rm -rf artifacts
t() { local s=$(date +%s.%N); "$@"; local rc=$?; local e=$(date +%s.%N); printf '== exit %s in %.1f s: %s\n' "$rc" "$(echo "$e - $s" | bc)" "$*"; return $rc; }
t cleanslate serve --engine transformers --model "${LOOP_DIR:-/tmp/loop}/tiny-llama" --detach -- --device cpu --dtype float32 2>&1 | tee serve.out
ID=$(grep -o 'cleanslate stop r-[0-9a-f-]*' serve.out | head -1 | awk '{print $3}')
echo "run id: $ID"
t cleanslate bench --run "$ID" 2>&1 | tee bench.out
BID=$(grep -o 'bench recorded: [^ ]*' bench.out | awk '{print $3}')
echo "bench id: $BID"
SUP=$(python3 -c "from cleanslate.store import Store; print(Store('sqlite:///cleanslate.db', create=False).get_run('$ID').supervisor_pid)")
echo "supervisor pid: $SUP"
[ -n "$SUP" ] && kill -9 "$SUP"
sleep 1
t cleanslate check 2>&1 | tail -15
t cleanslate clean --run "$ID" 2>&1 | tail -15
t cleanslate check 2>&1 | tail -5
t cleanslate runs 2>&1
t cleanslate report "$BID" --html bench.html --png png 2>&1 | tail -30
