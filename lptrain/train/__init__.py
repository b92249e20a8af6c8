"""The BSP-SGD trainer: replicas with flat buffers, the training loop, timing, checkpoints."""
