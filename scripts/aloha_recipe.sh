#!/usr/bin/env bash
# The CPU recipe for ALOHA transfer cube (TASK=insertion: the second task), from scratch: DEMOS
# (50) scripted-expert demos at 240x320 -> the tiny VAE's own latent statistics on the config's views
# (cam_high cropped to the objects' table area, 96x128) -> latent cache (the VAE runs once per clip,
# not every step) -> train the task's tiny config (configs/aloha/dit4dit_aloha_TASK_tiny.yaml: one-
# frame clips, the action loss into the backbone, state noise) for STEPS steps, a checkpoint and
# a held-out error every STEPS/3 (rounded up) -> closed-loop eval of every checkpoint on EPISODES (50) unseen seeds (0..)
# with python -m dit4dit_npu.train.success_curve (plot: docs/aloha_success_vs_steps.png; insertion:
# docs/aloha_insertion_success_vs_steps.png; any other setting or RUN_ID: RUN_DIR/sim_curve/curve.png).
# Each stage is skipped when its output is there (demos, statistics, cached episodes, a finished run,
# an eval's results.json), so a rerun only redoes what is missing. The last line is the last
# checkpoint's `success k/EPISODES = p% (95% Wilson CI lo-hi%)`.
#
#   bash scripts/aloha_recipe.sh [a.b=c ...]   # extra training overrides (a new RUN_ID for a new run)
#   STEPS=6000 WORKERS=2 bash scripts/aloha_recipe.sh  # its own run (..._6000steps); WORKERS: sim processes
#                                                      # (the demos' and the eval's, each with its own scene;
#                                                      # at most the CPUs the recipe may use)
#   DEMOS=100 EPISODES=100 bash scripts/aloha_recipe.sh  # 100 demos (own data, cache, run), 100 eval seeds
#   TASK=insertion bash scripts/aloha_recipe.sh   # the second task (configs/aloha/dit4dit_aloha_insertion_tiny.yaml)
#   SMOKE=1 bash scripts/aloha_recipe.sh       # the same commands, tiny: 1 demo at 32x48, 2 steps,
#                                              # one 16-step episode per checkpoint
#   OBJECTIVE=joint VAE=fitted bash scripts/aloha_recipe.sh   # see below; SMOKE=1 works with each
#   OBJECTIVE=joint ONE_PASS=1 TRAIN_MINUTES=60 bash scripts/aloha_recipe.sh  # a cheaper joint step, 60 training minutes
#
# What is trained (docs/simulation.md, "Fitted tiny VAE and OBJECTIVE="):
#   OBJECTIVE=no_video (default) the shipped config's: one-frame clips, video loss 0, the action loss
#                      into the backbone (the config's choices)
#   OBJECTIVE=joint    5-frame clips (the observation + 4 frames up to 16 steps = one action chunk
#                      ahead), the video flow-matching loss on the future latent frame (weight
#                      VIDEO_WEIGHT, default 0.2) and the action loss alongside, into the backbone
#                      too (BACKPROP=1, the default); the defaults are the best measured settings
#                      (docs/simulation.md); BACKPROP=0 detaches the features from the action loss
#                      (the paper's default; no_video refuses it: nothing else trains its backbone)
#   VAE=random (default) the tiny config's random frozen VAE; VAE=fitted: VAE_WEIGHTS (default
#                      configs/aloha/tiny_vae_transfer_cube.safetensors, dit4dit-fit-tiny-vae on
#                      sim frames; refitted on the demos when missing), its own latent statistics
#   PRETRAIN=N         N steps of video pretraining first (0, the default: none): a run with the
#                      video loss only (framework.cosmos25.training: video; the episodes' actions
#                      are never read) on PRETRAIN_DEMOS (50) demos' 5-frame clips, whose transformer
#                      then starts the run (trainer.init_from; a fresh action head), normalized by
#                      the pretraining demos' latent statistics. The point: few labelled demos
#                      (DEMOS=10) after video of many. Extra overrides apply to both runs
#   ONE_PASS=1         (OBJECTIVE=joint) the action head reads the video-loss pass itself: the backbone
#                      runs once per step (framework.cosmos25.one_pass.enabled; docs/training.md,
#                      "Cheaper joint steps"). Default 0: two passes, as the original
#   VIDEO_EVERY=k      (OBJECTIVE=joint) the video loss on every k-th step only, the others no-video
#                      steps (trainer.video_loss_interval). Default 1: every step
#   VIDEO_SPAN=a-b     (OBJECTIVE=joint) the video loss only while the share of the training done lies
#                      in [a, b), the other steps no-video (trainer.video_loss_span): 0-0.5 the video
#                      objective first, 0.5-1 last. Default 0-1: every step
#   TRAIN_MINUTES=N    a budget of N training minutes (a decimal number; trainer.max_train_time_s: the
#                      run stops at the first step past it, or at STEPS, which now only bounds it: the
#                      LR schedule runs on training time, trainer.lr_schedule_clock=train_time, and
#                      ends where the run ends), checkpoints every N/3 training minutes instead of every
#                      STEPS/3 steps (trainer.save_every_s); training minutes leave out start-up, the
#                      data/cache building, evaluations and saves. For equal-time comparisons:
#                      scripts/equal_time.sh runs the arms side by side. Unset: STEPS steps
#   INTERMEDIATE_EPISODES=M  every checkpoint but the last evaluated on seeds 0..M-1 only (M <=
#                      EPISODES; default EPISODES): the curve at a fraction of its cost, the last
#                      checkpoint (the last line) on all EPISODES
#   ENCODE_RANKS=1     the latent cache's VAE encode as this many ranks of one `accelerate launch`
#                      (each rank every ENCODE_RANKS-th episode, a CPU each: at most the CPUs this
#                      process may use; an accelerator host: at most its cards). The episodes are
#                      independent and the VAE is the cost: 2 ranks encoded 9600 5-frame clips in 16
#                      minutes here where one rank made 5 clips a second (docs/simulation.md, "Equal training time")
#   PREPARE_ONLY=1     the checks, demos, statistics and latent cache of the run these settings
#                      name, then stop (no training, no eval: EPISODES and
#                      INTERMEDIATE_EPISODES are refused); the
#                      last line is `prepared in seconds: demos D, cache C` (scripts/equal_time.sh
#                      prepares every arm's data so, one after the other, before the arms run side by side)
#   TASK=transfer_cube (default) | insertion: the task's config (configs/aloha/dit4dit_aloha_TASK_tiny.yaml,
#                      each with its own crop and state noise, reasons there), demos and eval scene;
#                      insertion's runs are aloha_recipe_insertion[_joint_bp0...], its demos
#                      data/aloha/insertion_SIZE_recipe (cache and statistics named after them).
#                      VAE=fitted with insertion fits its own VAE on those demos when missing
#                      (data/aloha/insertion_240x320_recipe_tiny_vae.safetensors, the fit stage
#                      below): the committed fit saw only transfer-cube frames (another crop, no
#                      peg, no blue socket; on insertion's frames MSE 0.098 against 0.043 on its own)
#
# Every setting above (and WORKERS, SMOKE, OMP_NUM_THREADS, PY, RUN_ID, DATA_ROOT, VAE_WEIGHTS) is
# checked before anything runs, and the extra training overrides through a --dry-run of the run's
# config: a bad value is one line naming it, exit code 2. A setting the chosen run does not read
# (VIDEO_WEIGHT without OBJECTIVE=joint, DEMOS with SMOKE=1, ...) is refused, never ignored.
#
# Measured on the project's shared 2-core CPU machine: docs/simulation.md ("What to expect").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
refuse() { echo "error: $*" >&2; exit 2; }
positive() { case "${!1}" in ''|0*|*[!0-9]*) refuse "$1=${!1}: expected a positive integer${2:-}" ;; esac; }
unread() {  # $1: a variable the chosen run does not read, $2: why; set, it is refused rather than ignored
    if [ -n "${!1+x}" ]; then refuse "$1=${!1}: $2"; fi
}
SMOKE="${SMOKE-0}"
case "$SMOKE" in 0|1) ;; *) refuse "SMOKE=$SMOKE: expected 0 or 1" ;; esac
OMP_NUM_THREADS="${OMP_NUM_THREADS-1}"
positive OMP_NUM_THREADS " (threads per process)"
export OMP_NUM_THREADS PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY="${PY-.venv/bin/python}"
if ! command -v "$PY" >/dev/null; then refuse "PY=$PY: expected a Python executable (the project's .venv/bin/python)"; fi
PREPARE_ONLY="${PREPARE_ONLY-0}"
case "$PREPARE_ONLY" in 0|1) ;; *) refuse "PREPARE_ONLY=$PREPARE_ONLY: expected 0 or 1" ;; esac
if [ "$PREPARE_ONLY" = 1 ]; then
    for v in EPISODES INTERMEDIATE_EPISODES; do unread "$v" "PREPARE_ONLY=1 stops before the eval"; done
