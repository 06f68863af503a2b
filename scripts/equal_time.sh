#!/usr/bin/env bash
# Equal training time: the objectives of scripts/aloha_recipe.sh side by side on ALOHA (transfer cube
# by default), each trained for the same budget of training minutes on a core of its own, then
# every checkpoint of each evaluated in closed loop; one table and one plot (success against training
# wall time, every arm and training seed on it). Does the video loss still pay when the no-video
# objective gets the steps a joint step's extra cost would buy?
#
#   bash scripts/equal_time.sh [a.b=c ...]                 # extra training overrides, every arm
#   DEMOS=20 TRAIN_MINUTES=60 bash scripts/equal_time.sh   # the 20-demo plot, an hour per run
#   SMOKE=1 bash scripts/equal_time.sh                     # tiny: the recipe's smoke data, 0.1 min per run
#
# The arms (ARMS, default all but the last; each is aloha_recipe.sh with TRAIN_MINUTES and):
#   no_video           OBJECTIVE=no_video (one-frame clips)
#   joint              OBJECTIVE=joint (today's joint step: two backbone passes)
#   one_pass           OBJECTIVE=joint ONE_PASS=1 (the head reads the video-loss pass)
#   every_k            OBJECTIVE=joint VIDEO_EVERY=$VIDEO_EVERY (the video loss every k-th step)
#   one_pass_every_k   both
#   video_first        OBJECTIVE=joint VIDEO_SPAN=0-$VIDEO_SWITCH (the video loss in the training's first part)
#   video_last         OBJECTIVE=joint VIDEO_SPAN=$VIDEO_SWITCH-1 (the video loss in its last part)
# Settings (each checked before anything runs; a bad one is one line, exit code 2):
#   DEMOS (50)          expert demos (the same for every arm), as the recipe's
#   TRAIN_MINUTES (30)  each run's budget of training minutes (a decimal number): start-up, the
#                       data and cache building, evaluations and saves are not counted (the recipe's
#                       TRAIN_MINUTES, the trainer's trainer.max_train_time_s); a checkpoint every third.
#                       Each run's LR schedule runs on training time (the recipe sets
#                       trainer.lr_schedule_clock=train_time): every arm anneals by its budget's end,
#                       whatever its steps cost; STEPS only bounds the runs. With the budget in CPU
#                       time (trainer.train_time_clock=process_cpu) compare the arms of one run only: a
#                       step's CPU time grows with the host's load (docs/simulation.md, "Equal training time")
#   EPISODES (100)      closed-loop episodes per checkpoint, on unseen seeds 0..EPISODES-1
#   INTERMEDIATE_EPISODES (EPISODES) episodes for each checkpoint before a run's last (seeds
#                       0..M-1): the plot's earlier points at a fraction of the cost; the headline
#                       (each run's last checkpoint) keeps EPISODES
#   TRAIN_SEEDS ("42 43") the training seeds, each a run of every arm (the headline pools them)
#   VIDEO_EVERY (4)     k of the every_k arms (>= 2; only with such an arm)
#   VIDEO_SWITCH (0.5)  the share of the training where video_first's video loss stops and
#                       video_last's starts (0 < VIDEO_SWITCH < 1; only with such an arm)
#   CORES (every CPU this process may use) one run per core at a time (taskset, OMP_NUM_THREADS=1);
#                       with fewer cores than runs the runs go in waves of len(CORES), each still on a
#                       core of its own. SMOKE=1 runs them all at once, sharing the cores round-robin
#                       (it checks the commands, not the numbers)
#   OUT                 where the table, the plot and the logs go (default RUN_ROOT/equal_time_...)
#   SMOKE=1             the recipe's SMOKE data (1 demo at 32x48, one 16-step episode per
#                       checkpoint), TRAIN_MINUTES 0.1, one training seed; DEMOS and EPISODES refused
#   PY, TASK, VAE, BACKPROP, VIDEO_WEIGHT, STEPS, DATA_ROOT: passed to the recipe (VIDEO_WEIGHT to the
#                       joint arms only); OBJECTIVE, ONE_PASS, VIDEO_SPAN, RUN_ID, WORKERS, PREPARE_ONLY, ENCODE_RANKS
#                       are this script's to set per arm and refused from the caller
#
# Stages: (1) every arm's data, one run after the other (aloha_recipe.sh PREPARE_ONLY=1: its checks,
# the demos, statistics and latent caches, timed apart: the table lists them beside the training
# time; the demos simulated and each cache encoded by a process per core of CORES, the recipe's WORKERS
# and ENCODE_RANKS); (2) the runs side
# by side, each the whole recipe on its core (train for the budget, then its closed-loop eval); (3)
# python -m dit4dit_npu.train.success_curve over every run (--x time: reads the evaluations kept in
# each run) -> OUT/success_vs_time.png, OUT/checkpoints.md; OUT/table.md holds
# the time accounting, the runs and the headline (each arm's last checkpoint, pooled over seeds).
# Times: docs/simulation.md ("Equal training time").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
refuse() { echo "error: $*" >&2; exit 2; }
positive() { case "${!1}" in ''|0*|*[!0-9]*) refuse "$1=${!1}: expected a positive integer${2:-}" ;; esac; }
unread() { if [ -n "${!1+x}" ]; then refuse "$1=${!1}: $2"; fi; }
for v in OBJECTIVE ONE_PASS VIDEO_SPAN RUN_ID WORKERS PREPARE_ONLY; do
    unread "$v" "set by scripts/equal_time.sh for each arm (choose the arms with ARMS)"
