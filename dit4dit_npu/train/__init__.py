"""Training: accelerate + DeepSpeed loop, optimizer and schedule, checkpoints, metrics."""
