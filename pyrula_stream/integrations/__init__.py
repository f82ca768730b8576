"""Glue for stream processors that put agents inside their pipelines (Faust, Quix)."""
