"""Where a tensor's bytes live (tiers, fastest first) and who computes from them."""

GPU, RAM, DISK = "gpu", "ram", "disk"
CPU = "cpu"  # a compute location (with GPU)
TIERS = (GPU, RAM, DISK)
