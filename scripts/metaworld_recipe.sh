#!/usr/bin/env bash
# The CPU recipe for Meta-World, judged by lerobot 0.6 (docs/lerobot.md): the metaworld package's
# scripted experts on TASKS (DEMOS per task, seeds 0..DEMOS-1) recorded through lerobot's own env
# (the lean env at SIZE x SIZE; scripts/lerobot06/metaworld_side.py demos) -> the tiny VAE's latent
# statistics on those frames -> latent cache -> one tiny DiT4DiT policy over all the tasks, each
# episode's lerobot task description its instruction (configs/metaworld/dit4dit_metaworld_tiny.yaml),
# for TRAIN_MINUTES minutes of training CPU time -> dit4dit-lerobot-prepare -> lerobot-eval on
# EPISODES episodes per task (lerobot's seeds: 1000.., never a demo's) in the lean env -> the success
# per task with 95% Wilson intervals and the average over the tasks (metaworld_side.py score), then
# the language test. Each stage is skipped when its output is there, so a rerun only redoes what is
# missing. The last line is `average over T task(s): p% (...)`: the right instructions' success.
# POLICY=act or diffusion: lerobot's own policy instead, on the same demos, TRAIN_MINUTES and eval.
#
#   bash scripts/metaworld_recipe.sh [a.b=c ...]       # MT10, no video, 40 training minutes, 20 episodes a task
#   POLICY=act bash scripts/metaworld_recipe.sh [--policy.x=y ...]   # lerobot's ACT beside it (diffusion:
#                                                      # its Diffusion Policy); the flags go to lerobot-train
#   TASKS=easy bash scripts/metaworld_recipe.sh        # lerobot's easy group (any comma list of tasks or groups)
#   OBJECTIVE=joint bash scripts/metaworld_recipe.sh   # 5-frame clips and the video loss (weight VIDEO_WEIGHT)
#   WORKERS=2 bash scripts/metaworld_recipe.sh         # lerobot-eval processes, the tasks dealt out between them
#   SMOKE=1 bash scripts/metaworld_recipe.sh           # the same commands, tiny: reach-v3, 1 demo, 2 steps,
#                                                      # 1 episode, the language test on reach-v3 itself
#
# Settings:
#   POLICY=dit4dit (default)  the policy trained: this project's (the stages above), or lerobot's own
#                      act or diffusion: lerobot-train in the side venv on the same demos (its defaults
#                      but ACT's chunk of 8 steps, all executed, as ours; ResNet18 from scratch: nothing
#                      downloaded; batch 4, as ours; data loading in the trainer's own process, so its
#                      CPU time counts), stopped at TRAIN_MINUTES of its process's CPU time by
#                      scripts/lerobot06/train_budget.py (a checkpoint every 100 steps; the newest one
#                      complete by then is the policy), then the same lerobot-eval and score. No latent
#                      statistics, cache or prepare; no OBJECTIVE, VIDEO_WEIGHT or SWAP (no video loss,
#                      no instruction read: the language test is DiT4DiT's). Extra arguments are
#                      lerobot-train flags (--policy.dim_model=256), after the recipe's: theirs win
#   TASKS=mt10 (default)  Meta-World's MT10 (reach, push, pick-place, door-open, drawer-open,
#                      drawer-close, button-press-topdown, peg-insert-side, window-open, window-close),
#                      or lerobot's names: tasks (reach-v3) and difficulty groups (easy, medium, hard,
#                      very_hard), comma-separated
#   DEMOS=10           expert demos per task (a failed expert episode is left out, and said), at most
#                      1000: lerobot-eval's seeds start there
#   SIZE=128           the camera's square picture, as recorded and as lerobot-eval renders it
#   OBJECTIVE=no_video (default) one-frame clips, the action loss into the backbone (the config's);
#                      joint: the observation and 4 frames up to one action chunk (8 steps) ahead,
#                      the video flow-matching loss on the future latent frame with weight VIDEO_WEIGHT
#                      (default 0.2, the best measured on ALOHA) and the action loss alongside
#   TRAIN_MINUTES=40   training minutes of the process's CPU time (trainer.train_time_clock=
#                      process_cpu: runs that share cores get equal compute), the LR schedule on them,
#                      a checkpoint at the end
#   EPISODES=20        lerobot-eval episodes per task
#   WORKERS=1          lerobot-eval processes
#   SWAP=drawer-open-v3:drawer-close-v3,window-open-v3:window-close-v3 (default: those of the pairs
#                      whose two tasks are in TASKS; given: each must be)  the language test:
#                      lerobot-eval of task A's scene with task B's instruction
#                      (--policy.replace_instruction), EPISODES episodes each, beside A's success under
#                      its own; SWAP= (empty) skips it
#   LEROBOT06_DIR      the lerobot 0.6.1 side venv's folder (default .lerobot06/; built by
#                      scripts/lerobot_check.sh --build-only when missing)
#   DATA_ROOT=data/metaworld, RUN_ID, PY (.venv/bin/python), OMP_NUM_THREADS (1)
#   RUN_ROOT=runs      act/diffusion: the folder of their runs (dit4dit's is the run_root_dir=DIR override)
#
# Every setting is checked before anything runs, the extra training overrides through a --dry-run
# of the run's config: a bad value is one line naming it, exit code 2 (the task names and SWAP's
# against them once the side venv is there: lerobot knows them; act/diffusion's lerobot-train flags by
# lerobot-train, after the demos). Extra overrides make their own run (a hash of them in its name);
# the keys the recipe sets itself are refused as overrides.
# Measured on the project's shared 2-core CPU machine: docs/lerobot.md ("MT10, one policy").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
refuse() { echo "error: $*" >&2; exit 2; }
positive() {  # (at most 9 digits: bash's arithmetic and the seeds stay in range)
    case "${!1}" in ''|0*|*[!0-9]*|??????????*) refuse "$1=${!1}: expected a positive integer below 10**9" ;; esac
}
unread() { if [ -n "${!1+x}" ]; then refuse "$1=${!1}: $2"; fi; }
default() {  # $1: a setting, $2: its default when unset; set but empty is refused, not taken as the default
    if [ -n "${!1+x}" ] && [ -z "${!1}" ]; then refuse "$1=: expected a value (unset it for the default, $2)"; fi
    printf -v "$1" '%s' "${!1-$2}"
}
stage() { echo "[metaworld_recipe] $*" >&2; }

