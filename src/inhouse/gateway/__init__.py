"""Authenticated front door: keys, limits, audit, routing, health, fallback."""
