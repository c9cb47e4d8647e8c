from inhouse.manifests.bundled import default_chat_model, default_embedding_model


def test_bundled_chat_model_is_a_gguf_file() -> None:
    path = default_chat_model()
    assert path.is_file()
    assert path.read_bytes()[:4] == b"GGUF"


def test_bundled_embedding_model_has_weights_and_tokenizer() -> None:
    folder = default_embedding_model()
    assert (folder / "model.safetensors").is_file()
    assert (folder / "tokenizer.json").is_file()
