//! Uncertain outcomes: listing them for operators, and resolving one (which
//! resumes its run when nothing else holds it).

use super::{
    Coordinator, CoordinatorError, MAX_JSON_BYTES, MAX_TEXT_BYTES, check_text, make_page_token,
    parse_page_token, parse_uuid, require,
};
use crate::machine::{self, Input};
use crate::store::{UncertainQuery, UncertainRow};

/// Filters for [`Coordinator::list_uncertain`].
#[derive(Debug, Clone, Default)]
pub struct UncertainFilter {
    /// Tenant (required).
    pub tenant: String,
    /// `open` (default for operators), `resolved`, or `any`/`None`.
    pub status: Option<String>,
    /// Tool name.
    pub tool: Option<String>,
    /// Run id.
    pub run_id: Option<String>,
    /// Only records at least this old, ms.
    pub older_than_ms: Option<u64>,
    /// Only records at most this old, ms.
    pub newer_than_ms: Option<u64>,
    /// 1..=500; 0 means 50.
    pub page_size: u32,
    /// From a previous page; empty for the first.
    pub page_token: String,
}

impl Coordinator {
    /// Uncertain-outcome records of a tenant, newest first; the page token
    /// is `<created_at RFC 3339>|<uncertain_id>` of the last record.
    pub async fn list_uncertain(
        &self,
        filter: &UncertainFilter,
    ) -> Result<(Vec<UncertainRow>, String), CoordinatorError> {
        require("tenant", &filter.tenant)?;
        let status = match filter.status.as_deref() {
            None | Some("") | Some("any") => None,
            Some(s @ ("open" | "resolved")) => Some(s),
            Some(other) => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "unknown status `{other}`; one of open, resolved, any"
                )));
            }
        };
        let run_id = match filter.run_id.as_deref() {
            None | Some("") => None,
            Some(id) => Some(parse_uuid("run_id", id)?),
        };
        let size = match filter.page_size {
            0 => 50,
            n if n > 500 => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`page_size` {n} is more than 500"
                )));
            }
            n => n,
        };
        let after = parse_page_token(&filter.page_token)?;
        // Ten years, in ms: a larger age is a mistake, not a filter.
        const MAX_AGE_MS: u64 = 10 * 366 * 24 * 3600 * 1000;
        for (name, value) in [
            ("older_than_ms", filter.older_than_ms),
            ("newer_than_ms", filter.newer_than_ms),
        ] {
            if value.is_some_and(|ms| ms > MAX_AGE_MS) {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`{name}` must be at most {MAX_AGE_MS} (ten years in ms)"
                )));
            }
        }
        let mut rows = self
            .store
            .list_uncertain(&UncertainQuery {
                tenant: &filter.tenant,
                status,
                tool: filter.tool.as_deref().filter(|t| !t.is_empty()),
                run_id,
                older_than_ms: filter.older_than_ms,
                newer_than_ms: filter.newer_than_ms,
                after,
                limit: size as i64 + 1,
            })
            .await?;
        let next = if rows.len() > size as usize {
            rows.truncate(size as usize);
            rows.last()
                .map(|r| make_page_token(&r.created_at, &r.uncertain_id))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((rows, next))
    }

    /// One uncertain-outcome record of a tenant.
    pub async fn get_uncertain(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<UncertainRow, CoordinatorError> {
        require("tenant", tenant)?;
        let id = parse_uuid("uncertain_id", id)?;
        self.store.get_uncertain(tenant, id).await?.ok_or_else(|| {
            CoordinatorError::NotFound(format!("uncertain outcome {id} of tenant `{tenant}`"))
        })
    }

    /// Resolve an uncertain outcome; appends events and resumes the run if
    /// nothing else holds it. A second resolve gets [`CoordinatorError::Conflict`];
    /// concurrent resolves are serialised by the run lock, so one wins.
    pub async fn resolve_uncertain(
        &self,
        tenant: &str,
        id: &str,
        resolution: machine::Resolution,
        resolved_by: &str,
        reason: &str,
    ) -> Result<UncertainRow, CoordinatorError> {
        require("resolved_by", resolved_by)?;
        if reason.trim().is_empty() {
            return Err(CoordinatorError::InvalidArgument(
                "`reason` is required".into(),
            ));
        }
        check_text("reason", reason, MAX_TEXT_BYTES)?;
        match &resolution {
            machine::Resolution::Failed { error } => check_text("error", error, MAX_TEXT_BYTES)?,
            machine::Resolution::Succeeded { result } => {
                if machine::normalize::strip_nul_value(result.clone()) != *result {
                    return Err(CoordinatorError::InvalidArgument(
                        "`result` contains a NUL character".into(),
                    ));
                }
                let size = result.to_string().len();
                if size > MAX_JSON_BYTES {
                    return Err(CoordinatorError::InvalidArgument(format!(
                        "`result` is {size} bytes, more than {MAX_JSON_BYTES}"
                    )));
                }
            }
            machine::Resolution::Retry { .. } => {}
        }
        let record = self.get_uncertain(tenant, id).await?;
        if record.status != "open" {
            return Err(CoordinatorError::Conflict(format!(
                "uncertain outcome {id} is already resolved ({} by {} at {})",
                record.resolution_kind.as_deref().unwrap_or("?"),
                record.resolved_by.as_deref().unwrap_or("?"),
                record
                    .resolved_at
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default()
            )));
        }
        let (by, why, call_id) = (
            resolved_by.to_owned(),
            reason.to_owned(),
            record.call_id.clone(),
        );
        self.transition(record.run_id, Some(record.task_id), |state, _| {
            machine::decide(
                state,
                Input::ResolveUncertain {
                    call_id,
                    resolution,
                    resolved_by: by,
                    reason: why,
                },
            )
            .map_err(CoordinatorError::from)
        })
        .await?;
        tracing::info!(uncertain_id = %record.uncertain_id, run_id = %record.run_id, resolved_by, "uncertain outcome resolved");
        self.get_uncertain(tenant, id).await
    }
}
