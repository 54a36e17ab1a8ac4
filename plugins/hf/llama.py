"""Converter placeholder: filled in by the converters work (llama family)."""

CONVERTERS: dict = {}
