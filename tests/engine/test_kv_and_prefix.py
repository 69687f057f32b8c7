"""Slot KV cache and prefix cache on the real model: rows that leave and join keep every other
row's tokens exact, and a prefix-cache hit computes the same continuation as a full prefill."""
import pytest
import torch

from worker.engine.runner_hf import HFModelRunner

pytestmark = pytest.mark.slow
SYSTEM = ("You are a meticulous assistant for a shipping company. Answer briefly, cite the policy "
          "section you rely on, never invent tracking numbers, and ask for the order id when it is "
          "missing. Policies: returns within 30 days; refunds in 5 business days; fragile items "
          "need photos of the damage.")


def greedy(runner, prompts: dict[str, list[int]], steps: int, join: dict[int, tuple[str, list[int]]] = {},
           leave: dict[int, str] = {}) -> dict[str, list[int]]:
    """Drive the runner directly: prefill, then greedy decode; requests join/leave at given steps."""
    out = {rid: [] for rid in prompts}
    logits = runner.prefill(list(prompts), list(prompts.values()))
    for rid, row in zip(prompts, logits):
        out[rid].append(int(row.argmax()))
    for step in range(steps):
        if step in leave:
            runner.release([leave[step]])
        if step in join:
            rid, prompt = join[step]
            out[rid] = [int(runner.prefill([rid], [prompt])[0].argmax())]
        logits = runner.decode({rid: out[rid][-1] for rid in runner.rows})
        for rid, row in zip(list(runner.rows), logits):
            out[rid].append(int(row.argmax()))
    runner.release(list(runner.rows))
    return out


@pytest.fixture(scope="module")
def builder(model_ref):
    from common.prompting import PromptBuilder
    return PromptBuilder(model_ref.path, 4096)


def chat(builder, user, system=None):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return builder.build(messages, None)[1]


def test_rows_leaving_and_joining_do_not_disturb_others(model_ref, builder):
    torch.set_num_threads(2)
    runner = HFModelRunner(model_ref.path, "float32", max_batch_size=4)
    a, b, c = chat(builder, "Count from one to ten."), chat(builder, "Name the planets."), chat(builder, "Hi")
    alone = {rid: greedy(runner, {rid: p}, 12)[rid] for rid, p in (("a", a), ("b", b), ("c", c))}
    mixed = greedy(runner, {"a": a, "b": b}, 12, join={3: ("c", c)}, leave={6: "a"})
    assert mixed["b"] == alone["b"]
    assert mixed["a"] == alone["a"][:7]  # up to the step it left
    assert mixed["c"] == alone["c"][:len(mixed["c"])]
    assert runner.rows == [] and runner.cache.lengths == []


def test_prefix_cache_hit_gives_the_same_continuation(model_ref, builder):
    plain = HFModelRunner(model_ref.path, "float32")
    cached = HFModelRunner(model_ref.path, "float32", prefix_cache_tokens=4096, prefix_block_size=16)
    first, second = chat(builder, "Where is my parcel?", SYSTEM), chat(builder, "Can I return a lamp?", SYSTEM)
    greedy(cached, {"first": first}, 2)
    assert cached.prefix.stats.hit_tokens == 0 and len(cached.prefix) > 0
    with_hit = greedy(cached, {"second": second}, 16)["second"]
    assert cached.prefix.stats.hit_tokens >= 48  # the shared system prompt was reused
    assert with_hit == greedy(plain, {"second": second}, 16)["second"]


def test_bfloat16_agrees_with_float32_within_tolerance(model_ref, builder):
    """bf16 is the default on CPUs with native BF16; teacher-forced top-1 agreement must stay high."""
    from transformers import AutoModelForCausalLM

    f32 = AutoModelForCausalLM.from_pretrained(model_ref.path, dtype=torch.float32).eval()
    b16 = AutoModelForCausalLM.from_pretrained(model_ref.path, dtype=torch.bfloat16).eval()
    agree = total = 0
    with torch.inference_mode():
        for question in ("What is the capital of France?", "Explain gravity.", "Describe a cat."):
            ids = torch.tensor([chat(builder, question)])
            seq = f32.generate(ids, max_new_tokens=32, do_sample=False)
            ref = f32(seq).logits[0, ids.shape[1] - 1:-1].argmax(-1)
            got = b16(seq).logits[0, ids.shape[1] - 1:-1].float().argmax(-1)
            agree, total = agree + int((ref == got).sum()), total + len(ref)
    assert agree / total >= 0.95, f"bf16 top-1 agreement {agree / total:.3f}"
