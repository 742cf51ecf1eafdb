"""What runs inside each rank. Plain PyTorch and transformers; never imports pytest."""