done
unread ENCODE_RANKS "set by scripts/equal_time.sh from CORES (a rank per core encodes each latent cache)"
SMOKE="${SMOKE-0}"
case "$SMOKE" in 0|1) ;; *) refuse "SMOKE=$SMOKE: expected 0 or 1" ;; esac
PY="${PY-.venv/bin/python}"
if ! command -v "$PY" >/dev/null; then refuse "PY=$PY: expected a Python executable (the project's .venv/bin/python)"; fi
if ! command -v taskset >/dev/null; then refuse "taskset not found: it pins each run to its core (util-linux)"; fi
TASK="${TASK-transfer_cube}"
case "$TASK" in transfer_cube) TASK_TAG="" ;; insertion) TASK_TAG="_insertion" ;;
    *) refuse "TASK=$TASK: expected transfer_cube or insertion" ;; esac
ARMS="${ARMS-no_video joint one_pass every_k}"
read -r -a ARM_LIST <<< "$ARMS"
ALL_ARMS="no_video joint one_pass every_k one_pass_every_k video_first video_last"
if [ "${#ARM_LIST[@]}" = 0 ]; then refuse "ARMS=$ARMS: expected arms among $ALL_ARMS"; fi
EVERY_ARM=0 SWITCH_ARM=0
for a in "${ARM_LIST[@]}"; do
    case "$a" in no_video|joint|one_pass) ;; every_k|one_pass_every_k) EVERY_ARM=1 ;; video_first|video_last) SWITCH_ARM=1 ;;
        *) refuse "ARMS=$ARMS: unknown arm '$a' (expected among $ALL_ARMS)" ;; esac
done
if [ "$(printf '%s\n' "${ARM_LIST[@]}" | sort | uniq -d)" ]; then refuse "ARMS=$ARMS: an arm named twice"; fi
if [ "$EVERY_ARM" = 1 ]; then
    VIDEO_EVERY="${VIDEO_EVERY-4}"
    positive VIDEO_EVERY " >= 2 (1 is the joint arm)"
    if [ "$VIDEO_EVERY" = 1 ]; then refuse "VIDEO_EVERY=1: expected >= 2 (1 is the joint arm)"; fi
else
    unread VIDEO_EVERY "applies only with an every_k or one_pass_every_k arm in ARMS"
fi
if [ "$SWITCH_ARM" = 1 ]; then
    VIDEO_SWITCH="${VIDEO_SWITCH-0.5}"
    if ! [[ "$VIDEO_SWITCH" =~ ^(0?[.][0-9]*[1-9][0-9]*)$ ]]; then
        refuse "VIDEO_SWITCH=$VIDEO_SWITCH: expected a share of the training between 0 and 1 (e.g. 0.5)"
    fi
