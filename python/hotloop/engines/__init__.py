"""Inference engines: prompt token ids in, sampled token ids out (see base.py)."""
