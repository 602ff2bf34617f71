"""The fast decoder (engine/backends/decode.py and its model, cache and LoRA modules) against HF transformers and
peft, fp32 on the CPU.

- sampled tokens' log-probs equal a full HF forward of prompt + completion;
- greedy tokens equal HF `generate`'s;
- rows leaving the batch, or the batch split into chunks, change no completion;
- rows with different LoRA adapters in one batch get what each adapter alone gets;
- TorchBackend falls back to HF generate for what the decoder does not cover.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.harness.tiny import make_byte_tokenizer, make_sharp_model
from engine.backends import PromptCache, decode_model, kv_cache
from engine.backends.decode import DecodedRow, DecodeModel, LoraAdapter, can_pack, decode_batch, unsupported_reason
from engine.backends.kv_cache import partition
from engine.backends.torch_backend import TorchBackend
from engine.common.config import GRPOConfig
from engine.common.device import pick_device
from tests.engine.test_train_forward import fp32_logprob_tolerance

# Prompts of different lengths (prompt padding, groups and positions all differ), some sharing a
# prefix (its prefill is shared): one is a prefix of another, one appears twice.
PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11],
    [20, 21, 22],
    [5, 6, 7, 8, 9, 30, 31, 32, 33, 34, 35, 36],
    [20, 21, 22],
    [5, 6, 7],
]
NEW = 12
NO_EOS = -1


def tolerance(model: Any, rank: int = 0) -> float:
    """How far two fp32 computations of a decoded token's log-prob can differ: `fp32_logprob_tolerance`
    (tests/engine/test_train_forward.py) at these prompts' longest decode, at temperature 0.7 (the lowest here)."""
    return fp32_logprob_tolerance(model, max(len(prompt) for prompt in PROMPTS) + NEW, 0.7, rank)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def sharp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    folder = make_sharp_model(tmp_path_factory.mktemp(request.param), request.param)
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def forward_logprobs(model: Any, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    """The reference: one unpadded HF forward of prompt + completion."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def sample(model: DecodeModel, seed: int, eos: int, **options: Any) -> list[DecodedRow]:
    torch.manual_seed(seed)
    return decode_batch(model, PROMPTS, 3, NEW, eos, 0.7, **options)


def eos_ending_some_rows(model: DecodeModel) -> int:
    """A token the seed-0 sample draws early in some rows: used as EOS, rows then finish at different steps."""
    rows = sample(model, 0, NO_EOS)
    return rows[0].tokens[3]


@pytest.fixture(params=["one bucket", "a bucket per prompt length"])
def bucketing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Decode steps attend in one call, or in one per prompt length, each from its own first column."""
    if request.param == "one bucket":
        monkeypatch.setattr(kv_cache, "BUCKET_CALL_COLUMNS", 10**9)
    else:  # a free call and no column alignment: every distinct length is its own bucket at its own column
        monkeypatch.setattr(kv_cache, "BUCKET_CALL_COLUMNS", 0)
        monkeypatch.setattr(kv_cache, "COLUMN_ALIGN", 1)
    return str(request.param)


def test_prompts_are_split_into_runs_of_similar_length() -> None:
    # Two short prompts beside two long ones: two runs pay for their second attention call.
    assert partition([60, 60, 300, 300], tail=24) == [(0, 2), (2, 4)]
    # Nearly equal lengths: one call reads little more than two would.
    assert partition([100, 101, 102], tail=24) == [(0, 3)]
    assert partition([7], tail=0) == [(0, 1)]
    # The held-out set's lengths (27 questions): a few runs, each read from its own longest prompt.
    lengths = [60, 60, 60, 97, 98, 99, 100, 105, 109, 124, 124, 126, 152, 155, 156, 164, 167, 168, 239, 249, 249,
               267, 267, 267, 309, 309, 314]
    runs = partition(lengths, tail=24)
    assert 2 <= len(runs) <= 8 and runs[0][0] == 0 and runs[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    read = sum((end - first) * lengths[end - 1] for first, end in runs)
    assert read < 0.7 * len(lengths) * max(lengths)


def test_sampled_logprobs_equal_a_full_forward(sharp: Any, bucketing: str) -> None:
    model = DecodeModel(sharp, torch.float32)
    eos = eos_ending_some_rows(model)
    rows = sample(model, 0, eos)
    lengths = [len(r.tokens) for r in rows]
    assert min(lengths) <= 4 and max(lengths) == NEW, lengths  # rows left the batch while others ran on
    eps = tolerance(sharp)
    for i, row in enumerate(rows):
        assert row.finished == (row.tokens[-1] == eos)
        full = forward_logprobs(sharp, PROMPTS[i // 3], row.tokens, 0.7)
        assert row.logprobs == pytest.approx(full, rel=0, abs=eps)
    assert len({tuple(r.tokens) for r in rows[:3]}) > 1  # the 3 completions of a prompt are not copies
    # log-probs spread far beyond the tolerance: the comparison means something
    assert statistics.pstdev(lp for row in rows for lp in row.logprobs) > 100 * eps


def test_greedy_tokens_equal_hf_generate(sharp: Any, bucketing: str) -> None:
    model = DecodeModel(sharp, torch.float32)
    eos = eos_ending_some_rows(model)
    rows = decode_batch(model, PROMPTS, 1, NEW, eos, None)
    for prompt, row in zip(PROMPTS, rows, strict=True):
        out = sharp.generate(
            input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0,
        )[0, len(prompt) :].tolist()
        expected = out[: out.index(eos) + 1] if eos in out else out
        assert row.tokens == expected
        assert row.logprobs == []


@pytest.mark.parametrize("variant", [{"compact": False}, {"cache_bytes": 1}])
def test_leaving_rows_and_chunking_change_no_completion(sharp: Any, variant: dict[str, Any]) -> None:
    """compact=False keeps finished rows computing; cache_bytes=1 runs one prompt per chunk."""
    model = DecodeModel(sharp, torch.float32)
    eos = eos_ending_some_rows(model)
    steps: list[tuple[int, int]] = []
    usual = sample(model, 0, eos)
    other = sample(model, 0, eos, on_step=lambda done, total: steps.append((done, total)), **variant)
    assert len({len(r.tokens) for r in usual}) > 1
    assert [r.tokens for r in other] == [r.tokens for r in usual]
    eps = tolerance(sharp)
    for a, b in zip(other, usual, strict=True):
        assert a.finished == b.finished
        # Other batch shapes sum in another order: within the rounding of the sums (`tolerance`).
        assert a.logprobs == pytest.approx(b.logprobs, rel=0, abs=eps)
    chunks = len(PROMPTS) if "cache_bytes" in variant else 1
    assert {total for _, total in steps} == {NEW * chunks}
    assert [done for done, _ in steps] == sorted(done for done, _ in steps)


@pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32), reason="this torch has no oneDNN")
def test_weights_packed_for_onednn_give_what_plain_matmuls_give(sharp: Any) -> None:
    """The CPU fp32 default (packed) against F.linear on plain weights: same tokens, log-probs to float rounding.

    The reorder waits for the first decode step: the prompt pass runs on the plain weights.
    """
    packed, plain = DecodeModel(sharp, torch.float32), DecodeModel(sharp, torch.float32, packed=False)
    assert packed.packed and not plain.packed
    assert not packed.blocks[0].mats["qkv"][0].is_mkldnn and packed.pending
    eos = eos_ending_some_rows(plain)
    a, b = sample(packed, 0, eos), sample(plain, 0, eos)
    assert packed.blocks[0].mats["qkv"][0].is_mkldnn and packed.lm_head.is_mkldnn and not packed.pending
    assert not plain.blocks[0].mats["qkv"][0].is_mkldnn and not plain.pending
    assert [r.tokens for r in a] == [r.tokens for r in b] and len({len(r.tokens) for r in a}) > 1
    eps = tolerance(sharp)  # oneDNN's blocked matmuls sum in other orders than F.linear's
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, rel=0, abs=eps)
    greedy = [decode_batch(m, PROMPTS, 1, NEW, eos, None) for m in (packed, plain)]
    assert [r.tokens for r in greedy[0]] == [r.tokens for r in greedy[1]]


def test_a_onednn_that_cannot_reorder_falls_back_to_plain_matmuls(
    sharp: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []
    reorder = decode_model.pack_weight if can_pack(torch.device("cpu"), torch.float32) else (lambda weight: weight)

    def refuse_the_third(weight: torch.Tensor) -> torch.Tensor:
        calls.append(weight.shape)
        if len(calls) == 3:
            raise RuntimeError("unsupported layout")
        return reorder(weight)

    monkeypatch.setattr(decode_model, "can_pack", lambda device, dtype: True)
    monkeypatch.setattr(decode_model, "pack_weight", refuse_the_third)
    model = DecodeModel(sharp, torch.float32)
    plain = DecodeModel(sharp, torch.float32, packed=False)
    with caplog.at_level(logging.WARNING, logger="engine.backends.decode_model"):
        tokens = [r.tokens for r in decode_batch(model, PROMPTS, 1, NEW, NO_EOS, None)]
    assert len(calls) == 3 and not model.packed and "plain matmuls" in caplog.text
    assert tokens == [r.tokens for r in decode_batch(plain, PROMPTS, 1, NEW, NO_EOS, None)]
    calls.clear()
    explicit = DecodeModel(sharp, torch.float32, packed=True)
    with pytest.raises(RuntimeError, match="unsupported layout"):  # asked for explicitly: the error stands
        decode_batch(explicit, PROMPTS, 1, NEW, NO_EOS, None)


def test_the_same_seed_gives_the_same_completions_and_another_seed_others(sharp: Any) -> None:
    model = DecodeModel(sharp, torch.float32)
    first, again, other = sample(model, 5, NO_EOS), sample(model, 5, NO_EOS), sample(model, 6, NO_EOS)
    assert [r.tokens for r in first] == [r.tokens for r in again]
    assert [r.tokens for r in first] != [r.tokens for r in other]


def test_a_temperature_per_prompt_samples_each_prompt_as_its_own_temperature_would(sharp: Any) -> None:
    """The experiment samples every node at its own temperature in one batch (questions/heat.py): a prompt's rows,
    tokens and log-probs, are those of a call at its temperature alone, with the same seeds."""
    model = DecodeModel(sharp, torch.float32)
    heats = [0.7, 1.3, 0.7, 2.0, 1.3]
    mixed = decode_batch(model, PROMPTS, 3, NEW, NO_EOS, 0.7, adapter_index=[0] * len(PROMPTS), seeds=[9],
                         temperatures=heats)
    for heat in set(heats):
        alone = decode_batch(model, PROMPTS, 3, NEW, NO_EOS, heat, adapter_index=[0] * len(PROMPTS), seeds=[9])
        for i, t in enumerate(heats):
            if t == heat:
                assert [r.tokens for r in mixed[i * 3 : i * 3 + 3]] == [r.tokens for r in alone[i * 3 : i * 3 + 3]]
                for m, a in zip(mixed[i * 3 : i * 3 + 3], alone[i * 3 : i * 3 + 3], strict=True):
                    # Exact: the same batch (shapes, rows, kernels) and seeds; only the division by the temperature
                    # differs, by a per-row tensor against one scalar, and both are the same IEEE division.
                    assert m.logprobs == a.logprobs
    with pytest.raises(ValueError, match="one temperature above 0 per prompt"):
        decode_batch(model, PROMPTS, 1, 2, NO_EOS, 0.7, temperatures=[0.7])
    with pytest.raises(ValueError, match="only when sampling"):
        decode_batch(model, PROMPTS, 1, 2, NO_EOS, None, temperatures=[0.7] * len(PROMPTS))


def test_a_prompt_cache_lets_the_next_call_answer_without_reading_its_prompts_again(sharp: Any) -> None:
    """Probing's second call (engine/questions/probe.py): the chosen prompts' keys, values and last logits come from the
    first call, no prefill runs, and the rows are those of a call that reads the prompts itself."""
    model = DecodeModel(sharp, torch.float32)
    read = PromptCache()
    decode_batch(model, PROMPTS, 2, NEW, NO_EOS, 0.7, adapter_index=[0] * len(PROMPTS), seeds=[3], prompt_cache=read)
    assert (len(read), read.hits) == (4, 0)  # [20, 21, 22] twice: one state
    chosen = [PROMPTS[2], PROMPTS[4], PROMPTS[1]]  # a subset, in another order, so other chunks and packs
    expected = decode_batch(model, chosen, 3, NEW, NO_EOS, 0.7, adapter_index=[0] * 3, seeds=[4])
    prefills: list[int] = []
    prefill = model.prefill
    model.prefill = lambda *a, **k: prefills.append(1) or prefill(*a, **k)  # type: ignore[method-assign]
    again = decode_batch(model, chosen, 3, NEW, NO_EOS, 0.7, adapter_index=[0] * 3, seeds=[4], prompt_cache=read)
    assert (prefills, read.hits) == ([], 3)
    assert [r.tokens for r in again] == [r.tokens for r in expected]
    eps = tolerance(sharp)  # the cached prompts were read in another batch: other sums, other orders
    for a, e in zip(again, expected, strict=True):
        assert a.logprobs == pytest.approx(e.logprobs, rel=0, abs=eps)
    # A prompt not read before is read, beside one that was; both then sample as without the cache.
    mixed = [PROMPTS[0], [40, 41, 42, 43]]
    expected = decode_batch(model, mixed, 2, NEW, NO_EOS, None)
    assert [r.tokens for r in decode_batch(model, mixed, 2, NEW, NO_EOS, None, prompt_cache=read)] == \
        [r.tokens for r in expected]
    assert (len(prefills), read.hits, len(read)) == (2, 4, 5)


def test_a_stop_raised_by_on_step_ends_decoding(sharp: Any) -> None:
    class Stop(Exception):
        pass

    def on_step(done: int, total: int) -> None:
        if done >= 2:
            raise Stop

    with pytest.raises(Stop):
        decode_batch(DecodeModel(sharp, torch.float32), PROMPTS, 2, NEW, NO_EOS, 0.7, on_step=on_step)


# -- per-row LoRA adapters -----------------------------------------------------------------


@pytest.fixture(scope="module")
def three_adapters(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A peft llama with three adapters: rank 4 on every projection, rank 8 on every projection, rank 8 on q/v only."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = make_sharp_model(tmp_path_factory.mktemp("lora"), "llama")
    base = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with warnings.catch_warnings():  # peft asks for a deprecated transformers property (as in torch_backend.py)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"), adapter_name="a0")
    model.add_adapter("a1", LoraConfig(r=8, lora_alpha=8, target_modules="all-linear"))
    model.add_adapter("a2", LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:  # lora_B starts at zero: give every adapter a real effect
                param.copy_(torch.randn(param.shape, generator=generator) * 0.15)
    return model.eval()


def test_a_prompt_cache_keeps_each_adapters_reading_of_a_prompt_apart(three_adapters: Any) -> None:
    """The experiment's probing: one cache for every node's rows, the same prompt read under each node's adapter."""
    adapters = [LoraAdapter.from_peft(three_adapters, name) for name in ("a0", "a1")]
    base = DecodeModel(three_adapters, torch.float32)
    prompts, index = [PROMPTS[0], PROMPTS[0], PROMPTS[1]], [0, 1, 1]
    read = PromptCache()
    decode_batch(base, prompts, 1, NEW, NO_EOS, 0.7, adapters=adapters, adapter_index=index, seeds=[1, 2],
                 prompt_cache=read)
    assert len(read) == 3
    expected = decode_batch(base, prompts, 2, NEW, NO_EOS, 0.7, adapters=adapters, adapter_index=index, seeds=[3, 4])
    again = decode_batch(base, prompts, 2, NEW, NO_EOS, 0.7, adapters=adapters, adapter_index=index, seeds=[3, 4],
                         prompt_cache=read)
    assert read.hits == 3 and [r.tokens for r in again] == [r.tokens for r in expected]
    assert expected[0].tokens != expected[2].tokens or expected[1].tokens != expected[3].tokens  # adapters differ


def test_rows_with_different_adapters_get_what_each_adapter_alone_gets(three_adapters: Any) -> None:
    names = ["a0", "a1", "a2"]
    adapters = [LoraAdapter.from_peft(three_adapters, name) for name in names]
    base = DecodeModel(three_adapters, torch.float32)  # the frozen base under the adapters
    prompts = [*PROMPTS, [50, 51, 52, 53, 54]]
    index = [2, 0, 1, 0, 2, 1]  # [5, 6, 7] (adapter 2) is a prefix of prompts of adapters 2 and 1
    seeds = [11, 12, 13]
    mixed = decode_batch(base, prompts, 2, NEW, NO_EOS, 0.7, adapters=adapters, adapter_index=index, seeds=seeds)
    greedy_mixed = decode_batch(base, prompts, 1, NEW, NO_EOS, None, adapters=adapters, adapter_index=index)
    # Each row's log-probs against three other computations of them, within `tolerance` of a rank-8 adapter's
    # sums; merged weights (W + s * B @ A) round once more on each projection, over the rank and in the addition.
    eps, eps_merged = tolerance(three_adapters, rank=8), tolerance(three_adapters, rank=2 * 8 + 1)
    for a, name in enumerate(names):
        mine = [i for i, x in enumerate(index) if x == a]
        mine_prompts = [prompts[i] for i in mine]
        alone = decode_batch(base, mine_prompts, 2, NEW, NO_EOS, 0.7, adapters=[adapters[a]],
                             adapter_index=[0] * len(mine), seeds=[seeds[a]])
        merged = decode_batch(DecodeModel(three_adapters, torch.float32, merge=adapters[a]), mine_prompts, 2, NEW,
                              NO_EOS, 0.7, seeds=[seeds[a]])
        greedy_alone = decode_batch(base, mine_prompts, 1, NEW, NO_EOS, None, adapters=[adapters[a]],
                                    adapter_index=[0] * len(mine))
        three_adapters.set_adapter(name)
        for k, i in enumerate(mine):
            assert greedy_mixed[i].tokens == greedy_alone[k].tokens
            for j in range(2):
                row, solo, flat = mixed[2 * i + j], alone[2 * k + j], merged[2 * k + j]
                assert row.tokens == solo.tokens == flat.tokens
                full = forward_logprobs(three_adapters, prompts[i], row.tokens, 0.7)
                assert row.logprobs == pytest.approx(solo.logprobs, rel=0, abs=eps)
                assert row.logprobs == pytest.approx(flat.logprobs, rel=0, abs=eps_merged)
                assert row.logprobs == pytest.approx(full, rel=0, abs=eps)
    # The adapters really differ: the same prompt under two adapters gives other log-probs.
    three_adapters.set_adapter("a0")
    a0 = forward_logprobs(three_adapters, prompts[0], mixed[0].tokens, 0.7)
    assert max(abs(x - y) for x, y in zip(a0, mixed[0].logprobs, strict=True)) > max(0.1, 10 * eps_merged)


def test_an_adapter_reads_the_same_from_a_peft_state_dict(three_adapters: Any) -> None:
    from peft import get_peft_model_state_dict

    live = LoraAdapter.from_peft(three_adapters, "a1")
    saved = LoraAdapter.from_state_dict(get_peft_model_state_dict(three_adapters, adapter_name="a1"), scaling=1.0)
    assert live.weights.keys() == saved.weights.keys() and len(live.weights) == 2 * 7
    for key, (a, b, scaling) in live.weights.items():
        assert scaling == 1.0 and torch.equal(a, saved.weights[key][0]) and torch.equal(b, saved.weights[key][1])
    with pytest.raises(ValueError, match="no LoRA adapter"):
        LoraAdapter.from_peft(three_adapters, "missing")


# -- coverage and the backend ---------------------------------------------------------------


def test_unsupported_models_are_named() -> None:
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    assert unsupported_reason(LlamaConfig()) is None and unsupported_reason(Qwen2Config()) is None
    assert "gpt2" in str(unsupported_reason(GPT2Config()))
    assert "dynamic" in str(unsupported_reason(LlamaConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                            "rope_theta": 1e4})))
    assert "sliding" in str(unsupported_reason(Qwen2Config(use_sliding_window=True, max_window_layers=0)))
    assert "gelu" in str(unsupported_reason(LlamaConfig(hidden_act="gelu")))


def test_the_backend_falls_back_to_hf_generate_with_a_log_line(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    tok = make_byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    backend = TorchBackend(tmp_path, pick_device("cpu"), GRPOConfig(precision="fp32"), 0, 1.0)
    prompt = backend.encode_prompt([{"role": "user", "content": "x"}])
    with caplog.at_level(logging.INFO, logger="engine.backends.torch_backend"):
        completions = backend.generate([prompt], 2, 5, 1.0)
        answers = backend.greedy([prompt], 5)
    assert len(completions) == 2 and len(answers) == 1
    warning = "Sampling with HF generate: the fast decoder does not support rope type 'dynamic'."
    assert [r.message for r in caplog.records].count(warning) == 1


def test_the_backends_per_adapter_call_takes_peft_names_and_adapters(tiny_model_dir: Path) -> None:
    backend = TorchBackend(tiny_model_dir, pick_device("cpu"), GRPOConfig(precision="fp32"), 0, 1.0)
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    prompts = [backend.encode_prompt([{"role": "user", "content": c}]) for c in ("2 + 2?", "Hi")]
    own = backend.greedy(prompts, 8)
    both = backend.generate_with_adapters(
        prompts, 1, 8, None, ["default", LoraAdapter.from_peft(backend.model)], adapter_index=[0, 1],
    )
    assert [c.text for c in both] == own
    sampled = backend.generate_with_adapters(prompts, 2, 8, 1.0, ["default"], adapter_index=[0, 0], seeds=[4])
    again = backend.generate_with_adapters(prompts, 2, 8, 1.0, ["default"], adapter_index=[0, 0], seeds=[4])
    assert [c.token_ids for c in sampled] == [c.token_ids for c in again]
    assert all(len(c.logprobs) == len(c.token_ids) for c in sampled)


def test_bf16_attention_takes_the_math_kernel_where_torchs_kernels_lack_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's fused CPU attention packs bf16 for VNNI only with its AVX512 kernels (ATEN_CPU_CAPABILITY=avx2
    raised "pack_vnni2 is only supported when avx512 is supported"); without them the math kernel answers.
    Tolerance: bf16 keeps 8 bits of mantissa, so each input is within 2**-8 of itself relative; a softmax-weighted
    mean of values of size about 1 then carries a few such roundings: 4 * 2**-8 of the largest value."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from engine.backends import decode_model

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 37, 64, generator=gen) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        truth = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    used: list[bool] = []
    real = decode_model.sdpa_kernel
    monkeypatch.setattr(decode_model, "sdpa_kernel", lambda backend: (used.append(True), real(backend))[1])
    monkeypatch.setattr(decode_model, "_avx512_kernels", lambda: False)
    out = decode_model.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert used == [True] and out.dtype == torch.bfloat16
    assert float((out.float() - truth).abs().max()) <= 4 * 2**-8 * float(v.abs().max())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the training step: fp32 inputs, bf16 inside
        decode_model.attention(q, k, v, is_causal=True)
    assert used == [True, True]
    monkeypatch.setattr(decode_model, "_avx512_kernels", lambda: True)
    decode_model.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    decode_model.attention(q, k, v, is_causal=True)
    assert used == [True, True]  # with them, or in fp32, the fused kernel
