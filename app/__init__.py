"""Sapling desktop app (PySide6): a thin layer over the engine, run as a child process.

It talks to the engine through JSON lines (`engine.common.events`) and imports
nothing else of the engine but `engine.common` (where things live, atomic
writes, config.toml validated as the engine will, invites, errors). It never
trains and never imports torch. Module map: docs/app.md.
"""
