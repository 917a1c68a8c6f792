#!/usr/bin/env bash
# A/B of the predict path's CPU: `predict_cpu` of two checkouts, alternating, three times
# each, into OUT/{base,new}-{1,2,3}.txt with the load in OUT/log. Compare the medians of
# "cloud-api serve" and their distance to "naive (serial)" (the same process's baseline).
#   bash bench/predict_ab.sh BASE_CHECKOUT NEW_CHECKOUT WORK_DIR OUT_DIR
set -euo pipefail
BASE=$(realpath "$1"); NEW=$(realpath "$2"); WORK=$3; OUT=$4
mkdir -p "$OUT"
run() {  # a checkout older than bench/ as a package runs the file
    local tree=$1
    if grep -q "sys.path" "$tree/bench/predict_cpu.py"; then
        (cd "$tree" && PYTHONPATH=$tree python bench/predict_cpu.py --work "$WORK")
    else
        (cd "$tree" && PYTHONPATH=$tree python -m bench.predict_cpu --work "$WORK")
    fi
}
for i in 1 2 3; do
    for side in base new; do
        tree=$BASE; [ "$side" = new ] && tree=$NEW
        echo "== $side $i $(date +%T) $(uptime)" >> "$OUT/log"
        run "$tree" > "$OUT/$side-$i.txt" 2>&1
    done
done
echo "== done $(date +%T) $(uptime)" >> "$OUT/log"
grep -H -E "^\| (1|32) +\| (cloud-api serve|naive \(serial\))" "$OUT"/base-*.txt "$OUT"/new-*.txt
