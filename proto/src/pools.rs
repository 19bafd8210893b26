//! Worker pools and capabilities: the one vocabulary in which a task says
//! what a worker needs to run it (its *requirements*, computed by the engine
//! when it schedules the task and stored on the task row) and a worker says
//! what it can run (its *capabilities*, sent with every `ClaimTasks`). Both
//! are sets of tags; a worker may claim a task when its tags include every
//! one of the task's.
//!
//! | tag | a task requires it when | a worker has it when |
//! |---|---|---|
//! | `pool:<name>` | its tool or agent names `pool: <name>` | it runs with `--pool <name>` |
//! | `mcp:<server>` | it is a `type: mcp` call of server `<server>` | its `--mcp-config` has that server |
//! | `sandbox:<runtime>` | it is a `type: sandbox` call in `javascript` or `python` | it found that runtime (and bubblewrap) |
//! | `http_base_url` | it is an HTTP (or async webhook) call whose endpoint is a path | it has `--http-base-url` |
//! | `tls_profile:<name>` | its HTTP request names `tls_profile: <name>` | its `--tls-profiles` has that profile |
//! | `model_provider:<name>` | its agent names `provider: openai` or `anthropic` | it speaks that API (`--model-provider`) |
//!
//! A task with no requirements may go to any worker, pooled or not: a pool
//! says where a task may go, not what a pooled worker may take.

use crate::wire::ToolBinding;

/// The tag of a task that needs pool `name` (and of a worker in it).
pub fn pool_tag(name: &str) -> String {
    format!("pool:{name}")
}

/// The tag of MCP server `server`.
pub fn mcp_tag(server: &str) -> String {
    format!("mcp:{server}")
}

/// The tag of a sandbox runtime (`javascript`, `python`).
pub fn sandbox_tag(runtime: &str) -> String {
    format!("sandbox:{runtime}")
}

/// The tag of an HTTP base URL (for endpoints given as paths).
pub const HTTP_BASE_URL_TAG: &str = "http_base_url";

/// The tag of client-certificate profile `name`.
pub fn tls_profile_tag(name: &str) -> String {
    format!("tls_profile:{name}")
}

/// The tag of model API `provider` (`openai`, `anthropic`).
pub fn model_provider_tag(provider: &str) -> String {
    format!("model_provider:{provider}")
}

/// The model APIs an agent's `provider:` may name (the worker's
/// `--model-provider` values).
pub const MODEL_PROVIDERS: &[&str] = &["openai", "anthropic"];

/// Longest pool name, characters (a Kubernetes label value's limit).
pub const MAX_POOL_NAME_LEN: usize = 63;

/// Checks a pool name (`pool:` of a tool or agent, a worker's `--pool`):
/// lower-case ASCII letters, digits, `-` and `_`, starting with a letter,
/// at most [`MAX_POOL_NAME_LEN`] characters, so it can also be a
/// Kubernetes label value. Errors: why, naming the value.
pub fn check_pool_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if name.is_empty() {
        Err("a pool name must not be empty".into())
    } else if !valid {
        Err(format!(
            "pool name `{name}` must be lower case letters, digits, `-` and `_`, starting with a letter"
        ))
    } else if name.len() > MAX_POOL_NAME_LEN {
        Err(format!(
            "pool name `{name}` is longer than {MAX_POOL_NAME_LEN} characters"
        ))
    } else {
        Ok(())
    }
}

/// What a worker needs to run a `tool_call` with `binding` whose tool names
/// `pool` (sorted, no duplicates).
pub fn tool_call_requirements(binding: &ToolBinding, pool: Option<&str>) -> Vec<String> {
    let mut tags: Vec<String> = pool.map(pool_tag).into_iter().collect();
    let http = match binding {
        ToolBinding::Http(http) => Some(http),
        ToolBinding::AsyncWebhook(hook) => Some(&hook.http),
        ToolBinding::Mcp(mcp) => {
            tags.push(mcp_tag(&mcp.server));
            None
        }
        ToolBinding::McpResource(res) => {
            tags.push(mcp_tag(&res.server));
            None
        }
        ToolBinding::Sandbox(sandbox) => {
            tags.push(sandbox_tag(sandbox.runtime.as_str()));
            None
        }
    };
    if let Some(http) = http {
        if endpoint_is_path(&http.endpoint) {
            tags.push(HTTP_BASE_URL_TAG.to_owned());
        }
        if let Some(profile) = &http.request.tls_profile {
            tags.push(tls_profile_tag(profile));
        }
    }
    normalize(tags)
}

/// What a worker needs to run a `model_call` of an agent that names `pool`
/// and `provider` (sorted).
pub fn model_call_requirements(pool: Option<&str>, provider: Option<&str>) -> Vec<String> {
    let tags = pool
        .map(pool_tag)
        .into_iter()
        .chain(provider.map(model_provider_tag))
        .collect();
    normalize(tags)
}

/// Whether an HTTP endpoint is a path the worker joins to its base URL
/// (the worker's rule: anything not starting with `http://` or `https://`).
pub fn endpoint_is_path(endpoint: &str) -> bool {
    let lower = endpoint.trim_start().to_ascii_lowercase();
    !(lower.starts_with("http://") || lower.starts_with("https://"))
}

/// The requirements of `requires` that none of `held` (each worker's tags)
/// covers, in order.
pub fn missing_from<'a>(requires: &'a [String], held: &[&[String]]) -> Vec<&'a String> {
    requires
        .iter()
        .filter(|r| !held.iter().any(|tags| tags.contains(r)))
        .collect()
}