default SMOKE 0
case "$SMOKE" in 0|1) ;; *) refuse "SMOKE=$SMOKE: expected 0 or 1" ;; esac
default POLICY dit4dit
case "$POLICY" in
    dit4dit) unread RUN_ROOT "applies only to POLICY=act or diffusion (DiT4DiT's run folder: the run_root_dir=DIR override)" ;;
    act|diffusion)
        for v in OBJECTIVE VIDEO_WEIGHT; do unread "$v" "POLICY=$POLICY trains no video loss (OBJECTIVE is DiT4DiT's)"; done
        unread SWAP "POLICY=$POLICY reads no instruction (the language test is DiT4DiT's)"
        SWAP= ;;
    *) refuse "POLICY=$POLICY: expected dit4dit, act or diffusion" ;;
esac
MT10=reach-v3,push-v3,pick-place-v3,door-open-v3,drawer-open-v3,drawer-close-v3,button-press-topdown-v3,peg-insert-side-v3,window-open-v3,window-close-v3
if [ "$SMOKE" = 1 ]; then
    for v in TASKS DEMOS TRAIN_MINUTES EPISODES; do unread "$v" "SMOKE=1 sets it (reach-v3, 1 demo, 2 steps, 1 episode)"; done
    TASKS=reach-v3 DEMOS=1 EPISODES=1
fi
default TASKS mt10; default DEMOS 10; default SIZE 128; default EPISODES 20; default WORKERS 1
default OBJECTIVE no_video; default OMP_NUM_THREADS 1
for v in DEMOS SIZE EPISODES WORKERS OMP_NUM_THREADS; do positive "$v"; done
if [ $((SIZE % 16)) != 0 ]; then refuse "SIZE=$SIZE: expected a multiple of 16 (the backbone's patches of the VAE's latents)"; fi
case "$TASKS" in mt10) TASK_LIST="$MT10" TASKS_TAG=mt10 ;; *[!a-z0-9,_-]*|'') refuse "TASKS=$TASKS: expected mt10 or comma-separated Meta-World task names and groups (reach-v3, easy, ...)" ;;
    *) TASK_LIST="$TASKS" TASKS_TAG="$(echo "$TASKS" | tr ',' '+')" ;; esac
