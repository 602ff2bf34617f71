"""Try it and GGUF export: llama.cpp's side of the engine (chat, cache, export, merge).

- `chat`: `sapling-node chat`, the Try it child: questions, and answers from the trained and the base model;
- `cache`: the GGUF files Try it answers from (`ExportCache`): exported in child processes, merged, pruned;
- `export`: `sapling-node export`: a merged Hugging Face folder, a GGUF file or a GGUF LoRA of a checkpoint;
- `merge`: a LoRA adapter GGUF merged into its base model's GGUF, with numpy.

Built on the node's pieces (its checkpoints, settings flags, seeds and metrics, engine/node/) and on
the models (engine/models/: sources, and llama.cpp's converters), never on the round loop itself
(tests/test_boundaries.py).

Nothing is imported here, so `import engine.gguf.export` stays as cheap as
that module; llama_cpp is imported only by `chat`, inside the functions that
answer, and torch only by an export that needs it.
"""
