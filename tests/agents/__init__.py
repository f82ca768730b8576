"""Agents that tests run in separate worker processes (imported as MODULE:AGENT)."""
