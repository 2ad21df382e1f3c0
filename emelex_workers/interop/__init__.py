"""Memory for every agent: other agents' histories in (`importer.py` over one reader per format), the store out and
back (`export_file.py`), and the MCP server over the store (`mcp_server.py`, needs the `mcp` extra)."""