fi
WORKERS="${WORKERS-1}"
positive WORKERS " (sim processes: the demos' and the eval's)"
ENCODE_RANKS="${ENCODE_RANKS-1}"
positive ENCODE_RANKS " (the latent cache's encoding processes)"
CPUS="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"  # (nproc would answer OMP_NUM_THREADS)
at_most_cpus() {  # $1: a count of processes (a positive integer), a CPU each; $2: what each is
    local n="${!1}"
    if [ "${#n}" -gt 4 ] || [ "$n" -gt "$CPUS" ]; then
        refuse "$1=$n: expected at most $CPUS, the CPUs this process may use ($2 each)"
    fi
}
at_most_cpus ENCODE_RANKS "a rank"
# Each sim process holds a scene and (the eval's) its own copy of the policy, ~0.4 GB at 240x320:
# more of them than CPUs only queue for the cores and add memory.
at_most_cpus WORKERS "a sim process"
# on an accelerator host rank k encodes on card k: no more ranks than visible cards (the device
# layer's own check, which a CPU host passes)
if [ "$ENCODE_RANKS" != 1 ] && ! err="$($PY -m dit4dit_npu.device env --ranks "$ENCODE_RANKS" 2>&1 >/dev/null)"; then
    refuse "ENCODE_RANKS=$ENCODE_RANKS: $(printf '%s\n' "$err" | tail -n 1 | sed 's/^error: //')"
