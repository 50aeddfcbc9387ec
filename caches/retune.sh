#!/usr/bin/env bash
# Rebuild caches/nvidia-h200.json on the device the file is for (docs/cache.md), in stages of under
# ten minutes each (the device tool's limit per command):
#
#   caches/retune.sh 27b DB      the 27B-class bf16 and fp8 keys at 16 candidates into a scratch
#                                store, their int4 keys at 20 into DB (a 16-candidate pick leaves
#                                int4 at M=64 9% slower; buckets 2 and 4 over their whole spaces),
#                                the first imported into DB
#   caches/retune.sh minilm DB   the built-in MiniLM router's keys at 4 candidates (its dense fp32
#                                keys at 8) into DB, then DB exported to caches/nvidia-h200.json
#                                (OUT_JSON to write elsewhere)
#   caches/retune.sh retime DB   after an edit that stales every key but changes few compiled
#                                kernels (a module every template hashes): each key's tile in the
#                                file against the template's default, checked and timed anew, the
#                                faster into DB, DB exported (648 keys: about 10 minutes on the H200;
#                                run it again, it resumes)
#   caches/retune.sh stale DB    after a kernel edit, in one stage: the file (FROM_JSON, default the
#                                file rebuilt) imported into DB, the entries whose kernel source
#                                changed pruned, only the keys left without a tile tuned (vsr-tune
#                                skips recorded ones) at the counts above, DB exported (int4's 280
#                                keys: about 400 s on the H200; an edit that stales every key can
#                                take more than ten minutes: run it again, it resumes)
#   caches/retune.sh steady DB   the 27B-class keys of 256 rows and more (STEADY_BUCKETS) re-tuned
#                                with the tuner's steady-state timing from rest into a scratch
#                                store at the counts above, then
#                                the file (FROM_JSON, default the file rebuilt) imported into DB and
#                                the scratch store over it (its tiles preferred), DB exported: a
#                                re-timing of unchanged kernels, which `stale` would not tune
#   caches/retune.sh wgmma DB    int4's 27B-class and Qwen3.5 keys at 64-2,048 rows (WGMMA_BUCKETS;
#                                WGMMA_SHAPES=27b for the Qwen3 keys alone)
#                                over the wgmma path's whole space (the RS form's tiles included)
#                                into a scratch store, each key's tile in the file joining its
#                                sweep; then as `steady`: the file imported into DB, the scratch
#                                store over it, DB exported (a space that gained wgmma tiles; run it
#                                again if cut short, it resumes)
#
# Every stage passes vsr-tune --incumbents the file it rebuilds (OUT_JSON, default
# caches/nvidia-h200.json; INCUMBENTS to name other files, space-separated, or none with ""): the
# tile a key had joins that key's candidate pick, so a re-tune cannot lose it.
#
# VSR_TUNE: the vsr-tune command (default vsr-tune; "python -m vsr.cli.tune" where the sources are
# on PYTHONPATH but not installed, as on the device tool). The tuner writes each key as it is tuned, so a
# stage cut short keeps what it finished; run it again and it resumes. A stage that finishes removes
# its scratch store (the tuner skips the keys a store holds, so a later run of the stage would
# otherwise import that run's picks again); give each new run a new DB, since importing the
# file into a DB that already holds other tiles for its keys stops on the conflicts.
set -euo pipefail

stage=${1:?usage: caches/retune.sh 27b|minilm|stale|retime|steady|wgmma DB}
db=${2:?usage: caches/retune.sh 27b|minilm|stale|retime|steady|wgmma DB}
tune=${VSR_TUNE:-vsr-tune}
out=${OUT_JSON:-$(dirname "$0")/nvidia-h200.json}   # beside this script, wherever it is run from
# OUT_JSON missing is a first build: no incumbents; a file that INCUMBENTS names (split on blanks,
# no glob) and that is missing is a mistake.
if [ -n "${INCUMBENTS+set}" ]; then
  read -r -a names <<< "$INCUMBENTS"
else
  names=("$out")
fi
inc=()
for f in ${names[@]+"${names[@]}"}; do
  if [ -e "$f" ]; then
    inc+=(--incumbents "$f")
  elif [ -n "${INCUMBENTS+set}" ]; then
    echo "caches/retune.sh: INCUMBENTS names '$f', which does not exist" >&2
    exit 2
  fi
done

