"""Held-out evaluation against the decoder's KV cache budget: time and peak RSS, one child process per budget.

    .venv/bin/python -m bench.eval_cache                          # 108 questions, 512 and 1024 MiB
    .venv/bin/python -m bench.eval_cache --questions 54 --cache-mib 256,512,1024

Each budget runs in its own process (peak RSS is per process): it loads the
bundled model as a node does, builds the held-out prompts the node uses
(`TaskSet.eval_messages`), and times one greedy pass through
`TorchBackend.decode_rows` with that `cache_bytes`. It prints the number of
chunks the prompts fall into, the seconds, the peak RSS, and each budget's
time against the first one's, measured in the same run. The answers of every
budget must be the same, and the bench says whether they are.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def child(questions: int, cache_mib: int, threads: int) -> dict[str, object]:
    import torch

    from engine.backends.torch_backend import TorchBackend
    from engine.common.config_file import build_config
    from engine.common.device import pick_device
    from engine.common.paths import Paths
    from engine.models.sources import resolve_model_dir
    from engine.questions.tasks import TaskSet

    if threads:
        torch.set_num_threads(threads)
    cfg = build_config("default", None, ["run.seed=0"])
    taskset = TaskSet(cfg.tasks.specialties, cfg.tasks.dataset_configs, seed=cfg.run.seed)
    model_dir = resolve_model_dir(cfg.model.source, Paths.default().models_cache, None)
    backend = TorchBackend(model_dir, pick_device("cpu"), cfg.grpo, cfg.run.seed, cfg.tasks.temperature)
    prompts = [backend.encode_prompt(taskset.eval_messages(q)) for q in taskset.eval_set(questions)]
    budget = cache_mib * 2**20
    totals: list[int] = []  # decode_batch reports max_new_tokens x its chunks as the progress total
    started = time.perf_counter()
    rows = backend.decode_rows(prompts, 1, cfg.tasks.max_new_tokens, None, lambda done, total: totals.append(total),
                                cache_bytes=budget)
    seconds = time.perf_counter() - started
    return {"cache_mib": cache_mib, "chunks": totals[-1] // cfg.tasks.max_new_tokens, "seconds": seconds,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
            "answers": [r.tokens for r in rows]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=108)
    parser.add_argument("--cache-mib", default="512,1024")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, as the engine)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.questions, args.child, args.threads)))
        return 0
    results = []
    for mib in [int(x) for x in args.cache_mib.split(",") if x]:
        out = subprocess.run([sys.executable, "-m", "bench.eval_cache", "--questions", str(args.questions),
                              "--threads", str(args.threads), "--child", str(mib)],
                             check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    first = results[0]
    print(f"eval_cache: {args.questions} held-out questions, greedy, one process per KV cache budget")
    for r in results:
        print(f"  {r['cache_mib']:>5} MiB: {r['chunks']} chunks, {r['seconds']:.1f} s, peak RSS {r['peak_rss_gb']:.2f} "
              f"GB, time / {first['cache_mib']} MiB's = {r['seconds'] / first['seconds']:.2f}")
    same = all(r["answers"] == first["answers"] for r in results)
    print(f"answers identical across budgets: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