case "$OBJECTIVE" in
    no_video) unread VIDEO_WEIGHT "applies only to OBJECTIVE=joint (no_video trains no video loss)"; OBJ=(); VARIANT="" ;;
    joint) default VIDEO_WEIGHT 0.2
        awk -v v="$VIDEO_WEIGHT" 'BEGIN { exit !(v ~ /^[0-9]*\.?[0-9]+$/ && v + 0 > 0) }' \
            || refuse "VIDEO_WEIGHT=$VIDEO_WEIGHT: expected a number > 0 (the video loss's weight, e.g. 0.2)"
        OBJ=("datasets.vla_data.video_delta_indices=[0, 2, 4, 6, 8]" datasets.vla_data.action_video_freq_ratio=1
             "trainer.loss_scale.future_video=$VIDEO_WEIGHT")
        VARIANT="_joint_vw$VIDEO_WEIGHT" ;;
    *) refuse "OBJECTIVE=$OBJECTIVE: expected no_video or joint" ;;
esac
if [ "$SMOKE" = 1 ]; then
    SCHEDULE=(trainer.max_train_steps=2 trainer.save_interval=2 trainer.eval_interval=1000 trainer.eval_samples=0)
    # lerobot-train's 2 steps end by themselves long before this cap (a checkpoint after each)
    SECS=1800 LR_SCHEDULE=(--steps=2 --save_freq=1 --log_freq=1)
else
    default TRAIN_MINUTES 40
    awk -v m="$TRAIN_MINUTES" 'BEGIN { exit !(m ~ /^[0-9]*\.?[0-9]+$/ && m + 0 > 0) }' \
        || refuse "TRAIN_MINUTES=$TRAIN_MINUTES: expected a number of minutes > 0"
    SECS="$(awk -v m="$TRAIN_MINUTES" 'BEGIN { printf "%.6g", m * 60 }')"
    SCHEDULE=(trainer.max_train_steps=1000000 trainer.save_interval=1000000 trainer.eval_interval=5000
              "trainer.max_train_time_s=$SECS" trainer.train_time_clock=process_cpu trainer.lr_schedule_clock=train_time)
    VARIANT+="_${TRAIN_MINUTES}min"
    # lerobot-train stops at the budget, not at --steps: a checkpoint every 100 steps (~1-4% of a
    # 40-minute budget for ACT, ~1 CPU-s a step here) is what a stop can lose. --steps only has to
    # stay out of reach; lerobot's diffusion schedule (500 warmup steps, then cosine over --steps)
    # therefore warms up and stays near its peak LR (ACT's LR is constant anyway).
    LR_SCHEDULE=(--steps=1000000 --save_freq=100 --log_freq=100)
fi
default PY .venv/bin/python
command -v "$PY" >/dev/null || refuse "PY=$PY: expected a Python executable (the project's .venv/bin/python)"
# lerobot-eval's seeds start at 1000: demos on seeds 0..DEMOS-1 must stay below them
if [ "$DEMOS" -gt 1000 ]; then refuse "DEMOS=$DEMOS: expected at most 1000 (demo seeds 0..DEMOS-1 stay below lerobot-eval's, 1000..)"; fi
SWAP_DEFAULT="$([ "$SMOKE" = 1 ] && echo reach-v3:reach-v3 || echo drawer-open-v3:drawer-close-v3,window-open-v3:window-close-v3)"
SWAP_GIVEN="${SWAP+x}" SWAP="${SWAP-$SWAP_DEFAULT}"
for pair in ${SWAP//,/ }; do
    case "$pair" in [a-z]*:[a-z]*) ;; *) refuse "SWAP=$SWAP: expected comma-separated pairs scene-task:instruction-task (drawer-open-v3:drawer-close-v3)" ;; esac
