"""Glue for what runs agents from outside (floor 9): Faust and Quix pipelines, and our
tools and agents served as one MCP server (``mcp_server``) to MCP clients."""
