"""The package version, here so that every layer (the server's OpenAPI document, the MCP server's
handshake) can name it without importing the package root."""

__version__ = "0.1.0"
