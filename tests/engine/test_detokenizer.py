"""Incremental detokenization: stop strings across token boundaries, hold-back, UTF-8."""
from transformers import AutoTokenizer

from tests.support.fakes import CharTokenizer
from worker.engine.detokenizer import IncrementalDetokenizer


def feed(detok, text):
    out = []
    for ch in text:
        out.append(detok.add(ord(ch)))
        if detok.stopped:
            break
    return out


def test_stop_string_split_across_tokens_is_never_emitted():
    detok = IncrementalDetokenizer(CharTokenizer(), stop=("END",))
    deltas = feed(detok, "abc ENxyz END tail")
    assert "".join(deltas) == "abc ENxyz "
    assert detok.stopped
    assert all("E" not in d for d in deltas[4:6])  # 'EN' was held back until 'x' ruled it out


def test_held_back_prefix_is_flushed_at_the_end():
    detok = IncrementalDetokenizer(CharTokenizer(), stop=("STOP",))
    deltas = feed(detok, "hello ST")
    assert "".join(deltas) == "hello "
    assert detok.flush() == "ST"


def test_earliest_of_several_stop_strings_wins():
    detok = IncrementalDetokenizer(CharTokenizer(), stop=("zz", "\n\n"))
    assert "".join(feed(detok, "one\n\ntwo zz")) == "one"


def test_multibyte_characters_are_emitted_whole(model_ref):
    tok = AutoTokenizer.from_pretrained(model_ref.path)
    text = "Café 😀 naïve — 日本語"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
