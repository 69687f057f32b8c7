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


def test_a_resumed_detokenizer_carries_on_at_any_boundary_without_repeating_or_breaking_text(model_ref):
    """A job continued after a crash: the new attempt's detokenizer takes up the lost attempt's
    token ids and the text it sent; cut anywhere (inside a character's bytes, inside a held-back
    start of a stop string), the two attempts' text is the text, each character whole."""
    tok = AutoTokenizer.from_pretrained(model_ref.path)
    text, stop = "Café 😀 naïve — 日本語 and more", ("日本X",)
    ids = tok.encode(text, add_special_tokens=False)
    for cut in range(len(ids) + 1):
        before = IncrementalDetokenizer(tok, stop)
        sent = "".join(before.add(i) for i in ids[:cut])
        after = IncrementalDetokenizer(tok, stop)
        assert after.resume(ids[:cut], sent)
        rest = [after.add(i) for i in ids[cut:]] + [after.flush()]
        assert sent + "".join(rest) == text, cut
        assert all("\ufffd" not in d for d in rest)


def test_resuming_from_ids_that_do_not_give_the_text_sent_is_refused():
    assert not IncrementalDetokenizer(CharTokenizer()).resume([ord(c) for c in "abc"], "abd")
    assert IncrementalDetokenizer(CharTokenizer()).resume([ord(c) for c in "abc"], "ab")
