"""Glue for what runs agents from outside: Faust and Quix pipelines, MCP clients."""
