"""Training: accelerate + DeepSpeed on NPU, CUDA or CPU.

    loop.py         train(cfg): the algorithm, top to bottom (run folder, data, model, Trainer, loop)
    trainer.py      Trainer: step / log / evaluate / save / resume, and the batch/loss touch points
    checkpoint_manager.py  CheckpointManager: a run's saves, resumes and policy exports
    divergence.py   NaN forensics: stop a diverged run before anything is logged or saved, say where to look
    distributed.py  everything accelerate- or DeepSpeed-specific (accelerator, clipping, grad norm,
                    state save/load, ZeRO-3 gathering), behind small functions
    stream.py       BatchStream: endless micro-batches and the data cursor checkpoints save
    checkpoint.py   checkpoint layout, atomic commit, resume lookup, config fingerprint
    run_folder.py   refusing a run before anything is written; config.yaml
    evaluate.py     held-out action MSE in eval mode
    optim.py        freezing, per-module LR groups, AdamW, LR schedule
    metrics.py      metrics.jsonl / tensorboard / wandb, throughput window, loss.png
    cli.py          `python -m dit4dit_npu.train`; errors.py: TrainingError

The run's prompt-embedding cache (encoded once before the first step) is dit4dit_npu/weights/prompt_cache.py.
"""
