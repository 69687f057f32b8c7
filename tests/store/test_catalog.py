"""The model catalog (common/catalog.py): what a file may say, and what a request naming a model gets."""
import json

import pytest

from common.catalog import Catalog, CatalogError
from common.models import ModelUnavailable
from tests.support.settings import make_settings

TOML = """
default = "qwen"

[models.smol]
source = "embedded"

[models.qwen]
source = "Qwen/Qwen2.5-0.5B-Instruct"
weights = "int4"
max_batch_size = 8
prompt_lookup = true
prompt_lookup_tokens = 6
"""


def test_a_toml_catalog_names_models_with_their_own_settings(tmp_path):
    path = tmp_path / "catalog.toml"
    path.write_text(TOML)
    catalog = Catalog.from_settings(make_settings(catalog=path, max_batch_size=16))
    assert catalog.named and list(catalog.models) == ["smol", "qwen"] and catalog.default.name == "qwen"
    assert catalog.get(None).name == "qwen" and catalog.get("smol").name == "smol" and catalog.get("x") is None
    qwen = catalog.get("qwen").settings(make_settings(max_batch_size=16))
    assert (qwen.model, qwen.weights, qwen.max_batch_size) == ("Qwen/Qwen2.5-0.5B-Instruct", "int4", 8)
    assert (qwen.prompt_lookup, qwen.prompt_lookup_tokens, qwen.prompt_lookup_ngram) == (True, 6, 3)
    smol = catalog.get("smol").settings(make_settings(max_batch_size=16))
    assert smol.max_batch_size == 16 and smol.prompt_lookup is False


def test_a_json_catalog_defaults_to_its_first_model(tmp_path):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"models": {"b": {"source": "embedded"}, "a": {"source": "embedded"}}}))
    assert Catalog.from_file(path).default.name == "b"


@pytest.mark.parametrize("text, says", [
    ("[models.a]\nweights = 'int8'", "needs source"),
    ("[models.a]\nsource = 'embedded'\nredis_url = 'redis://elsewhere'", "unknown settings ['redis_url']"),
    ("[models.a]\nsource = 'embedded'\nmax_batch_size = 'many'", "max_batch_size"),
    ("[models.a]\nsource = 'embedded'\nprompt_lookup_tokens = 0", "prompt_lookup_tokens"),
    ("default = 'b'\n[models.a]\nsource = 'embedded'", "default 'b' is not one of its models"),
    ("title = 'no models'", "no [models.<name>] entries"),
    ("[models.a\nsource = ", "catalog"),
])
def test_a_catalog_that_cannot_be_served_is_refused_with_what_is_wrong(tmp_path, text, says):
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=None) as refused:
        Catalog.from_file(path)
    assert says in str(refused.value)


def test_without_a_catalog_file_the_one_model_is_served_by_its_own_name(model_ref):
    catalog = Catalog.from_settings(make_settings(model="embedded"))
    assert not catalog.named and catalog.get("anything") is catalog.default
    assert catalog.default.resolve(make_settings(model="embedded")).name == model_ref.name


def test_a_catalog_name_is_never_answered_by_another_model(tmp_path):
    """A lone LLMQ_MODEL that is not available falls back to the embedded model; a catalog model
    does not: its name would then answer with another model's text."""
    path = tmp_path / "catalog.toml"
    path.write_text("[models.big]\nsource = 'Some/Missing-7B'\n")
    settings = make_settings(catalog=path)
    with pytest.raises(ModelUnavailable):
        Catalog.from_settings(settings).get("big").resolve(settings)


def test_a_catalog_model_keeps_its_exports_under_its_sources_name(tmp_path, model_ref):
    """Renaming a catalog entry, or pointing a name at another source, never serves a stale export."""
    from worker.engine.openvino_model import exported_dir

    path = tmp_path / "catalog.toml"
    path.write_text("[models.chat]\nsource = 'embedded'\n")
    settings = make_settings(catalog=path)
    ref = Catalog.from_settings(settings).get("chat").resolve(settings)
    assert ref.name == "chat" and ref.disk_name == model_ref.name
    assert exported_dir(ref, settings) == exported_dir(model_ref, settings)
