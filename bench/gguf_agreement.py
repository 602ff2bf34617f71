"""Do GGUF exports answer like the torch model? Greedy answers to 10 fixed prompts, per GGUF type.

    .venv/bin/python -m bench.gguf_agreement --home DIR [--tokens 48] [--quants f16,bf16,q8_0,f32] [--kv f32|f16]

Exports the newest checkpoint of the run in DIR (bundled SmolLM2-135M unless
its config says otherwise) as a merged HF folder (fp32: exactly the
checkpoint's weights) and as GGUF files of each type asked for (f16, bf16 and q8_0 by
default), then compares greedy
continuations of the same prompt tokens: torch fp32 from the HF folder, and
llama-cpp-python from each GGUF. Prints, per format, how many of the 10
answers are identical, the share of tokens before the first difference, and
for each answer that differs how far apart torch's logits for the two tokens
were where the answers part (a near tie, or a real disagreement).
llama.cpp keeps its KV cache in f32, as Try it does; `--kv f16` is
llama.cpp's own default (and Ollama's, LM Studio's).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.common.config_file import build_config
from engine.common.paths import Paths
from engine.gguf.export import QUANTS, export_model

PROMPTS = [
    "What is 17 + 25?",
    "Name three colours.",
    "Convert 12 to binary.",
    "Is 2024 a leap year?",
    "Simplify the fraction 6/8.",
    "What day comes after Monday?",
    "Write the word sapling backwards.",
    "What is 3.5 + 1.2?",
    "Say hello in French.",
    "Count from one to five.",
]


def torch_greedy(folder: Path, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=tokens, eos_token_id=eos, pad_token_id=eos)
            row = ids[0, len(prompt):].tolist()
            out.append(row[: row.index(eos)] if eos in row else row)
    return out


def tie_margins(folder: Path, prompts: list[list[int]], want: list[list[int]], got: list[list[int]]) -> list[float]:
    """For each answer that differs: torch's logit for its own token minus its logit for llama.cpp's, where they part.

    A small margin is a near tie: any change in rounding can turn it, so the
    difference says nothing about the conversion. Answers that stop at
    different lengths (one ends where the other goes on) are left out.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    margins = []
    with torch.no_grad():
        for prompt, a, b in zip(prompts, want, got, strict=True):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            if n == min(len(a), len(b)):
                continue
            logits = model(torch.tensor([prompt + a[:n]])).logits[0, -1]
            margins.append(float(logits[a[n]] - logits[b[n]]))
    return margins


def llama_greedy(path: Path, prompts: list[list[int]], tokens: int, kv: str = "f32") -> list[list[int]]:
    from llama_cpp import GGML_TYPE_F16, GGML_TYPE_F32, Llama

    from engine.gguf.chat import greedy_tokens

    kv_type = GGML_TYPE_F32 if kv == "f32" else GGML_TYPE_F16
    llm = Llama(model_path=str(path), n_ctx=1024, n_threads=2, type_k=kv_type, type_v=kv_type, verbose=False)
    out = []
    for prompt in prompts:
        row: list[int] = []
        for token in greedy_tokens(llm, prompt):
            if token == llm.token_eos() or len(row) == tokens:
                break
            row.append(token)
        out.append(row)
    llm.close()
    return out


def agreement(want: list[list[int]], got: list[list[int]]) -> tuple[int, float]:
    same = sum(a == b for a, b in zip(want, got, strict=True))
    prefix = 0
    for a, b in zip(want, got, strict=True):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix += n
    return same, prefix / max(1, sum(len(a) for a in want))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--kv", choices=("f16", "f32"), default="f32",
                        help="llama.cpp's KV cache type (f32: Try it's; f16: llama.cpp's own default)")
    parser.add_argument("--quants", default="f16,bf16,q8_0", help="GGUF types to compare, from " + ", ".join(QUANTS))
    args = parser.parse_args()
    quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    if not quants or any(q not in QUANTS for q in quants):
        parser.error(f"--quants takes a comma-separated list from {', '.join(QUANTS)}")
    from transformers import AutoTokenizer

    paths = Paths.under(args.home)
    config = build_config("default", paths.config_file if paths.config_file.is_file() else None, ["run.device='cpu'"])
    print(f"$ {sys.executable} -m bench.gguf_agreement {' '.join(sys.argv[1:])}")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        t0 = time.monotonic()
        hf = export_model(config, paths, work / "hf", "hf")
        print(f"round {hf.round}: HF folder in {time.monotonic() - t0:.0f} s")
        tok = AutoTokenizer.from_pretrained(str(hf.path))
        encoded: list[Any] = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                      tokenize=True) for p in PROMPTS]
        prompts = [list(enc["input_ids"]) for enc in encoded]
        want = torch_greedy(hf.path, prompts, args.tokens)
        for quant in quants:
            t0 = time.monotonic()
            gguf = export_model(config, paths, work / f"m.{quant}.gguf", "gguf", quant)
            took = time.monotonic() - t0
            got = llama_greedy(gguf.path, prompts, args.tokens, args.kv)
            same, prefix = agreement(want, got)
            margins = tie_margins(hf.path, prompts, want, got)
            ties = ", ".join(f"{m:.3f}" for m in margins) or "none"
            print(f"{quant}: {gguf.bytes / 1e6:.0f} MB, exported in {took:.0f} s; {same}/10 greedy answers identical "
                  f"to torch fp32, {100 * prefix:.1f}% of tokens before the first difference; where they part, "
                  f"torch's top logit leads llama.cpp's pick by {ties}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
