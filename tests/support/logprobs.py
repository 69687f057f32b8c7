"""Checks of an OpenAI answer's logprobs, shared by the engines' end-to-end modules."""
from __future__ import annotations

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def check_chat_logprobs(client, model: str, top: int, **kwargs) -> list:
    """A greedy chat completion with logprobs through the openai client: one entry per token
    whose bytes spell the reply, logprobs <= 0, `top` alternatives, the chosen token the most
    likely one. Returns the entries."""
    reply = client.chat.completions.create(model=model, messages=FRANCE, max_tokens=16, temperature=0,
                                           logprobs=True, top_logprobs=top, **kwargs)
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert entries and len(entries) <= reply.usage.completion_tokens
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == top
        if top:
            assert entry.logprob == max(t.logprob for t in entry.top_logprobs)
            assert entry.token == entry.top_logprobs[0].token
    return entries
