"""Who may talk to an HTTP face (floor 4): ``api_keys`` (keys, their principals and
roles) and ``http_guard`` (Host and Origin checks, the principal of a request). The
gateway, the UI and the MCP server use them."""