else
    unread VIDEO_SWITCH "applies only with a video_first or video_last arm in ARMS"
fi
if [ "$SMOKE" = 1 ]; then
    for v in DEMOS EPISODES INTERMEDIATE_EPISODES; do unread "$v" "SMOKE=1 sets its own (1 demo, one 16-step episode per checkpoint)"; done
    TRAIN_MINUTES="${TRAIN_MINUTES-0.1}" TRAIN_SEEDS="${TRAIN_SEEDS-42}" EPISODES=1 EPISODE_STEPS=16 TAG=smoke
else
    DEMOS="${DEMOS-50}" EPISODES="${EPISODES-100}" TRAIN_MINUTES="${TRAIN_MINUTES-30}"
    TRAIN_SEEDS="${TRAIN_SEEDS-42 43}" EPISODE_STEPS=400
    positive DEMOS
    positive EPISODES
    # the recipe's own bound, said here before the data preparation (and not as a complaint about
    # INTERMEDIATE_EPISODES, which defaults to EPISODES): eval seeds 0..EPISODES-1 < 2**32
    if [ "${#EPISODES}" -gt 10 ] || [ "$EPISODES" -gt 4294967296 ]; then
        refuse "EPISODES=$EPISODES: expected at most 2**32 (eval seeds 0..EPISODES-1 < 2**32, the simulator's range)"
    fi
    INTERMEDIATE_EPISODES="${INTERMEDIATE_EPISODES-$EPISODES}"
    positive INTERMEDIATE_EPISODES
    if [ "${#INTERMEDIATE_EPISODES}" -gt 10 ] || [ "$INTERMEDIATE_EPISODES" -gt "$EPISODES" ]; then
        refuse "INTERMEDIATE_EPISODES=$INTERMEDIATE_EPISODES: expected at most EPISODES=$EPISODES (the earlier checkpoints' episodes)"
    fi
    TAG="${DEMOS}demos_${TRAIN_MINUTES}min"
fi
if ! [[ "$TRAIN_MINUTES" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] \
    || ! awk -v v="$TRAIN_MINUTES" 'BEGIN { exit !(v + 0 > 0 && v + 0 < 1e9) }'; then
    refuse "TRAIN_MINUTES=$TRAIN_MINUTES: expected a number of training minutes > 0 (e.g. 60 or 0.5)"
fi
read -r -a SEED_LIST <<< "$TRAIN_SEEDS"
if [ "${#SEED_LIST[@]}" = 0 ]; then refuse "TRAIN_SEEDS=$TRAIN_SEEDS: expected training seeds (e.g. \"42 43\")"; fi
for s in "${SEED_LIST[@]}"; do
    case "$s" in 0) ;; ''|0*|*[!0-9]*) refuse "TRAIN_SEEDS=$TRAIN_SEEDS: '$s' is not a seed (a whole number >= 0)" ;; esac
done
if [ "$(printf '%s\n' "${SEED_LIST[@]}" | sort | uniq -d)" ]; then refuse "TRAIN_SEEDS=$TRAIN_SEEDS: a seed named twice"; fi
CORES="${CORES-$(taskset -cp $$ | sed 's/.*: //' | tr ',' '\n' | awk -F- '{ for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c }' | paste -sd' ')}"
read -r -a CORE_LIST <<< "$CORES"
if [ "${#CORE_LIST[@]}" = 0 ]; then refuse "CORES=$CORES: expected CPU numbers (e.g. \"0 1 2 3\")"; fi
for c in "${CORE_LIST[@]}"; do
    case "$c" in 0) ;; ''|0*|*[!0-9]*) refuse "CORES=$CORES: '$c' is not a CPU number" ;; esac
    if ! taskset -c "$c" true 2>/dev/null; then refuse "CORES=$CORES: CPU $c is not one this process may run on"; fi
