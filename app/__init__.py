"""Sapling desktop app (PySide6). Talks to the engine only through engine.events."""
