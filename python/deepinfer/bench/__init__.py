"""Benchmarks shipped with DeepInfer: ``deepinfer bench serve`` (deepinfer.bench.serve)."""
