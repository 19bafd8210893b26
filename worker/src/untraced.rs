//! `visibility: {trace: false}` arguments on the worker's side: the
//! engine records such an argument as the placeholder
//! `{{_secret._arg_<hex>}}` and hands its value out only in the dispatch
//! of the call (`DispatchToolCallResponse.secrets`); [`restore_arguments`]
//! puts each value in its place just before the request is built, and the
//! runner redacts the values from whatever the tool answers.

use serde_json::Value;

use crate::placeholders::SecretValues;

pub use belay_proto::wire::ARG_KEY_PREFIX;

/// The key of `text` when it is exactly `{{_secret._arg_…}}`.
fn arg_placeholder(text: &str) -> Option<&str> {
    let key = text
        .strip_prefix("{{")?
        .strip_suffix("}}")?
        .trim()
        .strip_prefix("_secret.")?;
    (key.starts_with(ARG_KEY_PREFIX) && belay_proto::wire::is_vault_key(key)).then_some(key)
}

/// Puts the value of each top-level argument that is an untraced
/// placeholder in its place, from `secrets`. Returns how many were put in;
/// a placeholder without a value (the engine had no vault key, or the
/// run's vault is gone) is an error naming the argument, never a value:
/// the request must not go out with the placeholder in it.
pub fn restore_arguments(arguments: &mut Value, secrets: &SecretValues) -> Result<usize, String> {
    let Value::Object(map) = arguments else {
        return Ok(0);
    };
    let mut put = 0;
    for (name, value) in map.iter_mut() {
        let Some(key) = value.as_str().and_then(arg_placeholder) else {
            continue;
        };
        let Some(secret) = secrets.get(key) else {
            return Err(format!(
                "argument `{name}` (`visibility.trace: false`) has no value: the engine's dispatch gave none (no vault key, or the run's vault was dropped); nothing was sent"
            ));
        };
        *value = Value::String(secret.to_owned());
        put += 1;
    }
    Ok(put)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn only_whole_arg_placeholders_with_a_value_are_restored() {
        let secrets = SecretValues::new(BTreeMap::from([
            ("_arg_00aa".to_owned(), "4111 1111".to_owned()),
            ("otp".to_owned(), "123456".to_owned()),
        ]));
        let mut args = json!({
            "card": "{{_secret._arg_00aa}}",
            "note": "see {{_secret._arg_00aa}}",
            "code": "{{_secret.otp}}",
            "n": 3
        });
        assert_eq!(restore_arguments(&mut args, &secrets), Ok(1));
        assert_eq!(
            args,
            json!({
                "card": "4111 1111",
                "note": "see {{_secret._arg_00aa}}",
                "code": "{{_secret.otp}}",
                "n": 3
            })
        );
        let mut args = json!({"card": "{{_secret._arg_ffff}}"});
        let err = restore_arguments(&mut args, &secrets).unwrap_err();
        assert!(err.contains("`card`"), "{err}");
        assert_eq!(args, json!({"card": "{{_secret._arg_ffff}}"}));
    }
}