/// Sorted and without duplicates, so equal sets are equal values.
fn normalize(mut tags: Vec<String>) -> Vec<String> {
    tags.sort();
    tags.dedup();
    tags
}

/// A function from a name to its tag ([`mcp_tag`], …).
#[cfg(feature = "grpc")]
type TagOf = fn(&str) -> String;

/// The tags of a worker's capabilities (sorted, no duplicates). Errors: a
/// name that cannot be a tag (empty, or with a control character or
/// whitespace), or a pool name [`check_pool_name`] refuses, naming the field.
#[cfg(feature = "grpc")]
pub fn capability_tags(caps: &crate::v1::WorkerCapabilities) -> Result<Vec<String>, String> {
    let mut tags = Vec::new();
    let lists: [(&str, &[String], TagOf); 4] = [
        ("mcp_servers", &caps.mcp_servers, mcp_tag),
        ("model_providers", &caps.model_providers, model_provider_tag),
        ("sandbox_runtimes", &caps.sandbox_runtimes, sandbox_tag),
        ("tls_profiles", &caps.tls_profiles, tls_profile_tag),
    ];
    for (field, names, tag) in lists {
        for name in names {
            if name.is_empty()
                || name.len() > 256
                || name.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                return Err(format!(
                    "`capabilities.{field}` holds {name:?}: a name must be 1 to 256 characters without whitespace"
                ));
            }
            tags.push(tag(name));
        }
    }
    if caps.http_base_url {
        tags.push(HTTP_BASE_URL_TAG.to_owned());
    }
    if !caps.pool.is_empty() {
        check_pool_name(&caps.pool).map_err(|e| format!("`capabilities.pool`: {e}"))?;
        tags.push(pool_tag(&caps.pool));
    }
    Ok(normalize(tags))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{HttpBinding, McpBinding, SandboxBinding, SandboxRuntime};

    fn http(endpoint: &str, profile: Option<&str>) -> ToolBinding {
        let mut binding = HttpBinding {
            endpoint: endpoint.into(),
            method: "GET".into(),
            headers: Default::default(),
            timeout_ms: 1000,
            request: Default::default(),
        };
        binding.request.tls_profile = profile.map(str::to_owned);
        ToolBinding::Http(binding)
    }

    #[test]
    fn a_tool_call_requires_its_pool_server_runtime_base_url_and_profile() {
        let mcp = ToolBinding::Mcp(McpBinding {
            server: "time".into(),
            server_tool: "get_current_time".into(),
            headers: Default::default(),
            timeout_ms: 1000,
        });
        assert_eq!(tool_call_requirements(&mcp, None), ["mcp:time"]);
        assert_eq!(
            tool_call_requirements(&mcp, Some("vpc")),
            ["mcp:time", "pool:vpc"]
        );
        let sandbox = ToolBinding::Sandbox(SandboxBinding {
            runtime: SandboxRuntime::Python,
            code: "return 1".into(),
            params: vec![],
            timeout_ms: None,
            memory_mb: None,
        });
        assert_eq!(tool_call_requirements(&sandbox, None), ["sandbox:python"]);
        assert!(tool_call_requirements(&http("https://x.example/a", None), None).is_empty());
        assert_eq!(
            tool_call_requirements(&http("/users/{id}", Some("partner")), None),
            ["http_base_url", "tls_profile:partner"]
        );
        assert_eq!(
            model_call_requirements(Some("gpu"), Some("anthropic")),
            ["model_provider:anthropic", "pool:gpu"]
        );
        assert!(model_call_requirements(None, None).is_empty());
    }

    #[test]
    fn pool_names_are_label_values() {
        assert!(check_pool_name("eu-west_1").is_ok());
        for bad in ["", "EU", "1a", "a b", "a.b"] {
            assert!(check_pool_name(bad).is_err(), "{bad}");
        }
        let long = "a".repeat(64);
        assert!(
            check_pool_name(&long)
                .expect_err("refused")
                .contains("longer than 63")
        );
    }

    #[test]
    fn missing_names_what_no_worker_has() {
        let requires = vec!["mcp:a".to_owned(), "pool:p".to_owned()];
        let w1 = vec!["mcp:a".to_owned()];
        let w2 = vec!["pool:p".to_owned()];
        assert_eq!(missing_from(&requires, &[&w1]), [&requires[1]]);
        assert!(missing_from(&requires, &[&w1, &w2]).is_empty());
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn capabilities_become_tags_and_bad_names_are_refused() {
        let caps = crate::v1::WorkerCapabilities {
            mcp_servers: vec!["time".into()],
            model_providers: vec!["openai".into()],
            sandbox_runtimes: vec![],
            http_base_url: true,
            tls_profiles: vec![],
            pool: "gpu".into(),
        };
        assert_eq!(
            capability_tags(&caps).expect("valid"),
            [
                "http_base_url",
                "mcp:time",
                "model_provider:openai",
                "pool:gpu"
            ]
        );
        let bad = crate::v1::WorkerCapabilities {
            mcp_servers: vec!["a b".into()],
            ..caps.clone()
        };
        assert!(
            capability_tags(&bad)
                .expect_err("refused")
                .contains("capabilities.mcp_servers")
        );
        let bad = crate::v1::WorkerCapabilities {
            pool: "GPU".into(),
            ..caps
        };
        assert!(
            capability_tags(&bad)
                .expect_err("refused")
                .contains("capabilities.pool")
        );
    }
}
