"""LoRA adapters on one base model: read from PEFT's format, held in slots, applied per row."""
