"""Sapling desktop app (PySide6): a thin layer over the engine, run as a child process.

It talks to the engine only through JSON lines (`engine.events`); besides that
it imports just the engine's stdlib-only helpers: `engine.paths` (where
things live), `engine.atomicio` (atomic writes), `engine.config` (validating
config.toml as the engine will) and `engine.errors`. It never trains and never
imports torch. Module map: docs/app.md.
"""
