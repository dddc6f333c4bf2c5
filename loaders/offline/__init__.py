"""Offline tools: merge LoRAs into model files, extract LoRAs from two models."""
