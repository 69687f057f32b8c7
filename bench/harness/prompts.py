"""The prompts the benchmarks send: topics for distinct short requests, support questions under
long system prompts of their own, and long prompts no cache can help with."""
from __future__ import annotations

import random

TOPICS = ["the ocean", "a lighthouse keeper", "the history of bread", "a robot learning to paint",
          "mountains in winter", "a city at night", "the first bicycle", "a friendly dragon",
          "coffee", "the moon landing", "a forest after rain", "a chess tournament",
          "trains", "a library", "volcanoes", "a garden in spring"]

QUESTIONS = ["Where is my parcel?", "Can I return a lamp?", "My mug arrived broken.",
             "How long do refunds take?", "Do you ship abroad?", "I lost my receipt."]

POLICY = ("Section {n}: customers may return unused items within thirty days of delivery; refunds are "
          "issued to the original payment method within five business days after the warehouse "
          "confirms the return; fragile goods need photos of the damage and the packaging. ")

WORDS = ("river stone market lantern orchard harbour valley ledger copper meadow signal winter "
         "archive basket canyon doctrine ember falcon garnet hollow island jasmine kettle lumber "
         "marble needle oyster parcel quarry ribbon saddle timber umbrella velvet walnut yonder zephyr "
         "anchor beacon cobalt dune ferry glacier hamlet ivory juniper kiln lagoon mosaic nectar").split()
SYSTEM_WORDS = 1270  # about 1,500 tokens with the embedded model's tokenizer (the Qwen-size model's too)


def story(n: int) -> str:
    """Request n's prompt: a number in each, so no server can reuse another request's answer."""
    return f"Story {n}: write a long, detailed story about {TOPICS[n % len(TOPICS)]}."


def system_prompt(builder, target_tokens: int, seed: int) -> str:
    """A support agent's system prompt of about `target_tokens` tokens (`builder`: the model's
    `PromptBuilder`); agents of different seeds differ from their first tokens."""
    text, n = f"You are support agent #{seed} for an online shop. Follow the policies. ", 1
    while len(builder.encode(text, add_special_tokens=False)) < target_tokens:
        text += POLICY.format(n=n)
        n += 1
    return text


def support_question(systems: list[str], i: int) -> list[dict]:
    """Ticket i's messages: tenant i % len(systems)'s system prompt and a question."""
    return [{"role": "system", "content": systems[i % len(systems)]},
            {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (ticket {i})"}]


def long_system_prompt(seed: int) -> str:
    """A system prompt no other request shares: words in an order of its own, from the start."""
    rng = random.Random(seed)
    return f"Reference {seed}. " + " ".join(rng.choice(WORDS) for _ in range(SYSTEM_WORDS))
