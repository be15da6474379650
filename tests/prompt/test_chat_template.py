"""render_prompt / check_template: HF-style chat templates, sandboxed; user content is data."""

from __future__ import annotations

import json

import pytest

from app.prompt import content_marks
from app.prompt.chat_template import check_template, content_text, render_prompt, template_messages
from app.api.errors import APIError

SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def tpl(bundled_spec):
    return bundled_spec.chat_template


def test_bundled_template_renders_chatml_with_generation_prompt(tpl):
    out = render_prompt(tpl, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}])
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                   "<|im_start|>user\nHi!<|im_end|>\n"
                   "<|im_start|>assistant\n")


def test_bundled_template_default_system_and_no_generation_prompt(tpl):
    out = render_prompt(tpl, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
                        add_generation_prompt=False)
    assert out == SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"


@pytest.mark.parametrize("text", [
    "{{ 7*7 }}",
    "{% for x in range(3) %}loop{% endfor %}",
    "{% for %}",
    "{{ raise_exception('boom') }}",
    "{# comment #} {%- if true -%}x{%- endif -%}",
])
def test_user_content_stays_literal(tpl, text):
    out = render_prompt(tpl, [{"role": "user", "content": text}])
    assert out == SMOL_SYSTEM + f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assert "49" not in out and "looploop" not in out


def test_content_parts_are_joined_with_an_image_place_between(tpl):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hello, "},
                                         {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                                         {"type": "text", "text": "world"}]}]
    out = render_prompt(tpl, msgs)
    assert "<|im_start|>user\nHello, <__media__>world<|im_end|>" in out
    assert "http://x" not in out
    marked = render_prompt(tpl, msgs, mark_content=True)  # the place is the template's, not client text
    assert [(t.strip(), c) for t, c in content_marks.split(marked) if "media" in t] == [("<__media__>", False)]


def test_content_text_helper():
    assert content_text(None) == ""
    assert content_text("abc") == "abc"
    assert content_text([{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "no"},
                         {"type": "text", "text": "b"}]) == "ab"


def test_raise_exception_becomes_400():
    src = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('roles must alternate') }}{% endif %}ok"
    with pytest.raises(APIError) as info:
        render_prompt(src, [{"role": "user", "content": "x"}])
    err = info.value
    assert err.status == 400
    assert err.param == "messages"
    assert err.type == "invalid_request_error"
    assert "roles must alternate" in err.message
    # and the same template renders when the condition is met
    assert render_prompt(src, [{"role": "system", "content": "x"}]) == "ok"


@pytest.mark.parametrize("src", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ messages.append('x') }}",  # immutable sandbox: no mutation of the data either
])
def test_sandbox_escape_is_a_500_that_names_no_internals(src, caplog):
    # The template is the server's (client text is data, never template source): a template that tries
    # an unsafe operation is a server-side bug, logged with Jinja's words, which the client never sees.
    with pytest.raises(APIError) as info:
        render_prompt(src, [{"role": "user", "content": "x"}])
    assert info.value.status == 500 and info.value.code == "chat_template_error" and info.value.logged
    assert "__" not in info.value.message and "unsafe" not in info.value.message
    assert any("unsafe" in repr(r.exc_info[1]) or "immutable" in repr(r.exc_info[1]).lower()
               for r in caplog.records if r.exc_info)


@pytest.mark.parametrize("src", [
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__()[0].__init__.__globals__['sys'].modules['os'].system('touch MARKER') }}",
])
def test_sandbox_escape_never_executes(tmp_path, src):
    marker = tmp_path / "pwned"
    with pytest.raises(APIError) as info:
        render_prompt(src.replace("MARKER", str(marker)), [{"role": "user", "content": "x"}])
    assert info.value.status == 500
    assert not marker.exists()


def test_tool_call_arguments_reach_the_template_as_a_dict():
    src = ("{% for m in messages %}{% for c in m.tool_calls %}"
           "{{ c.function.name }}|{{ c.function.arguments.city }}|{{ c.function.arguments is mapping }}|"
           "{{ c.function.arguments | tojson }}"
           "{% endfor %}{% endfor %}")
    msgs = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "days": 2}'}}]}]
    out = render_prompt(src, msgs)
    name, city, is_map, js = out.split("|")
    assert (name, city, is_map) == ("get_weather", "Zürich", "True")
    assert json.loads(js) == {"city": "Zürich", "days": 2}
    assert "Zürich" in js  # tojson keeps non-ASCII like HF's does


def test_template_messages_shapes():
    out = template_messages([
        {"role": "assistant", "content": None, "reasoning_content": "hmm", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": ""}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}}]},
        {"role": "tool", "content": "r", "tool_call_id": "a"},
        {"role": "user", "content": "u", "name": "bob"},
    ])
    assert out[0] == {"role": "assistant", "content": "", "reasoning_content": "hmm", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}
    assert out[1] == {"role": "tool", "content": "r", "tool_call_id": "a"}
    assert out[2] == {"role": "user", "content": "u", "name": "bob"}


def test_tools_bos_eos_and_extra_are_passed():
    src = "{{ bos_token }}{% for t in tools %}{{ t.function.name }};{% endfor %}{{ eos_token }}{{ flag }}"
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]
    out = render_prompt(src, [{"role": "user", "content": "x"}], tools=tools, bos_token="<s>",
                        eos_token="</s>", extra={"flag": "!"})
    assert out == "<s>a;b;</s>!"


def test_no_tools_is_none_not_empty_list():
    src = "{% if tools is none %}none{% else %}some{% endif %}"
    assert render_prompt(src, [{"role": "user", "content": "x"}], tools=[]) == "none"


def test_template_bug_is_a_500():
    with pytest.raises(APIError) as info:
        render_prompt("{{ missing.attr }}", [{"role": "user", "content": "x"}])
    assert info.value.status == 500
    assert info.value.code == "chat_template_error"
    assert "missing" not in info.value.message and "undefined" not in info.value.message  # Jinja's words: logged


def test_check_template_syntax_error():
    with pytest.raises(ValueError, match=r"does not compile.*line 1"):
        check_template("{% for m in messages %}{{ m.content }}")
    with pytest.raises(ValueError, match="does not compile"):
        check_template("{% for %}")


def test_check_template_accepts_bundled(tpl):
    assert check_template(tpl) is None
    assert check_template("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}") is None


def test_developer_messages_are_system_messages_to_a_template_without_that_role(tpl):
    # OpenAI's `developer` role means `system` to the bundled template, which knows only system/user/assistant.
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    as_developer = render_prompt(tpl, messages)
    assert as_developer == render_prompt(tpl, [{"role": "system", "content": "Be brief."}, messages[1]])
    assert "developer" not in as_developer and SMOL_SYSTEM not in as_developer  # replaces the default system


def test_a_template_that_branches_on_developer_gets_it_as_is():
    source = ("{% for m in messages %}{% if m.role == 'developer' %}[DEV]{% elif m.role == 'system' %}[SYS]"
              "{% else %}[{{ m.role }}]{% endif %}{{ m.content }}{% endfor %}")
    out = render_prompt(source, [{"role": "developer", "content": "a"}, {"role": "system", "content": "b"},
                                 {"role": "user", "content": "c"}], add_generation_prompt=False)
    assert out == "[DEV]a[SYS]b[user]c"
