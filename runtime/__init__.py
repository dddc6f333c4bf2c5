"""Headless runtime: graph executor, workflow conversion, model registry, HTTP/WebSocket server, CLI."""
