//! Rendering with transformers' semantics, on small templates written for the test (the
//! real templates are checked against jinja2 in tests/test_chat_templates.py).

use serde_json::json;

use super::*;

fn render(source: &str, messages: &[Json]) -> String {
    let t = ChatTemplate::new("t", source, vec![("bos_token".into(), "<s>".into())]).unwrap();
    t.render(messages, true, &RenderOptions::default()).unwrap()
}

#[test]
fn trims_blocks_and_strips_their_indentation_like_transformers() {
    let source = "{{ bos_token }}\n{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}>{% endif %}\n";
    assert_eq!(
        render(source, &[json!({"role": "user", "content": "hi"})]),
        "<s>\n[hi]\n>"
    );
}

#[test]
fn tojson_is_pythons_json_dumps() {
    let source = "{{ messages[0] | tojson }}|{{ messages[0].content | tojson(ensure_ascii=True) }}|{{ {'a': [1]} | tojson(indent=2) }}";
    assert_eq!(
        render(source, &[json!({"role": "user", "content": "é<>&"})]),
        "{\"role\": \"user\", \"content\": \"é<>&\"}|\"\\u00e9<>&\"|{\n  \"a\": [\n    1\n  ]\n}"
    );
}

#[test]
fn python_methods_loop_controls_and_generation_blocks() {
    let source = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% generation %}{{ m.content.strip().upper() }}{{ m.get('name', '-') }}{% endgeneration %}{% endfor %}";
    let ms = [
        json!({"content": " a "}),
        json!({"content": "b", "name": "n"}),
        json!({"content": "c"}),
    ];
    assert_eq!(render(source, &ms), "A-Bn");
}

#[test]
fn values_print_as_python_prints_them() {
    let source = "{{ [1, 'a', none, true, 2.5] }} {{ {'k': \"it's\"} }} {{ 3 }} {{ 1.0 }} {{ 'plain' }}";
    assert_eq!(
        render(source, &[]),
        "[1, 'a', None, True, 2.5] {'k': \"it's\"} 3 1.0 plain"
    );
}

#[test]
fn none_is_not_iterable_as_in_python() {
    let source = "{{ tools is iterable }} {{ messages is iterable }} {{ 'ab' is iterable }}";
    assert_eq!(render(source, &[]), "False True True");
}

#[test]
fn raise_exception_is_a_template_error_with_its_message() {
    let t = ChatTemplate::new("strict", "{{ raise_exception('roles must alternate') }}", vec![]).unwrap();
    let e = t.render(&[], false, &RenderOptions::default()).unwrap_err();
    assert_eq!(e.code, Code::TemplateError);
    assert!(e.message.contains("roles must alternate"), "{}", e.message);
    let bad = ChatTemplate::new("bad", "{% for %}", vec![]).unwrap_err();
    assert_eq!(bad.code, Code::InvalidTemplate);
}

#[test]
fn tokenizer_config_gives_the_template_and_token_strings() {
    let config = json!({
        "bos_token": {"content": "<|begin|>", "special": true},
        "eos_token": "<|end|>",
        "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ eos_token }}"}, {"name": "tool_use", "template": "T"}]
    });
    let data = serde_json::to_vec(&config).unwrap();
    let t = ChatTemplate::from_tokenizer_config("m", &data, None).unwrap();
    assert_eq!(
        t.render(&[], false, &RenderOptions::default()).unwrap(),
        "<|begin|><|end|>"
    );
    let tool_use = ChatTemplate::from_tokenizer_config("m", &data, Some("tool_use")).unwrap();
    assert_eq!(
        tool_use.render(&[], false, &RenderOptions::default()).unwrap(),
        "T"
    );
}

#[test]
fn kwargs_and_tools_reach_the_template() {
    let t = ChatTemplate::new(
        "k",
        "{{ enable_thinking }}{% if tools %}{{ tools[0].function.name }}{% endif %}{{ tools is none }}",
        vec![],
    )
    .unwrap();
    let mut options = RenderOptions::default();
    options.kwargs.insert("enable_thinking".into(), json!(false));
    assert_eq!(t.render(&[], false, &options).unwrap(), "FalseTrue");
    options.tools = Some(vec![json!({"type": "function", "function": {"name": "ls"}})]);
    assert_eq!(t.render(&[], false, &options).unwrap(), "FalselsFalse");
}

/// A template from a model file anywhere: renders that loop without end, double a string
/// or print without bound fail with `template_error`; the process lives on.
#[test]
fn a_render_is_bounded_in_steps_and_bytes() {
    let messages = [json!({"role": "user", "content": "hi"})];
    for (what, source) in [
        (
            "nested loops",
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        ),
        (
            "a string doubled",
            "{% set s = namespace(v='x') %}{% for i in range(64) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v }}",
        ),
        (
            "output without bound",
            "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
        ),
        (
            "a huge tojson indent",
            "{{ messages | tojson(indent=1000000000000) }}",
        ),
    ] {
        let t = ChatTemplate::new("evil", source, vec![]).unwrap();
        let e = t.render(&messages, true, &RenderOptions::default()).unwrap_err();
        assert_eq!(e.code, Code::TemplateError, "{what}: {}", e.message);
        assert!(e.message.contains("exceeded its budget"), "{what}: {}", e.message);
    }
}

/// The budget grows with the conversation: a long one renders whole.
#[test]
fn the_budget_grows_with_the_input() {
    const ROLES: [&str; 3] = ["user", "assistant", "tool"];
    let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{% if m.role == 'tool' %}{{ m | tojson }}{% endif %}\n{% endfor %}";
    let messages: Vec<Json> = (0..50_000)
        .map(|i| json!({"role": ROLES[i % 3], "content": "x".repeat(i % 200)}))
        .collect();
    let t = ChatTemplate::new("long", source, vec![]).unwrap();
    let text = t.render(&messages, false, &RenderOptions::default()).unwrap();
    assert_eq!(text.matches("<|").count(), 50_000);
}

/// DeepSeek V3's template adds a call's arguments to a string: it is given their JSON
/// text (the OpenAI form); templates that print them with `tojson` get them parsed (vLLM's
/// form). Decided once, when the template is loaded.
#[test]
fn a_template_that_adds_arguments_to_text_is_given_them_as_text() {
    use crate::item::Item;
    use messages::ChatMessages;
    let calls = |body: &str| {
        format!(
            "{{% for m in messages %}}{{% for c in m.tool_calls or [] %}}{body}{{% endfor %}}{{% endfor %}}"
        )
    };
    let concat = ChatTemplate::new("ds", &calls("{{ '|' + c.function.arguments }}"), vec![]).unwrap();
    assert_eq!(concat.arguments(), Arguments::Text);
    let tojson = ChatTemplate::new("q", &calls("{{ c.function.arguments | tojson }}"), vec![]).unwrap();
    assert_eq!(tojson.arguments(), Arguments::Parsed);
    for (template, rendered) in [(&concat, r#"|{"a":1}"#), (&tojson, r#"{"a": 1}"#)] {
        let mut m = ChatMessages::new(None, template.arguments());
        m.push(&Item::FunctionCall {
            call_id: "c".into(),
            name: "f".into(),
            arguments: r#"{"a":1}"#.into(),
        });
        let messages: Vec<Json> = m.messages().iter().map(|x| (**x).clone()).collect();
        let text = template
            .render(&messages, false, &RenderOptions::default())
            .unwrap();
        assert_eq!(text, rendered);
    }
}
