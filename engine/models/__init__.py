"""A model's weights: where they come from, and llama.cpp's converters between them and GGUF.

- `sources`: a model source (`bundled`, a folder, a hub id) resolved to a local Hugging Face folder; the
  bundled GGUF is dequantised into one once, and its base GGUF written beside it for Try it;
- `convert`: llama.cpp's GGUF converters (where they are, and how they run in this process);
- `label`: ``python -m engine.models.label``, this computer's model label for ``sapling-relay --models``.

Below the round loop (engine/node/), which loads a model, and Try it and export (engine/gguf/),
which convert one: both import this package, and it imports only engine.common. Nothing is
imported here; torch and transformers only inside the functions that convert.
"""
