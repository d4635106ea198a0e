"""The GPU benchmark (``python -m benchmarks.gpu``): HF engine decode and one LoRA GRPO step per model
size, models of real architectures with random weights built from ``configs/``; a tiny CPU smoke run
without CUDA."""
