"""Training: accelerate + DeepSpeed on NPU, CUDA or CPU.

    loop.py         train(cfg): the algorithm, top to bottom (run folder, data, model, Trainer, loop)
    trainer.py      Trainer: step / log / evaluate / save / resume; its "batches and outputs" methods
                    are where it meets the batch type and the model's outputs
    checkpoint_manager.py  CheckpointManager: a run's saves, resumes and policy exports
    divergence.py   NaN forensics: stop a diverged run before anything is logged or saved, say where to look
    distributed.py  everything accelerate- or DeepSpeed-specific (accelerator, clipping, grad norm,
                    state save/load, ZeRO-3 gathering), behind small functions
    stream.py       BatchStream: endless micro-batches and the data cursor checkpoints save
    budget.py       TrainClock: training seconds, the wall-time budget and time checkpoints they drive
    checkpoint.py   checkpoint layout, atomic commit, resume lookup, config fingerprint
    resume.py       which checkpoint a run continues from, and whether it is whole
    run_folder.py   refusing a run before anything is written; config.yaml
    init_from.py    trainer.init_from: a fresh run from another run's trained weights
    ema.py          trainer.ema: the moving average of the trained weights
    evaluate.py     held-out action MSE in eval mode
    optim.py        freezing, per-module LR groups, AdamW, LR schedule
    metrics.py      metrics.jsonl / tensorboard / wandb, throughput window, loss.png
    cli.py          `python -m dit4dit_npu.train` (dit4dit-train); errors.py: TrainingError

The ops tools: run before or after a training run, not by it. Each is a package command; the
flags of the memory planner, fit_tiny_vae and the success curve are parsed in ops_cli.py, those of
latent statistics in data/cli.py.

    memory planner  will a config's run fit the card? Per-card memory of the real model under ZeRO
                    0/2/3, with and without gradient checkpointing (memory_plan.py; its activation
                    measurements activations.py, a CPU host process host_memory.py); `python -m dit4dit_npu.doctor` reads its --json.
                        python -m dit4dit_npu.train.memory_plan --config CFG [--zero 2] [--world-size 8]
                        (dit4dit-memory-plan; --smoke: seconds, tiny sizes)
    fit_tiny_vae    fit the tiny random VAE to a config's training frames, a stand-in for the real
                    pretrained Wan VAE; writes the weights, their latent statistics and a picture
                    (fit_tiny_vae.py).
                        python -m dit4dit_npu.train.fit_tiny_vae --config CFG --out VAE.safetensors
                        (dit4dit-fit-tiny-vae)
    latent statistics  the per-channel latent mean/std of the config's tiny VAE on its training
                    images, as config lines to paste (dit4dit_npu/data/latent_stats.py).
                        python -m dit4dit_npu.data.latent_stats --config CFG (dit4dit-data-latent-stats)
    success curve   closed-loop success of every saved checkpoint of a run in the ALOHA simulator,
                    beside its held-out error at the same steps (success_curve.py); several runs on one
                    figure, against training wall time with --x time.
                        python -m dit4dit_npu.train.success_curve --run RUN (dit4dit-sim-success-curve)
    grad split      a joint run's action and video gradients apart, per part of the model, at its
                    checkpoints: their norms and cosine where both train the backbone (grad_split.py).
                        python -m dit4dit_npu.train.grad_split --run RUN

The run's prompt-embedding cache (encoded once before the first step) is dit4dit_npu/weights/prompt_cache.py.
"""