done
# Settings the recipe owns are not overrides; the others are refused or taken by the config check
# below (dit4dit) or by lerobot-train (act, diffusion). lerobot-train's owned flags: the demos, the run
# folder, the budget's stop (--steps, --save_freq), the policy, the device (the budget is CPU time),
# no DataLoader workers (their CPU time is not the trainer's until they end: the budget would miss
# it), no resume (a run cut short is trained again). --seed is not owned: lerobot's default (1000)
# unless given, and another seed is another run (the hash of the flags in its name).
for o in "$@"; do
    case "$POLICY:$o" in
        dit4dit:datasets.vla_data.data_root_dir=*|dit4dit:datasets.vla_data.data_mix=*|dit4dit:datasets.vla_data.image_size=*|dit4dit:datasets.vla_data.latent_cache=*|dit4dit:run_id=*)
            refuse "$o: the recipe sets it (DATA_ROOT, TASKS and DEMOS, SIZE, the cache, RUN_ID)" ;;
        dit4dit:*) ;;
        *:--dataset.repo_id=*|*:--dataset.root=*) refuse "$o: the recipe sets it (the demos: DATA_ROOT, TASKS, DEMOS, SIZE)" ;;
        *:--output_dir=*|*:--job_name=*|*:--resume=*|*:--config_path=*) refuse "$o: the recipe sets it (the run: RUN_ROOT, RUN_ID)" ;;
        *:--steps=*|*:--save_freq=*) refuse "$o: the recipe sets it (the stop at TRAIN_MINUTES, a checkpoint every 100 steps)" ;;
        *:--policy.type=*|*:--policy.path=*) refuse "$o: the recipe sets it (POLICY)" ;;
        *:--policy.device=*|*:--num_workers=*) refuse "$o: the recipe sets it (the budget is one process's CPU time)" ;;
        *:--[a-z]*=*) ;;
        *) refuse "$o: expected a lerobot-train flag --key=value (POLICY=$POLICY's extra arguments go to lerobot-train)" ;;
    esac
done
default LEROBOT06_DIR "$ROOT/.lerobot06"; SIDE="$LEROBOT06_DIR"
LR="$SIDE/venv/bin"
default DATA_ROOT data/metaworld
SMOKE_TAG="$([ "$SMOKE" = 1 ] && echo _smoke || true)"
DATA="${TASKS_TAG}_${SIZE}_${DEMOS}demos$SMOKE_TAG"
# Extra overrides make another run (and statistics: one may name another VAE): a hash of them in its names.
USER_TAG="$([ $# -gt 0 ] && printf '_o%s' "$(printf '%s\n' "$@" | sha256sum | cut -c1-8)" || true)"
default RUN_ID "metaworld_$([ "$POLICY" = dit4dit ] && echo recipe || echo "$POLICY")_${DATA}$VARIANT$USER_TAG"
case "$RUN_ID" in ''|*/*|.|..) refuse "RUN_ID=$RUN_ID: expected a run folder name (no /)" ;; esac
CONFIG=configs/metaworld/dit4dit_metaworld_tiny.yaml
CACHE="$DATA_ROOT/${DATA}_latents$([ "$OBJECTIVE" = joint ] && echo _5frames || true)"
STATS="$DATA_ROOT/${DATA}_tiny_vae${USER_TAG}_stats.txt"
DATA_OVERRIDES=("datasets.vla_data.data_root_dir=$DATA_ROOT" "datasets.vla_data.data_mix=[{path: $DATA, weight: 1.0}]"
                "datasets.vla_data.image_size=[$SIZE, $SIZE]" "datasets.vla_data.latent_cache=$CACHE" "run_id=$RUN_ID" "${OBJ[@]}")
# The user's overrides come last: theirs win over the recipe's schedule.
OVERRIDES=("${DATA_OVERRIDES[@]}" "${SCHEDULE[@]}" "$@")
if [ "$POLICY" != dit4dit ]; then
    RUN_ROOT="${RUN_ROOT-runs}"
    [ -n "$RUN_ROOT" ] || refuse "RUN_ROOT=: expected a folder for the runs"
    RUN_DIR="$RUN_ROOT/$RUN_ID"
    # the hand-measured setup (the header's POLICY); the user's flags come last and win
    LR_POLICY=(--policy.type="$POLICY" --policy.pretrained_backbone_weights=null)
    if [ "$POLICY" = act ]; then LR_POLICY+=(--policy.chunk_size=8 --policy.n_action_steps=8); fi
    LR_ARGS=(--dataset.repo_id="local/$DATA" --dataset.root="$DATA_ROOT/$DATA" "${LR_POLICY[@]}" --policy.device=cpu
             --policy.push_to_hub=false --batch_size=4 --num_workers=0 "${LR_SCHEDULE[@]}" --wandb.enable=false
             --job_name="$RUN_ID" "$@")
elif ! err="$("$PY" -m dit4dit_npu.train --config "$CONFIG" "${OVERRIDES[@]}" trainer.resume=auto --dry-run 2>&1 >/dev/null)"; then
    refuse "the run's config (the settings and the extra overrides): $(printf '%s\n' "$err" | tail -n 1 | sed -e 's/^config error: //' -e 's/^error: //')"
else
    RUN_DIR="$("$PY" -m dit4dit_npu.train --config "$CONFIG" "${OVERRIDES[@]}" --dry-run | "$PY" -c '
import sys, yaml; c = yaml.safe_load(sys.stdin); print(c["run_root_dir"] + "/" + c["run_id"])')"
fi
export OMP_NUM_THREADS PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 MUJOCO_GL="${MUJOCO_GL:-egl}"
t0=$SECONDS

# The side venv (built when missing: ~8 min, 5.9 GB) with this checkout's plugins, reinstalled when
# their sources changed (a stale copy would judge old code). PY and the side venv must import this checkout's
# dit4dit_npu (a worktree: PYTHONPATH=<it>:<it>/client): lerobot_check.sh says so in one line.
stage "the lerobot 0.6.1 side venv and the plugins -> $SIDE"
PROJECT_PYTHON="$(case "$PY" in /*) echo "$PY" ;; */*) echo "$ROOT/$PY" ;; *) command -v "$PY" ;; esac)" \
    LEROBOT06_DIR="$SIDE" bash scripts/lerobot_check.sh --build-only >&2