done
if [ "$(printf '%s\n' "${CORE_LIST[@]}" | sort | uniq -d)" ]; then refuse "CORES=$CORES: a CPU named twice"; fi
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PY TASK
# The run folders' root, as the recipe's runs resolve it (the extra overrides may move it). Loading
# the config checks the overrides' keys and values too (a second, no torch); the first arm's recipe
# then checks its whole run (the model build included) before it makes anything.
CONFIG="configs/aloha/dit4dit_aloha_${TASK}_tiny.yaml"
if ! RUN_ROOT="$($PY -c '
import sys
from dit4dit_npu.config import ConfigError, load_config
try:
    print(load_config(sys.argv[1], sys.argv[2:]).run_root_dir)
except ConfigError as e:
    sys.exit(f"{e}")' "$CONFIG" "$@" 2>&1)"; then
    refuse "the extra overrides: $(printf '%s' "$RUN_ROOT" | tail -n 1)"
fi
if [ -n "${OUT+x}" ] && [ -z "$OUT" ]; then refuse "OUT=: expected a folder for the table, the plot and the logs (unset it for the default)"; fi
OUT="${OUT-$RUN_ROOT/equal_time${TASK_TAG}_$TAG}"
mkdir -p "$OUT/logs"

arm_env() {  # $1: the arm -> the recipe's settings for it, one per line
    echo "TRAIN_MINUTES=$TRAIN_MINUTES"
    if [ "$SMOKE" = 1 ]; then echo SMOKE=1; else echo "DEMOS=$DEMOS"; fi
    case "$1" in
        no_video) echo OBJECTIVE=no_video ;;
        joint) echo OBJECTIVE=joint ;;
        one_pass) printf '%s\n' OBJECTIVE=joint ONE_PASS=1 ;;
        every_k) printf '%s\n' OBJECTIVE=joint "VIDEO_EVERY=$VIDEO_EVERY" ;;
        one_pass_every_k) printf '%s\n' OBJECTIVE=joint ONE_PASS=1 "VIDEO_EVERY=$VIDEO_EVERY" ;;
        video_first) printf '%s\n' OBJECTIVE=joint "VIDEO_SPAN=0-$VIDEO_SWITCH" ;;
        video_last) printf '%s\n' OBJECTIVE=joint "VIDEO_SPAN=$VIDEO_SWITCH-1" ;;
    esac
}
recipe_cmd() {  # $1: arm, $2: seed, then the recipe's extra settings (NAME=value) -> CMD, its command
    local arm="$1" seed="$2"
    shift 2
    CMD=(env -u VIDEO_EVERY -u EPISODES -u INTERMEDIATE_EPISODES)  # the arm's own, from arm_env (the EPISODES: the runs' only, never a preparation's); VIDEO_WEIGHT only to the joint arms
    if [ "$arm" = no_video ]; then CMD+=(-u VIDEO_WEIGHT); fi
    CMD+=($(arm_env "$arm") "RUN_ID=$(run_id "$arm" "$seed")" "$@"
          bash scripts/aloha_recipe.sh "seed=$seed" "${EXTRA_OVERRIDES[@]}")
}
name() {  # $1: arm -> its name in runs, logs and labels: its VIDEO_EVERY or VIDEO_SWITCH after it when
          # not the default (another setting is another run, never a resume of the first)
    local v=""
    case "$1" in
        every_k|one_pass_every_k) if [ "$VIDEO_EVERY" != 4 ]; then v="$VIDEO_EVERY"; fi ;;
        video_first|video_last) if ! awk -v s="$VIDEO_SWITCH" 'BEGIN { exit !(s + 0 == 0.5) }'; then v="$VIDEO_SWITCH"; fi ;;
    esac
    echo "$1$v"
}
run_id() { echo "equal_time${TASK_TAG}_${TAG}_$(name "$1")_seed$2"; }
cache_kind() { if [ "$1" = no_video ]; then echo "1-frame clips (no_video)"; else echo "5-frame clips (the joint arms)"; fi; }
EXTRA_OVERRIDES=("$@")
stage() { echo "== $(date +%H:%M:%S) $*"; }