fi
OBJECTIVE="${OBJECTIVE-no_video}" TASK="${TASK-transfer_cube}" VAE="${VAE-random}"
case "$TASK" in
    transfer_cube) TASK_TAG="" ;;
    insertion) TASK_TAG="_insertion" ;;
    *) refuse "TASK=$TASK: expected transfer_cube or insertion" ;;
esac
CONFIG="configs/aloha/dit4dit_aloha_${TASK}_tiny.yaml"
case "$OBJECTIVE" in no_video|joint) ;; *) refuse "OBJECTIVE=$OBJECTIVE: expected no_video or joint" ;; esac
case "$VAE" in random|fitted) ;; *) refuse "VAE=$VAE: expected random or fitted" ;; esac
BACKPROP="${BACKPROP-1}"  # both objectives: the action loss into the backbone (joint: the best measured)
case "$BACKPROP" in 0|1) ;; *) refuse "BACKPROP=$BACKPROP: expected 0 or 1" ;; esac
if [ "$OBJECTIVE" = no_video ] && [ "$BACKPROP" = 0 ]; then
    refuse "BACKPROP=0 with OBJECTIVE=no_video: the action loss is all that trains its backbone"
fi
if [ "$OBJECTIVE" = joint ]; then
    VIDEO_WEIGHT="${VIDEO_WEIGHT-0.2}"  # the best measured weight (docs/simulation.md)
    # a plain number >= 0: no sign, no nan/inf (it names the run, and training takes it as is)
    if ! [[ "$VIDEO_WEIGHT" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$ ]] \
        || ! awk -v v="$VIDEO_WEIGHT" 'BEGIN { exit !(v + 0 < 1e300) }'; then
        refuse "VIDEO_WEIGHT=$VIDEO_WEIGHT: expected a number >= 0 (the video loss's weight, e.g. 0.2)"
    fi
    if [ "$BACKPROP" = 0 ] && awk -v v="$VIDEO_WEIGHT" 'BEGIN { exit !(v + 0 == 0) }'; then
        refuse "VIDEO_WEIGHT=$VIDEO_WEIGHT with BACKPROP=0: no loss would train the backbone (weight the video loss > 0, or BACKPROP=1)"
    fi
    ONE_PASS="${ONE_PASS-0}"
    case "$ONE_PASS" in 0|1) ;; *) refuse "ONE_PASS=$ONE_PASS: expected 0 or 1" ;; esac
    VIDEO_EVERY="${VIDEO_EVERY-1}"
    positive VIDEO_EVERY " (the video loss on every k-th step; 1 = every step)"
    VIDEO_SPAN="${VIDEO_SPAN-0-1}"
    # two plain decimal numbers (they name the run); the training config checks 0 <= a < b <= 1
    DECIMAL='([0-9]+([.][0-9]*)?|[.][0-9]+)'
    if ! [[ "$VIDEO_SPAN" =~ ^${DECIMAL}-${DECIMAL}$ ]]; then
        refuse "VIDEO_SPAN=$VIDEO_SPAN: expected a-b, the share of the training with the video loss (e.g. 0-0.5; 0-1 = every step)"
    fi
else
    unread VIDEO_WEIGHT "applies only to OBJECTIVE=joint (no_video trains no video loss)"
    unread ONE_PASS "applies only to OBJECTIVE=joint (no_video has no video-loss pass)"
    unread VIDEO_EVERY "applies only to OBJECTIVE=joint (no_video trains no video loss)"
    unread VIDEO_SPAN "applies only to OBJECTIVE=joint (no_video trains no video loss)"
