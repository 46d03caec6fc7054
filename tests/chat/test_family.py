"""A model's chat family read from its template (``runtime/chat/family.py``): from HF
directories and from a GGUF file's ``tokenizer.chat_template`` (through the tokenizer the
loader converts), the embedded model's plain template keeping agentlang's format, and a
template whose call marker the vocabulary lacks refused by name."""

import pytest

from agentlang.runtime.chat.family import ChatFamily, ChatFamilyError
from tests.support.families import TEMPLATES, family_model

pytestmark = pytest.mark.slow


def test_the_embedded_model_keeps_agentlangs_format(tokenizer):
    assert ChatFamily.of(tokenizer) == ChatFamily("agentlang", False, None)


@pytest.mark.parametrize("template,expected", [
    ("hermes_think", ChatFamily("hermes", True, "think")),
    ("mistral", ChatFamily("mistral", True, None)),
    ("llama3_json", ChatFamily("llama3_json", True, None)),
    ("functiongemma", ChatFamily("functiongemma", True, None)),
])
def test_hf_directories(tmp_path, model_path, template, expected):
    from transformers import AutoTokenizer

    fam = ChatFamily.of(AutoTokenizer.from_pretrained(family_model(model_path, tmp_path, template)))
    assert fam == expected
    assert fam.thinking(None) is (expected.reasoning is not None)
    assert fam.thinking({"enable_thinking": False}) is False


def test_functiongemmas_markers_must_be_tokens(tmp_path, model_path):
    from transformers import AutoTokenizer

    lacking = family_model(model_path, tmp_path, "functiongemma", rename=False)
    with pytest.raises(ChatFamilyError, match="'<start_function_call>' is not a token"):
        ChatFamily.of(AutoTokenizer.from_pretrained(lacking))


def test_a_gguf_files_template_and_marker_tokens(tmp_path, tokenizer_fields):
    from transformers import AutoTokenizer

    from agentlang.runtime.models.loading import gguf_hf_dir
    from tests.support.gguf_files import write_gguf

    f = dict(tokenizer_fields)
    f["tokenizer.chat_template"] = (TEMPLATES / "hermes_think.jinja").read_text()
    lacking = write_gguf(tmp_path / "lacking.gguf", f, "Q8_0")
    with pytest.raises(ChatFamilyError, match="'<tool_call>' is not a token of the vocabulary"):
        ChatFamily.of(AutoTokenizer.from_pretrained(gguf_hf_dir(lacking)))
    f["tokenizer.ggml.tokens"] = f["tokenizer.ggml.tokens"] + ["<tool_call>", "</tool_call>"]
    f["tokenizer.ggml.token_type"] = f["tokenizer.ggml.token_type"] + [4, 4]   # user-defined
    path = write_gguf(tmp_path / "qwen.gguf", f, "Q8_0")
    tok = AutoTokenizer.from_pretrained(gguf_hf_dir(path))
    assert ChatFamily.of(tok) == ChatFamily("hermes", True, "think")