# Each pass once, for the stages to share: the store to tune into is the argument (then, for the
# dense pass, any further vsr-tune options).
tune_27b_dense() { $tune 27b --autotune-cache "$1" --formats bf16,fp8 --max-candidates 16 ${inc[@]+"${inc[@]}"} "${@:2}"; }
# The 20-tile pick of the int4 keys (then, as for the dense pass, any further vsr-tune options).
tune_27b_int4_pick() {
  $tune 27b --autotune-cache "$1" --formats int4-gptq,int4-awq --max-candidates 20 ${inc[@]+"${inc[@]}"} "${@:2}"
}
# Buckets 2 and 4 of the int4 keys over their whole spaces first (16 keys, 78 s on the H200): the
# 20-tile pick there can miss the X_ROW tiles that win at bucket 2 (docs/cache.md).
tune_27b_int4() {
  $tune 27b --autotune-cache "$1" --formats int4-gptq,int4-awq --buckets 2,4
  tune_27b_int4_pick "$1"
}
# A scratch store and what SQLite and its lock leave beside it, once its tiles are imported.
drop_store() { rm -rf -- "$1" "$1-wal" "$1-shm" "$1.lock" "$1.locks"; }
# The MiniLM keys at 4 candidates, its dense fp32 keys (the built-in router's own products) at 8.
tune_minilm() {
  $tune minilm --autotune-cache "$1" --max-candidates 8 ${inc[@]+"${inc[@]}"} --formats fp32
  $tune minilm --autotune-cache "$1" --max-candidates 4 ${inc[@]+"${inc[@]}"} \
    --formats bf16,fp8,fp8@fp32,int4-gptq,int4-awq,int4-gptq@fp32,int4-awq@fp32
}
# Every key of the file at one candidate: the template's default, joined by the key's tile in the
# file (its incumbent), each checked and timed anew; the faster ships.
retime_all() {
  $tune 27b --autotune-cache "$1" --formats bf16,fp8,int4-gptq,int4-awq --max-candidates 1 ${inc[@]+"${inc[@]}"}
  $tune 27b-hybrid --autotune-cache "$1" --buckets 128,1024 --formats bf16,fp8,int4-gptq,int4-awq \
    --max-candidates 1 ${inc[@]+"${inc[@]}"}
  $tune minilm --autotune-cache "$1" --max-candidates 1 ${inc[@]+"${inc[@]}"} \
    --formats bf16,fp32,fp8,fp8@fp32,int4-gptq,int4-awq,int4-gptq@fp32,int4-awq@fp32
}

# The file (FROM_JSON, default the file rebuilt) imported into DB, scratch store $1 over it (its
# tiles preferred), DB exported, $1 dropped: the end of the steady and wgmma stages.
file_then_scratch() {
  $tune import "${FROM_JSON:-$out}" --autotune-cache "$db"
  $tune import "$1" --autotune-cache "$db" --prefer-incoming
  $tune export --autotune-cache "$db" --out "$out"
  drop_store "$1"
}

case "$stage" in
  27b)
    scratch="${db%.db}.27b-16.db"   # a .db name: ignored by git, as DB is
    tune_27b_dense "$scratch"
    tune_27b_int4 "$db"
    $tune import "$scratch" --autotune-cache "$db"
    drop_store "$scratch"
    ;;
  minilm)
    tune_minilm "$db"
    $tune export --autotune-cache "$db" --out "$out"
    ;;
  stale)
    $tune import "${FROM_JSON:-$out}" --autotune-cache "$db"
    $tune prune --autotune-cache "$db"
    tune_27b_dense "$db"
    tune_27b_int4 "$db"
    tune_minilm "$db"
    $tune export --autotune-cache "$db" --out "$out"
    ;;
  retime)
    retime_all "$db"
    $tune export --autotune-cache "$db" --out "$out"
    ;;
  steady)
    # autotune/buckets.py's ROW_BUCKETS from tuner.STEADY_FROM_BUCKET (tests/test_autotune_cli.py checks)
    buckets=${STEADY_BUCKETS:-256,512,1024,2048,4096,8192}
    scratch="${db%.db}.steady.db"
    tune_27b_dense "$scratch" --buckets "$buckets"
    tune_27b_int4_pick "$scratch" --buckets "$buckets"
    file_then_scratch "$scratch"
    ;;
  wgmma)
    buckets=${WGMMA_BUCKETS:-64,128,256,1024,2048}
    scratch="${db%.db}.wgmma.db"
    for shapes in ${WGMMA_SHAPES:-27b 27b-hybrid}; do
      $tune "$shapes" --autotune-cache "$scratch" --formats int4-gptq,int4-awq --buckets "$buckets" --paths wgmma \
        ${inc[@]+"${inc[@]}"}
    done
    file_then_scratch "$scratch"
    ;;
  *)
    echo "caches/retune.sh: unknown stage '$stage' (27b, minilm, stale, retime, steady or wgmma)" >&2
    exit 2
    ;;
esac