fi
if [ -n "${TRAIN_MINUTES+x}" ]; then
    # a plain decimal number > 0 (it names the run; training takes it in seconds)
    if ! [[ "$TRAIN_MINUTES" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] \
        || ! awk -v v="$TRAIN_MINUTES" 'BEGIN { exit !(v + 0 > 0 && v + 0 < 1e9) }'; then
        refuse "TRAIN_MINUTES=$TRAIN_MINUTES: expected a number of training minutes > 0 (e.g. 60 or 0.5)"
    fi
fi
if [ "$VAE" != fitted ]; then unread VAE_WEIGHTS "applies only to VAE=fitted"; fi
if [ -n "${VAE_WEIGHTS+x}" ] && [ -z "$VAE_WEIGHTS" ]; then  # (it would take the default's place silently)
    refuse "VAE_WEIGHTS=: expected a tiny VAE's safetensors file (unset it for the task's default)"
fi
# A given file that is missing is fitted and written there after the demos (minutes in): its folder
# must be there and writable now, not found wrong after that work (a typo'd folder was created anew).
if [ "$VAE" = fitted ] && [ -n "${VAE_WEIGHTS-}" ]; then
    if [ -d "$VAE_WEIGHTS" ]; then refuse "VAE_WEIGHTS=$VAE_WEIGHTS: is a folder, expected a tiny VAE's safetensors file"; fi
    VAE_DIR="$(dirname -- "$VAE_WEIGHTS")"
    if [ ! -s "$VAE_WEIGHTS" ] && [ ! -d "$VAE_DIR" ]; then
        refuse "VAE_WEIGHTS=$VAE_WEIGHTS: no folder $VAE_DIR (the file is missing, so the fit stage would write it there)"
    fi
    if [ ! -s "$VAE_WEIGHTS" ] && [ ! -w "$VAE_DIR" ]; then
        refuse "VAE_WEIGHTS=$VAE_WEIGHTS: folder $VAE_DIR is not writable (the file is missing, so the fit stage would write it there)"
    fi
fi
if [ -n "${RUN_ID+x}" ]; then
    case "$RUN_ID" in ''|*/*|.|..) refuse "RUN_ID=$RUN_ID: expected a run folder name (no /)" ;; esac
fi
if [ -n "${DATA_ROOT+x}" ] && [ -z "$DATA_ROOT" ]; then refuse "DATA_ROOT=: expected a folder for the demos and caches"; fi
PRETRAIN="${PRETRAIN-0}"
case "$PRETRAIN" in 0) ;; ''|0*|*[!0-9]*) refuse "PRETRAIN=$PRETRAIN: expected a number of steps (0 = none)" ;; esac
if [ "$PRETRAIN" = 0 ]; then unread PRETRAIN_DEMOS "applies only with PRETRAIN > 0 (the video pretraining's demos)"; fi
if [ "$SMOKE" = 1 ]; then
    for v in DEMOS STEPS EPISODES INTERMEDIATE_EPISODES PRETRAIN_DEMOS; do
        unread "$v" "SMOKE=1 sets its own (1 demo, 2 steps (1000 under TRAIN_MINUTES), one 16-step episode per checkpoint)"
    done
    PRETRAIN_DEMOS=1  # the smoke's one demo
    DEMOS=1 SIZE=32x48 STEPS=2 EVERY=1 EPISODES=1 EPISODE_STEPS=16 RUN="aloha_recipe${TASK_TAG}_smoke"
    if [ -n "${TRAIN_MINUTES+x}" ]; then STEPS=1000; fi  # the budget stops it; the steps only bound it
    # one demo trains (nothing held out); 32x48 is the smallest size three side-by-side views allow
    EXTRA=(datasets.vla_data.val_fraction=0.0 trainer.eval_samples=0 datasets.vla_data.per_device_batch_size=2
           trainer.num_warmup_steps=0 "datasets.vla_data.image_size=[32, 48]")
else
    DEMOS="${DEMOS-50}" SIZE=240x320 STEPS="${STEPS-15000}" EPISODES="${EPISODES-50}" EPISODE_STEPS=400
    PRETRAIN_DEMOS="${PRETRAIN_DEMOS-50}"
    RUN="aloha_recipe${TASK_TAG}"
    for v in DEMOS EPISODES STEPS PRETRAIN_DEMOS; do positive "$v"; done  # EPISODES is first used after training
    # bash's arithmetic (the checkpoint interval below) wraps past 2**63 and the run would start
    if [ "${#STEPS}" -gt 18 ]; then refuse "STEPS=$STEPS: expected at most 18 digits (a number of training steps)"; fi
    # the eval's seeds 0..EPISODES-1 within the simulator's range (sim.eval says the same, hours later)
    if [ "${#EPISODES}" -gt 10 ] || [ "$EPISODES" -gt 4294967296 ]; then
        refuse "EPISODES=$EPISODES: expected at most 2**32 (eval seeds 0..EPISODES-1 < 2**32, the simulator's range)"
    fi
    if [ -n "${INTERMEDIATE_EPISODES+x}" ]; then
        positive INTERMEDIATE_EPISODES
        if [ "${#INTERMEDIATE_EPISODES}" -gt 10 ] || [ "$INTERMEDIATE_EPISODES" -gt "$EPISODES" ]; then
            refuse "INTERMEDIATE_EPISODES=$INTERMEDIATE_EPISODES: expected at most EPISODES=$EPISODES (the earlier checkpoints' episodes)"
        fi
    fi
    EVERY=$(((STEPS + 2) / 3)) EXTRA=()  # rounded up: STEPS=8000 checkpoints 2667, 5334, 8000 (not 7998 and 8000)
fi
# The defaults (no_video, random VAE, 50 demos, 15000 steps) keep the plain names (run aloha_recipe,
# its cache and statistics); every other setting gets its own run, latent cache and statistics,
# named by what changes them.
VARIANT="" JOINT_STEP=()
# The chunk's 16 steps ahead as 5 frames (1 + 4: one future latent frame of the causal VAE, the
# cheapest clip that has one); the latent cache makes the VAE's 5x cost a one-off.
VIDEO_CLIPS=("datasets.vla_data.video_delta_indices=[0, 4, 8, 12, 16]" datasets.vla_data.action_video_freq_ratio=1)
if [ "$OBJECTIVE" = joint ]; then
    VARIANT="_joint_bp${BACKPROP}"
    EXTRA+=("${VIDEO_CLIPS[@]}"
            "framework.cosmos25.backprop_action_to_backbone=$([ "$BACKPROP" = 1 ] && echo true || echo false)"
            "trainer.loss_scale.future_video=$VIDEO_WEIGHT")
    # weight 1.0 (the original's, the default before) keeps its runs' names; any other is in the name
    if ! awk -v v="$VIDEO_WEIGHT" 'BEGIN { exit !(v + 0 == 1) }'; then VARIANT+="_vw${VIDEO_WEIGHT}"; fi
    # the options of the joint step (JOINT_STEP): the joint run's only, never a video pretraining
    # run's (the video loss alone has no feature pass to share and no step to leave the loss out of)
    if [ "$ONE_PASS" = 1 ]; then
        VARIANT+="_onepass" JOINT_STEP+=(framework.cosmos25.one_pass.enabled=true)
    fi
    if [ "$VIDEO_EVERY" != 1 ]; then
        VARIANT+="_vevery${VIDEO_EVERY}" JOINT_STEP+=("trainer.video_loss_interval=$VIDEO_EVERY")
    fi
    if ! awk -v a="${VIDEO_SPAN%-*}" -v b="${VIDEO_SPAN#*-}" 'BEGIN { exit !(a + 0 == 0 && b + 0 == 1) }'; then
        VARIANT+="_vspan${VIDEO_SPAN}" JOINT_STEP+=("trainer.video_loss_span=[${VIDEO_SPAN/-/, }]")
    fi
fi
if [ "$VAE" = fitted ]; then VARIANT+="_fittedvae"; fi
DEMOS_TAG="$([ "$DEMOS" != 50 ] && [ "$SMOKE" != 1 ] && echo "_${DEMOS}demos" || true)"  # data and run
VARIANT+="$DEMOS_TAG"
# Another STEPS is another run: resuming the default one instead would skip training when STEPS is
# smaller (and report its checkpoints) or extend it on a stretched learning-rate schedule when larger.
if [ "$STEPS" != 15000 ] && [ "$SMOKE" != 1 ]; then VARIANT+="_${STEPS}steps"; fi
if [ "$PRETRAIN" != 0 ]; then VARIANT+="_pretrain${PRETRAIN}x${PRETRAIN_DEMOS}"; fi
# The training command's schedule: STEPS steps with a checkpoint every EVERY, or a budget of training
# time with a checkpoint every third of it (the steps then only bound the run; the LR schedule runs on
# the training seconds and anneals by the budget's end, so equal-time arms whose steps cost differently
# each finish their schedule).
SCHEDULE=("trainer.max_train_steps=$STEPS" "trainer.save_interval=$EVERY" "trainer.eval_interval=$EVERY")
if [ -n "${TRAIN_MINUTES+x}" ]; then
    VARIANT+="_${TRAIN_MINUTES}min"
    SCHEDULE=("trainer.max_train_steps=$STEPS" "trainer.save_interval=$STEPS" "trainer.eval_interval=$STEPS"
              "trainer.max_train_time_s=$(awk -v m="$TRAIN_MINUTES" 'BEGIN { printf "%.6g", m * 60 }')"
              "trainer.save_every_s=$(awk -v m="$TRAIN_MINUTES" 'BEGIN { printf "%.6g", m * 20 }')"
              "trainer.lr_schedule_clock=train_time")
fi
RUN_ID="${RUN_ID-$RUN$VARIANT}"
# The recipe's choices (one-frame clips, the action loss into the backbone, the cam_high crop, state
# noise) are the config's own, each with its reason there; the measurements are in
# docs/sim_recipe_log.md.
DATA_ROOT="${DATA_ROOT-data/aloha}"  # (tests: a temp folder)
DATA="$DATA_ROOT/${TASK}_${SIZE}_recipe$DEMOS_TAG"
if [ "$VAE" = fitted ]; then
    # transfer cube: the committed fit (dit4dit-fit-tiny-vae on 12 demos' frames); insertion: its own
    # fit on the recipe's demos, made below when missing; SMOKE fits its own in seconds
    if [ "$SMOKE" = 1 ]; then DEFAULT_VAE="${DATA}_tiny_vae_smoke.safetensors"
    elif [ "$TASK" = insertion ]; then DEFAULT_VAE="${DATA}_tiny_vae.safetensors"
    else DEFAULT_VAE=configs/aloha/tiny_vae_transfer_cube.safetensors; fi
    VAE_WEIGHTS="${VAE_WEIGHTS-$DEFAULT_VAE}"
    EXTRA+=("framework.cosmos25.tiny.vae_weights=$VAE_WEIGHTS")
fi
# The extra arguments are training overrides (a flag here reached the config check's CLI: --help
# printed its usage and passed), and none of the keys the recipe sets from its settings: the
# schedule's come after them (an override of one was silently replaced) and the data's and run's
# are where the recipe looks for them.
for o in "$@"; do
    case "$o" in [a-z_]*=*) ;; *) refuse "$o: expected a training override key=value (a.b=c)" ;; esac
    for k in datasets.vla_data.data_root_dir datasets.vla_data.data_mix run_id trainer.resume \
             trainer.keep_last_checkpoints "${SCHEDULE[@]%%=*}"; do
        if [ "${o%%=*}" = "$k" ]; then
            refuse "$o: the recipe sets $k (from DATA_ROOT, DEMOS, RUN_ID, STEPS, TRAIN_MINUTES: its settings)"
        fi
    done
done
OVERRIDES=(
    "datasets.vla_data.data_root_dir=$DATA_ROOT" "datasets.vla_data.data_mix=[{path: $(basename "$DATA"), weight: 1.0}]"
    "run_id=$RUN_ID" "${EXTRA[@]}" "${JOINT_STEP[@]}" "$@"
)
if [ "$PRETRAIN" != 0 ]; then  # the video pretraining run: the video loss alone on its demos' 5-frame clips
    PT_TAG="$([ "$PRETRAIN_DEMOS" != 50 ] && [ "$SMOKE" != 1 ] && echo "_${PRETRAIN_DEMOS}demos" || true)"
    PT_DATA="$DATA_ROOT/${TASK}_${SIZE}_recipe$PT_TAG"
    PT=("datasets.vla_data.data_root_dir=$DATA_ROOT" "datasets.vla_data.data_mix=[{path: $(basename "$PT_DATA"), weight: 1.0}]"
        "run_id=$RUN$([ "$VAE" = fitted ] && echo _fittedvae || true)_video_only${PT_TAG}_$PRETRAIN"
        "${EXTRA[@]}" "${VIDEO_CLIPS[@]}" framework.cosmos25.training=video trainer.eval_samples=0
        "$@")
fi

# Each run's config with the extra overrides, checked now (a typo'd or badly valued key, a run in
# which a module would get no loss) rather than after the demos, statistics and caches are built.
# Not yet in it: what later stages make (the latent cache and statistics, the pretrained
# transformer to start from, a fitted VAE file still to be fitted).
check_config() {  # $1: the run, for the message; then its overrides
    local what="$1" o err args=()
    shift
    for o in "$@"; do
        if [ "$VAE" = fitted ] && [ "$o" = "framework.cosmos25.tiny.vae_weights=$VAE_WEIGHTS" ] && [ ! -s "$VAE_WEIGHTS" ]; then
            continue
        fi
        args+=("$o")
    done
    if ! err="$($PY -m dit4dit_npu.train --config "$CONFIG" "${args[@]}" --dry-run 2>&1 >/dev/null)"; then
        refuse "$what: $(printf '%s\n' "$err" | tail -n 1 | sed -e 's/^config error: //' -e 's/^error: //')"
    fi
}
if [ "$PRETRAIN" != 0 ]; then
    check_config "the video pretraining run's config (PRETRAIN=$PRETRAIN and the extra overrides)" "${PT[@]}" \
        "trainer.max_train_steps=$PRETRAIN" "trainer.save_interval=$PRETRAIN" "trainer.eval_interval=$PRETRAIN"
fi
check_config "the run's config (the settings and the extra overrides)" "${OVERRIDES[@]}" trainer.resume=auto \
    "${SCHEDULE[@]}" trainer.keep_last_checkpoints=3

stage() { echo "== $(date +%H:%M:%S) $*"; }
t0=$SECONDS
if [ ! -d "$DATA" ]; then
    stage "demos: $DEMOS expert episodes, seeds 100000.., $SIZE"
    $PY -m dit4dit_npu.sim.demos --task "$TASK" --episodes "$DEMOS" --size "$SIZE" --workers "$WORKERS" --out "$DATA"
fi
if [ "$VAE" = fitted ] && [ ! -s "$VAE_WEIGHTS" ]; then
    stage "fit the tiny VAE to the demos' frames -> $VAE_WEIGHTS"
    $PY -m dit4dit_npu.train.fit_tiny_vae --config "$CONFIG" --out "$VAE_WEIGHTS" $([ "$SMOKE" = 1 ] && echo --smoke || true) \
        "${OVERRIDES[@]}" "${VIDEO_CLIPS[@]}"
fi
# The statistics and the latent cache of the VAE in use (a fitted one: named by its content, so a
# refit measures and encodes again) and of the clips (one frame, or 5 for joint).
FITTED="$([ "$VAE" = fitted ] && echo "_fitted$(sha256sum "$VAE_WEIGHTS" | cut -c1-12)" || true)"
CACHE="${DATA}_latents$([ "$OBJECTIVE" = joint ] && echo _5frames || true)$FITTED"
OVERRIDES+=("datasets.vla_data.latent_cache=$CACHE")
encode_latents() {  # the encoder's arguments after --config: ENCODE_RANKS processes, one launch
    if [ "$ENCODE_RANKS" = 1 ]; then
        $PY -m dit4dit_npu.data.encode_latents --config "$CONFIG" "$@"
        return
    fi
    # (--multi_gpu: accelerate's several-process launch; on a CPU host its ranks talk over gloo.) A
    # rank that fails prints its one error line, then the launcher a traceback: that line is said last.
    local out rc=0
    out="$(mktemp)"
    $PY -m accelerate.commands.launch --multi_gpu --num_processes "$ENCODE_RANKS" --main_process_port 0 \
        -m dit4dit_npu.data.encode_latents --config "$CONFIG" "$@" 2>&1 | tee "$out" || rc=$?
    if [ "$rc" != 0 ]; then
        local line
        line="$(grep -m 1 '^error: ' "$out" | sed 's/^error: //' || true)"
        rm -f "$out"
        refuse "the latent cache's encode ($ENCODE_RANKS ranks): ${line:-the launch failed (exit code $rc; its output is above)}"
    fi
    rm -f "$out"
}
latent_stats() {  # $1: the statistics file to fill when missing; then the overrides of the run it is for
    local out="$1"; shift
    if [ ! -s "$out" ]; then  # (the log gets stderr: stdout is the overrides)
        stage "the tiny VAE's latent statistics on the demos -> $out" >&2
        $PY -m dit4dit_npu.data.latent_stats --config "$CONFIG" "$@" | tee "$out.tmp" >&2
        mv "$out.tmp" "$out"
    fi
    sed -n 's/^ *\(vae_latents_[a-z]*\): \[\(.*\)\]$/framework.cosmos25.tiny.\1=[\2]/p' "$out" | tr -d ' '
}
run_dir() {  # the run folder of a config + overrides, as the trainer resolves it
    $PY -m dit4dit_npu.train --config "$CONFIG" "$@" --dry-run | $PY -c '
import sys, yaml; c = yaml.safe_load(sys.stdin); print(c["run_root_dir"] + "/" + c["run_id"])'
}
if [ "$PRETRAIN" = 0 ]; then
    OVERRIDES+=($(latent_stats "${DATA}_tiny_vae${FITTED}_stats.txt" "${OVERRIDES[@]}"))
else
    # Video pretraining (PT, above). Its latent statistics normalize both runs: the transformer
    # learned latents normalized by them.
    if [ ! -d "$PT_DATA" ]; then
        stage "demos for video pretraining: $PRETRAIN_DEMOS expert episodes, seeds 100000.., $SIZE"
        $PY -m dit4dit_npu.sim.demos --task "$TASK" --episodes "$PRETRAIN_DEMOS" --size "$SIZE" --workers "$WORKERS" \
            --out "$PT_DATA"
    fi
    PT+=("datasets.vla_data.latent_cache=${PT_DATA}_latents_5frames$FITTED")
    STATS_OVERRIDES=($(latent_stats "${PT_DATA}_tiny_vae${FITTED}_stats.txt" "${PT[@]}"))
    PT+=("${STATS_OVERRIDES[@]}")
    stage "video pretraining: latent cache of $PT_DATA's 5-frame clips"
    encode_latents --out "${PT_DATA}_latents_5frames$FITTED" "${PT[@]}"
    stage "video pretraining: $PRETRAIN steps, the video loss only"
    $PY -m dit4dit_npu.train --config "$CONFIG" "${PT[@]}" trainer.resume=auto "trainer.max_train_steps=$PRETRAIN" \
        "trainer.save_interval=$PRETRAIN" "trainer.eval_interval=$PRETRAIN" trainer.keep_last_checkpoints=1
    OVERRIDES+=("${STATS_OVERRIDES[@]}" "trainer.init_from=$(run_dir "${PT[@]}")")
fi
t_demos=$SECONDS
stage "latent cache: every training sample's clip, VAE-encoded once"
encode_latents --out "$CACHE" "${OVERRIDES[@]}"
t_cache=$SECONDS
if [ "$PREPARE_ONLY" = 1 ]; then
    echo "prepared in seconds: demos $((t_demos - t0)), cache $((t_cache - t_demos))"
    exit 0
fi
if [ -n "${TRAIN_MINUTES+x}" ]; then
    stage "train: $TRAIN_MINUTES training minutes (at most $STEPS steps), a checkpoint every third of them"
else
    stage "train: $STEPS steps, a checkpoint every $EVERY"
fi
$PY -m dit4dit_npu.train --config "$CONFIG" "${OVERRIDES[@]}" trainer.resume=auto "${SCHEDULE[@]}" \
    trainer.keep_last_checkpoints=3  # every checkpoint of the curve
t_train=$SECONDS
RUN_DIR="$(run_dir "${OVERRIDES[@]}")"
stage "closed-loop eval of every checkpoint of $RUN_DIR on seeds 0-$((EPISODES - 1))$(
    [ -z "${INTERMEDIATE_EPISODES+x}" ] || echo " (all but the last on seeds 0-$((INTERMEDIATE_EPISODES - 1)))")"
CURVE=(--run "$RUN_DIR" --task "$TASK" --episodes "$EPISODES" --seed 0 --max-steps "$EPISODE_STEPS" --workers "$WORKERS")
if [ -n "${TRAIN_MINUTES+x}" ]; then CURVE+=(--x time); fi  # its checkpoints are spaced in training time
if [ -n "${INTERMEDIATE_EPISODES+x}" ]; then CURVE+=(--intermediate-episodes "$INTERMEDIATE_EPISODES"); fi
# Only the task's own recipe (no setting changed, no RUN_ID of its own) redraws the docs' plot; every
# other run keeps its curve in its run folder (a joint or 100-demo run must not overwrite it).
if [ "$SMOKE" = 1 ]; then CURVE+=(--out "$RUN_DIR/sim_curve/smoke.png")
elif [ "$RUN_ID" != "$RUN" ]; then CURVE+=(--out "$RUN_DIR/sim_curve/curve.png")
elif [ "$TASK" = insertion ]; then CURVE+=(--out docs/aloha_insertion_success_vs_steps.png)
else CURVE+=(--out docs/aloha_success_vs_steps.png); fi
$PY -m dit4dit_npu.train.success_curve "${CURVE[@]}" | tee "$RUN_DIR/sim_curve.log"
t_eval=$SECONDS
echo "minutes: demos $(((t_demos - t0) / 60)), cache $(((t_cache - t_demos) / 60)), train $(((t_train - t_cache) / 60)), eval $(((t_eval - t_train) / 60))"
tail -1 "$RUN_DIR/sim_curve.log"
