"""Training: GRPO-family trainers (native PyTorch and verl + Ray), SFT, rollouts."""