# The tasks as lerobot expands them (groups into tasks), each with its description; then the
# language test's pairs, which must name two of them.
names="$("$LR/python" scripts/lerobot06/metaworld_side.py tasks --tasks "$TASK_LIST" 2>&1)" \
    || refuse "TASKS=$TASKS: $(printf '%s\n' "$names" | tail -n 1 | sed 's/^error: //')"
mapfile -t TASK_NAMES <<<"$names"
description() { local t; for t in "${TASK_NAMES[@]}"; do if [ "${t%% *}" = "$1" ]; then echo "${t#* }"; fi; done; }
PAIRS=()
for pair in ${SWAP//,/ }; do
    if [ -n "$(description "${pair%%:*}")" ] && [ -n "$(description "${pair#*:}")" ]; then PAIRS+=("$pair")
    elif [ -n "$SWAP_GIVEN" ]; then refuse "SWAP=$SWAP: $pair names a task not in TASKS=$TASKS"; fi
done
if [ ! -d "$DATA_ROOT/$DATA" ]; then
    stage "demos: $DEMOS expert episodes per task (seeds 0-$((DEMOS - 1))) of ${#TASK_NAMES[@]} task(s), ${SIZE}x$SIZE"
    "$LR/python" scripts/lerobot06/metaworld_side.py demos --tasks "$TASK_LIST" --episodes "$DEMOS" \
        --size "${SIZE}x$SIZE" --out "$DATA_ROOT/$DATA" >&2
fi
if [ "$POLICY" = dit4dit ]; then
    if [ ! -s "$STATS" ]; then
        stage "the tiny VAE's latent statistics on the demos' frames -> $STATS"
        "$PY" -m dit4dit_npu.data.latent_stats --config "$CONFIG" "${OVERRIDES[@]}" $([ "$SMOKE" = 1 ] && echo --smoke || true) >"$STATS.tmp"
        mv "$STATS.tmp" "$STATS"
    fi
    mapfile -t STATS_OVERRIDES < <(sed -n 's/^ *\(vae_latents_[a-z]*\): \[\(.*\)\]$/framework.cosmos25.tiny.\1=[\2]/p' "$STATS" | tr -d ' ')
    OVERRIDES=("${DATA_OVERRIDES[@]}" "${STATS_OVERRIDES[@]}" "${SCHEDULE[@]}" "$@")
    t_demos=$SECONDS
    stage "latent cache: every training sample's clip, VAE-encoded once -> $CACHE"
    "$PY" -m dit4dit_npu.data.encode_latents --config "$CONFIG" --out "$CACHE" "${OVERRIDES[@]}" >&2
    t_cache=$SECONDS
    stage "train: $([ "$SMOKE" = 1 ] && echo "2 steps" || echo "$TRAIN_MINUTES training minutes") -> $RUN_DIR"
    "$PY" -m dit4dit_npu.train --config "$CONFIG" "${OVERRIDES[@]}" trainer.resume=auto >&2
    t_train=$SECONDS
    POLICY_DIR="$(ls -d "$RUN_DIR"/checkpoints/step_*/policy | sort -V | tail -1)"
    CKPT="$(basename "$(dirname "$POLICY_DIR")")"
    "$LR/dit4dit-lerobot-prepare" --policy "$POLICY_DIR" >&2
else
    t_demos=$SECONDS t_cache=$SECONDS
    stage "train: lerobot's $POLICY, $([ "$SMOKE" = 1 ] && echo "2 steps" || echo "$TRAIN_MINUTES minutes of its CPU time") -> $RUN_DIR/train"
    MKL_NUM_THREADS="${MKL_NUM_THREADS:-$OMP_NUM_THREADS}" WANDB_MODE=disabled \
        "$LR/python" scripts/lerobot06/train_budget.py --cpu-seconds "$SECS" --out "$RUN_DIR/train" -- "${LR_ARGS[@]}" >&2
    t_train=$SECONDS
    read -r CKPT POLICY_DIR < <("$LR/python" -c 'import json, sys; r = json.load(open(sys.argv[1]))
print("step_%d" % r["step"], r["pretrained_model"])' "$RUN_DIR/train/budget.json")
fi

# lerobot_eval OUT TASK [ARGS...]: lerobot-eval of the policy on one task, EPISODES episodes, into
# OUT (skipped when OUT/eval_info.json is there: one folder per task, whatever WORKERS was). The
# smoke's 2-step policy wanders beyond its one demo's states, which a policy refuses by default:
# the smoke acts on them (with a warning).
lerobot_eval() {
    local out="$1" task="$2"
    shift 2
    [ -s "$out/eval_info.json" ] && return 0
    rm -rf "$out"
    "$LR/lerobot-eval" --policy.path="$POLICY_DIR" --env.type=metaworld_lean --env.task="$task" --env.image_size="$SIZE" \
        --eval.n_episodes="$EPISODES" --eval.batch_size=1 --policy.device=cpu --output_dir="$out" \
        $([ "$SMOKE$POLICY" = 1dit4dit ] && echo --policy.allow_out_of_range=true || true) "$@" >"$out.log" 2>&1 \
        || { echo "error: lerobot-eval on $task failed: $(tail -1 "$out.log") (log: $out.log)" >&2; return 1; }
}
EVAL="$RUN_DIR/lerobot_eval/${CKPT}_${EPISODES}eps"
mkdir -p "$EVAL"
stage "lerobot-eval: ${#TASK_NAMES[@]} task(s) x $EPISODES episodes, $WORKERS process(es) -> $EVAL"
worker() {  # the tasks w, w+WORKERS, ... one after the other
    local i
    for ((i = $1; i < ${#TASK_NAMES[@]}; i += WORKERS)); do lerobot_eval "$EVAL/${TASK_NAMES[i]%% *}" "${TASK_NAMES[i]%% *}" || return 1; done
}
pids=() infos=() failed=0
for ((w = 0; w < WORKERS && w < ${#TASK_NAMES[@]}; w++)); do worker "$w" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done  # every worker ends before a failure stops the recipe
[ "$failed" = 0 ] || exit 1
for t in "${TASK_NAMES[@]}"; do infos+=("$EVAL/${t%% *}/eval_info.json"); done
t_eval=$SECONDS
"$LR/python" scripts/lerobot06/metaworld_side.py score "${infos[@]}" >"$EVAL/score.txt" || { cat "$EVAL/score.txt" >&2; exit 1; }

# The language test: task A's scene, task B's instruction, beside A's success under its own.
for pair in "${PAIRS[@]}"; do
    a="${pair%%:*}" b="${pair#*:}" out="$EVAL/swap_${pair%%:*}_as_${pair#*:}"
    lerobot_eval "$out" "$a" --policy.replace_instruction=true --policy.instruction="$(description "$b")"
    line="$("$LR/python" scripts/lerobot06/metaworld_side.py score "$out/eval_info.json")" || { echo "$line" >&2; exit 1; }
    echo "language: $a's scene with $b's instruction \"$(description "$b")\": ${line%%$'\n'*}" >>"$EVAL/score.txt"
done
cat "$EVAL/score.txt"
echo "minutes: side venv, demos and statistics $(((t_demos - t0) / 60)), cache $(((t_cache - t_demos) / 60)), train $(((t_train - t_cache) / 60)), eval $(((SECONDS - t_train) / 60))"
grep '^average' "$EVAL/score.txt"
