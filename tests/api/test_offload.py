"""Tokenizing leaves the API's event loop only when it is long (common/offload.py): a short chat
message is encoded in place, since handing it to a thread costs more than encoding it, and long
text goes to a native thread so the process's other streams go on. Remembered pieces of a chat
(common/prompt_pieces.py) count for nothing: a long system prompt sent again is not new text."""
import pytest

import common.offload
from common.offload import INLINE_CHARS
from common.prompting import PromptBuilder

SYSTEM = "You are a support agent for an online shop. Follow the policies below.\n" * 60


@pytest.fixture(scope="module")
def builder(model_ref):
    return PromptBuilder(model_ref.path, 32768)


@pytest.fixture
def handed_off(monkeypatch):
    """The texts each hand-off to a thread carried (run in place here, as without gevent)."""
    calls = []

    def recording(fn, *args):
        calls.append(args[0])
        return fn(*args)
    monkeypatch.setattr(common.offload, "off_the_loop", recording)
    return calls


def chat(*messages):
    return [{"role": role, "content": text} for role, text in messages]


def test_only_new_long_text_is_handed_to_a_thread_and_the_ids_are_the_same(builder, handed_off):
    assert len(SYSTEM) > INLINE_CHARS
    question = chat(("user", "Where is my parcel?"))
    text, ids = builder.build(question, None)
    assert handed_off == [] and ids == builder.tokenizer.encode(text, add_special_tokens=False).ids

    text, ids = builder.build(chat(("system", SYSTEM), ("user", "Where is my parcel?")), None)
    assert [any(SYSTEM in piece for piece in texts) for texts in handed_off] == [True]  # new: off the loop
    assert ids == builder.tokenizer.encode(text, add_special_tokens=False).ids

    handed_off.clear()
    text, ids = builder.build(chat(("system", SYSTEM), ("user", "Can I return a lamp?")), None)
    assert handed_off == []  # the system prompt is remembered; only the question is new
    assert ids == builder.tokenizer.encode(text, add_special_tokens=False).ids

    raw = "x " * INLINE_CHARS  # a raw prompt is encoded whole, by the same rule
    assert builder.build(None, raw)[1] == builder.tokenizer.encode(raw).ids and handed_off == [[raw]]
