//! The audit of tool calls: the statement that pages a tenant's proposed
//! calls. The rules (what each event means for a call) are in
//! `crate::tool_calls`.

use sqlx::Postgres;

use super::Pg;
use crate::rows::StoreError;

impl Pg {
    /// See [`crate::Store::list_tool_calls`]. The page is read from the
    /// partial index `events_tool_calls` (the keyset row comparison is its
    /// range, so a later page does not walk the earlier ones); only then are
    /// the page's other events looked up, in their runs.
    pub(crate) async fn list_tool_calls(
        &self,
        q: &crate::tool_calls::ToolCallQuery<'_>,
    ) -> Result<Vec<crate::tool_calls::ToolCallEvents>, StoreError> {
        use crate::tool_calls::END_KINDS;
        let mut sql = sqlx::QueryBuilder::<Postgres>::new(
            "SELECT p.run_id, p.seq, p.payload AS proposal, p.recorded_at AS proposed_at,
                    r.tenant, r.caller, c.payload AS confirmation,
                    e.payload AS end_payload, e.recorded_at AS ended_at,
                    m.arguments AS model_arguments
             FROM (",
        );
        crate::tool_calls::push_page(&mut sql, q, q.after);
        sql.push(format_args!(
            ") p
             JOIN runs r ON r.run_id = p.run_id
             LEFT JOIN LATERAL (
                 SELECT x.payload FROM events x
                 WHERE x.run_id = p.run_id AND x.seq > p.seq AND x.kind = 'confirmation_decided'
                   AND x.payload->>'call_id' = p.payload->>'call_id'
                 ORDER BY x.seq LIMIT 1) c ON true
             LEFT JOIN LATERAL (
                 SELECT x.payload, x.recorded_at FROM events x
                 WHERE x.run_id = p.run_id AND x.seq > p.seq AND x.kind IN {END_KINDS}
                   AND x.payload->>'call_id' = p.payload->>'call_id'
                 ORDER BY x.seq DESC LIMIT 1) e ON true
             LEFT JOIN LATERAL (
                 SELECT t->>'arguments' AS arguments
                 FROM events x CROSS JOIN jsonb_array_elements(x.payload->'tool_calls') t
                 WHERE p.kind = 'tool_call_refused' AND x.run_id = p.run_id AND x.seq < p.seq
                   AND x.kind = 'model_call_completed' AND t->>'id' = p.payload->>'tool_use_id'
                 ORDER BY x.seq DESC LIMIT 1) m ON true
             ORDER BY p.recorded_at DESC, p.run_id DESC, p.seq DESC"
        ));
        Ok(sql.build_query_as().fetch_all(&self.pool).await?)
    }
}