# (1) Every arm's data, one after the other (two runs building one cache at once would race). The
# seed decides the held-out episodes, hence what each cache holds: prepared per seed. SMOKE=1
# prepares one arm per cache (the others check their config when they start).
DEMOS_S=0
declare -A CACHE_S=()
declare -A PREPARED=()
for seed in "${SEED_LIST[@]}"; do
    for arm in "${ARM_LIST[@]}"; do
        kind="$(cache_kind "$arm")"
        if [ "$SMOKE" = 1 ] && [ -n "${PREPARED[$kind/$seed]+x}" ]; then continue; fi
        PREPARED[$kind/$seed]=1
        log="$OUT/logs/prepare_$(name "$arm")_seed$seed.log"
        stage "data of $arm (seed $seed): $log"
        recipe_cmd "$arm" "$seed" PREPARE_ONLY=1 "WORKERS=${#CORE_LIST[@]}" "ENCODE_RANKS=${#CORE_LIST[@]}"
        # on CORES: its demo workers and encode's ranks (and the recipe's count of the CPUs it may use) are theirs
        if ! taskset -c "$(IFS=,; echo "${CORE_LIST[*]}")" "${CMD[@]}" > "$log" 2>&1; then
            refuse "$arm (seed $seed), preparing its data: $(tail -n 1 "$log" | sed 's/^error: //') (log: $log)"
        fi
        d="" c=""
        read -r d c < <(tail -n 1 "$log" | sed -n 's/^prepared in seconds: demos \([0-9]*\), cache \([0-9]*\)$/\1 \2/p') || true
        if [ -z "$c" ]; then refuse "$arm (seed $seed): the recipe did not say what preparing took (log: $log)"; fi
        DEMOS_S=$((DEMOS_S + d)) CACHE_S[$kind]=$((${CACHE_S[$kind]:-0} + c))
    done
done

