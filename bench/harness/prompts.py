"""The prompts the benchmarks send: topics for distinct short requests, input-grounded requests
(quote, edit or summarise a text given in the prompt), support questions under long system
prompts of their own, and long prompts no cache can help with."""
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


TEXTS = [
    "The river town of Elmsford sits where two valleys meet. Every spring the snowmelt swells the water, and "
    "the old stone bridge, built in 1782 by a mason named Thomas Hale, disappears for a week under the flood. "
    "Children wait on the hill for the first arch to show again, and the baker gives a free loaf to whoever "
    "sees it first. The town council has argued for forty years about a new bridge upstream; the plans are "
    "drawn, the money is not. Meanwhile the ferryman, Ada Brook, takes people across in a flat boat for two "
    "coins each, and keeps a ledger of every crossing since 1990. Her ledger shows that the flood now comes "
    "nine days earlier than it did when she started, and that it lasts longer. The school teaches the "
    "children to read the ledger as a lesson in patience and in measurement.",
    "Our support policy for returns is simple. Customers may return unused items within thirty days of "
    "delivery. Refunds are issued to the original payment method within five business days after the "
    "warehouse confirms the return. Fragile goods need photos of the damage and of the packaging before a "
    "replacement is sent. Items bought in a sale can be exchanged but not refunded. Gift cards cannot be "
    "returned. If a parcel is lost, the customer must wait ten business days from the shipping date before "
    "we open an investigation with the carrier. During that time the order page shows the tracking number "
    "and the carrier's last scan. Orders shipped abroad may be held by customs; any duties are paid by the "
    "customer, and refused parcels are returned to us at the customer's cost.",
    "def merge_intervals(intervals):\n    \"\"\"Merge overlapping intervals and return them sorted.\"\"\"\n"
    "    if not intervals:\n        return []\n    intervals = sorted(intervals, key=lambda pair: pair[0])\n"
    "    merged = [list(intervals[0])]\n    for start, end in intervals[1:]:\n        last = merged[-1]\n"
    "        if start <= last[1]:\n            last[1] = max(last[1], end)\n        else:\n"
    "            merged.append([start, end])\n    return [tuple(pair) for pair in merged]\n\n\n"
    "def total_covered(intervals):\n    \"\"\"The length of the union of the intervals.\"\"\"\n"
    "    return sum(end - start for start, end in merge_intervals(intervals))\n\n\n"
    "def gaps(intervals, lower, upper):\n    \"\"\"The stretches between lower and upper no interval covers.\"\"\"\n"
    "    result, cursor = [], lower\n    for start, end in merge_intervals(intervals):\n"
    "        if start > cursor:\n            result.append((cursor, min(start, upper)))\n"
    "        cursor = max(cursor, end)\n    if cursor < upper:\n        result.append((cursor, upper))\n"
    "    return result\n",
]
TASKS = {
    "quote": "Repeat this text exactly, word for word:\n\n{text}",
    "edit": "Rewrite this text with every number written out in words; change nothing else:\n\n{text}",
    "summarise": "Summarise this text in a few sentences, keeping its key names and facts:\n\n{text}",
}


def story(n: int) -> str:
    """Request n's prompt: a number in each, so no server can reuse another request's answer."""
    return f"Story {n}: write a long, detailed story about {TOPICS[n % len(TOPICS)]}."


def grounded(n: int) -> str:
    """Request n's prompt of the input-grounded workload: each task on each text in turn, numbered
    like `story`, so no server answers one from another's result."""
    task = list(TASKS)[n % len(TASKS)]
    return f"Request {n}. " + TASKS[task].format(text=TEXTS[n // len(TASKS) % len(TEXTS)])


WORKLOADS = {"stories": story, "grounded": grounded}  # the load's prompts, by the name a benchmark takes


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
