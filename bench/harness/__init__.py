"""What the benches and the tests share: loopback servers and tiny models (bench/ never imports tests/).

- `servers`: free loopback ports, waiting for a child to listen, stopping it, a redis-server without persistence;
- `tiny`: tiny random models with a byte-level tokenizer, built from a config (nothing downloaded).
- `args`: command-line helpers (comma-separated numbers, refused in one sentence).

The tests import them from here (tests/conftest.py's fixtures among them); tests/test_boundaries.py checks that
no bench/ module imports tests/.
"""
