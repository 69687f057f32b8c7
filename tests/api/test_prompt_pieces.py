"""The API encodes a chat prompt piece by piece, remembering the pieces between special tokens
(common/prompt_pieces.py): the ids must be exactly those of the whole text, whether the pieces are
new or remembered, and a tokenizer for which pieces apart could differ is encoded whole."""
import random

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from common.prompt_pieces import PieceEncoder
from common.prompting import PromptBuilder

SYSTEM = "You are a support agent for an online shop. Follow the policies below.\n" * 20
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CONVERSATIONS = [
    ([{"role": "user", "content": "Hi!"}], None),
    ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is my parcel?"}], None),
    ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Can I return a lamp?"},
      {"role": "assistant", "content": "Yes, within thirty days."}, {"role": "user", "content": "  and a mug?\n\n"}], None),
    ([{"role": "user", "content": "What is the weather in Paris?"}], [WEATHER]),
    ([{"role": "user", "content": ""}], None),
    ([{"role": "user", "content": "naïve café, 東京, emoji 🙂 and tabs\t\tend"}], None),
    ([{"role": "user", "content": "a message that writes <|im_end|> and <|im_start|>user itself"}], None),
    ([{"role": "user", "content": "\n<|im_end|>\n\n<|im_start|> spaces around "}], None),
]


@pytest.fixture(scope="module")
def builder(model_ref):
    return PromptBuilder(model_ref.path, 4096)


def whole(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_chat_prompts_get_the_ids_of_their_whole_text_new_or_remembered(builder):
    assert PieceEncoder.for_tokenizer(builder.tokenizer) is not None  # the embedded model's is encoded by pieces
    for messages, tools in CONVERSATIONS:
        text = builder.render(messages, tools)
        first = builder.build(messages, None, tools)[1]
        again = builder.build(messages, None, tools)[1]
        assert first == again == whole(builder.tokenizer, text), text


def test_any_mix_of_text_and_special_tokens_and_a_full_memory_still_give_the_whole_texts_ids(builder):
    encoder = PieceEncoder.for_tokenizer(builder.tokenizer, max_chars=400)
    rng = random.Random(0)
    fragments = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "user\n", "assistant", " ", "\n", "\n\n",
                 "hello", " world", "12345", "é", "🙂", "<|im_", "end|>", "<", "|", "The policy says so. " * 5]
    for _ in range(500):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(0, 12)))
        assert encoder.encode(text) == whole(builder.tokenizer, text), repr(text)
        assert encoder.remembered_chars <= 400


def test_a_tokenizer_that_marks_its_first_piece_is_encoded_whole():
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "▁a": 1, "a": 2, "<s>": 3}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.add_special_tokens(["<s>"])
    # why: only the first piece of the whole text gets the word mark, so pieces apart would differ
    assert whole(tokenizer, "a<s>a") == [1, 3, 2] and whole(tokenizer, "a") == [1]
    assert PieceEncoder.for_tokenizer(tokenizer) is None


def test_special_tokens_that_strip_or_overlap_are_left_to_the_tokenizer():
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "<x>": 2, "<y>": 3, "<y>z": 4}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken("<x>", rstrip=True, special=True), "<y>"])
    encoder = PieceEncoder.for_tokenizer(tokenizer)
    assert set(encoder.specials) == {"<y>"}  # "<x>" eats the spaces after it: the tokenizer splits there
    for text in ["a<x>   a<y>a", "<x> <y> <x>a", "a <y>"]:
        assert encoder.encode(text) == whole(tokenizer, text)
    tokenizer.add_special_tokens(["<y>z"])  # contains "<y>": where each matches is the tokenizer's to say
    assert PieceEncoder.for_tokenizer(tokenizer) is None
