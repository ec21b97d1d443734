"""Chat templates render like transformers' and cannot escape the sandbox."""


import pytest

from vkrt.errors import ModelFormatError
from vkrt.models.chat import render_chat

ONE_TURN = [{"role": "user", "content": "Count from 1 to 10."}]
TWO_TURNS = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
]


@pytest.fixture(scope="module")
def template(default_gguf):
    return default_gguf.metadata["tokenizer.chat_template"]



@pytest.mark.parametrize("messages", [ONE_TURN, TWO_TURNS], ids=["one_turn", "two_turns"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_transformers(template, hf_tokenizer, messages, add_generation_prompt):
    ours = render_chat(template, messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                        add_generation_prompt=add_generation_prompt)
    assert ours == theirs


def test_smollm2_prompt_text(template):
    assert render_chat(template, ONE_TURN) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nCount from 1 to 10.<|im_end|>\n"
        "<|im_start|>assistant\n")


@pytest.mark.parametrize("payload", [
    # CVE-2024-34359: a GGUF chat template that ran shell commands in llama-cpp-python.
    "{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch PWNED') }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', 'PWNED']) }}{% endif %}{% endfor %}",
    "{{ cycler.__init__.__globals__.os.system('touch PWNED') }}",
    "{{ ''.__class__ }}",
    "{{ messages.append({'role': 'x'}) }}",
])
def test_sandbox_blocks_escape(tmp_path, monkeypatch, payload):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFormatError, match="unsafe") as info:
        render_chat(payload, ONE_TURN)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("template, words", [
    ("{% for m in messages %}", "syntax error"),
    ("{{ raise_exception('roles must alternate') }}", "raised: roles must alternate"),
    ("{{ nothing.there }}", "UndefinedError"),
])
def test_template_errors(template, words):
    with pytest.raises(ModelFormatError) as info:
        render_chat(template, ONE_TURN)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_tojson_keeps_text():
    assert render_chat("{{ messages[0] | tojson }}", [{"role": "user", "content": "<é>"}]) == \
        '{"role": "user", "content": "<é>"}'
