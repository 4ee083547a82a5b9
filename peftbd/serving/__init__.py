"""Serving library (no Ray): OpenAI-compatible schemas, request validation, server-sent events,
per-request session state and speculative-decoding stats for the Ray Serve apps in `serve_apps/`."""
