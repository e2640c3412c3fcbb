"""Training: sharding, optimizer, steps, checkpoints, metrics and the train loop."""