# (2) The runs side by side: one core each, in waves of len(CORES) (SMOKE=1: all at once).
JOBS=()
for seed in "${SEED_LIST[@]}"; do for arm in "${ARM_LIST[@]}"; do JOBS+=("$arm/$seed"); done; done
WAVE="${#CORE_LIST[@]}"
if [ "$SMOKE" = 1 ]; then WAVE="${#JOBS[@]}"; fi
declare -A CORE_OF=()
for ((i = 0; i < ${#JOBS[@]}; i += WAVE)); do
    pids=()
    for ((j = i; j < i + WAVE && j < ${#JOBS[@]}; j++)); do
        arm="${JOBS[$j]%/*}" seed="${JOBS[$j]#*/}" core="${CORE_LIST[$(((j - i) % ${#CORE_LIST[@]}))]}"
        CORE_OF[${JOBS[$j]}]=$core
        log="$OUT/logs/$(name "$arm")_seed$seed.log"
        stage "run $arm (seed $seed) on CPU $core: $TRAIN_MINUTES training minutes, then its eval: $log"
        recipe_cmd "$arm" "$seed" WORKERS=1 $([ "$SMOKE" = 1 ] || echo "EPISODES=$EPISODES INTERMEDIATE_EPISODES=$INTERMEDIATE_EPISODES")
        ( t=$SECONDS; status=0; taskset -c "$core" "${CMD[@]}" > "$log" 2>&1 || status=$?
          echo $((SECONDS - t)) > "$OUT/logs/$(name "$arm")_seed$seed.wall_s"; exit "$status" ) &
        pids+=($!)
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    for ((j = i; j < i + WAVE && j < ${#JOBS[@]}; j++)); do
        arm="${JOBS[$j]%/*}" seed="${JOBS[$j]#*/}"
        log="$OUT/logs/$(name "$arm")_seed$seed.log"
        if ! grep -q '^success ' <(tail -n 1 "$log"); then
            echo "error: $arm (seed $seed) failed: $(tail -n 1 "$log") (log: $log)" >&2
            failed=1
        fi
    done
    if [ "$failed" = 1 ]; then exit 1; fi
done

# (3) One plot and one table over every run (their evaluations are kept in each run: read, not redone).
CURVE=(--task "$TASK" --episodes "$EPISODES" --seed 0 --max-steps "$EPISODE_STEPS" --x time
       $([ "$SMOKE" = 1 ] || echo "--intermediate-episodes $INTERMEDIATE_EPISODES")
       --out "$OUT/success_vs_time.png" --table "$OUT/checkpoints.md")
for job in "${JOBS[@]}"; do
    CURVE+=(--run "$RUN_ROOT/$(run_id "${job%/*}" "${job#*/}")" --label "$(name "${job%/*}") seed${job#*/}")
done
stage "success against training time: $OUT/success_vs_time.png"
$PY -m dit4dit_npu.train.success_curve "${CURVE[@]}" > "$OUT/logs/success_curve.log" 2>&1 \
    || refuse "the success curve: $(tail -n 1 "$OUT/logs/success_curve.log") (log: $OUT/logs/success_curve.log)"
{
    echo "# Equal training time: ALOHA ${TASK/_/ }, $([ "$SMOKE" = 1 ] && echo "SMOKE=1" || echo "$DEMOS demos"), $TRAIN_MINUTES training minutes per run"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), load average $(cut -d' ' -f1-3 /proc/loadavg): SMOKE=$SMOKE ARMS=\"$ARMS\" TRAIN_SEEDS=\"$TRAIN_SEEDS\" CORES=\"$CORES\" bash scripts/equal_time.sh ${EXTRA_OVERRIDES[*]}"
    echo
    echo "| not training time (each once, before the runs) | seconds |"
    echo "| --- | ---: |"
    echo "| demos and latent statistics | $DEMOS_S |"
    for kind in "${!CACHE_S[@]}"; do echo "| latent cache, $kind | ${CACHE_S[$kind]} |"; done
    echo
    echo "| arm | training seed | CPU | steps | training min | run wall min (start-up, training, saves, evals) | last checkpoint's success |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
    for job in "${JOBS[@]}"; do
        arm="${job%/*}" seed="${job#*/}"
        last="$(grep "^| $(name "$arm") seed$seed |" "$OUT/checkpoints.md" | tail -n 1)"
        IFS='|' read -r _ _ step mins success _ <<< "$last"
        wall="$(awk -v s="$(cat "$OUT/logs/$(name "$arm")_seed$seed.wall_s")" 'BEGIN { printf "%.1f", s / 60 }')"
        success="${success# }"
        echo "| $(name "$arm") | $seed | ${CORE_OF[$job]} | ${step// /} | ${mins// /} | $wall | ${success% } |"
    done
    echo
    echo "Headline: each arm's last checkpoint, its episodes pooled over the training seeds (95% Wilson CI)."
    echo
    echo "| arm | success | 95% Wilson CI |"
    echo "| --- | ---: | ---: |"
    for arm in "${ARM_LIST[@]}"; do
        k=0 n=0
        for seed in "${SEED_LIST[@]}"; do
            kn="$(grep "^| $(name "$arm") seed$seed |" "$OUT/checkpoints.md" | tail -n 1 | cut -d'|' -f5 | sed 's/ = .*//; s/ //g')"
            k=$((k + ${kn%/*})) n=$((n + ${kn#*/}))
        done
        awk -v k="$k" -v n="$n" -v arm="$(name "$arm")" 'BEGIN {
            z = 1.959964; p = k / n; d = 1 + z * z / n; c = (p + z * z / (2 * n)) / d
            h = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
            lo = (k == 0) ? 0 : c - h; hi = (k == n) ? 1 : c + h
            printf "| %s | %d/%d = %.1f%% | %.1f-%.1f%% |\n", arm, k, n, 100 * p, 100 * lo, 100 * hi }'
    done
    echo
    echo "Every checkpoint (python -m dit4dit_npu.train.success_curve ... --x time, $OUT/logs/success_curve.log):"
    echo
    cat "$OUT/checkpoints.md"
} > "$OUT/table.md"
sed -n '/^Headline/,/^Every checkpoint/p' "$OUT/table.md" | sed '$d'
echo "table -> $OUT/table.md, plot -> $OUT/success_vs_time.png"
