//! The audit of tool calls: the statement that pages a tenant's proposed
//! calls (PostgreSQL's, with correlated sub-selects for its laterals). The
//! rules (what each event means for a call) are in `crate::tool_calls`.

use sqlx::Sqlite;
use uuid::Uuid;

use super::{Lite, ts};
use crate::rows::StoreError;

impl Lite {
    /// See [`crate::Store::list_tool_calls`] and the PostgreSQL backend's
    /// (the same statement, with correlated sub-selects for its laterals).
    pub(crate) async fn list_tool_calls(
        &self,
        q: &crate::tool_calls::ToolCallQuery<'_>,
    ) -> Result<Vec<crate::tool_calls::ToolCallEvents>, StoreError> {
        use crate::tool_calls::END_KINDS;
        // A position between two ms lies after every row of its ms (see
        // `keyset`).
        let after = q.after.map(|(t, id, seq)| {
            if t.timestamp_subsec_nanos() % 1_000_000 == 0 {
                (ts(&t), id, seq)
            } else {
                (ts(&t), Uuid::max(), i64::MAX)
            }
        });
        let mut sql = sqlx::QueryBuilder::<Sqlite>::new("WITH page AS (");
        crate::tool_calls::push_page(&mut sql, q, after);
        sql.push(format_args!(
            "),
             found AS (
                 SELECT page.*,
                     (SELECT MIN(x.seq) FROM events x
                      WHERE x.run_id = page.run_id AND x.seq > page.seq AND x.kind = 'confirmation_decided'
                        AND x.payload->>'call_id' = page.payload->>'call_id') AS confirmation_seq,
                     (SELECT MAX(x.seq) FROM events x
                      WHERE x.run_id = page.run_id AND x.seq > page.seq AND x.kind IN {END_KINDS}
                        AND x.payload->>'call_id' = page.payload->>'call_id') AS end_seq,
                     (SELECT t.value->>'arguments'
                      FROM events x, json_each(x.payload, '$.tool_calls') t
                      WHERE page.kind = 'tool_call_refused' AND x.run_id = page.run_id AND x.seq < page.seq
                        AND x.kind = 'model_call_completed' AND t.value->>'id' = page.payload->>'tool_use_id'
                      ORDER BY x.seq DESC LIMIT 1) AS model_arguments
                 FROM page)
             SELECT p.run_id, p.seq, p.payload AS proposal, p.recorded_at AS proposed_at,
                    r.tenant, r.caller, c.payload AS confirmation,
                    e.payload AS end_payload, e.recorded_at AS ended_at, p.model_arguments
             FROM found p
             JOIN runs r ON r.run_id = p.run_id
             LEFT JOIN events c ON c.run_id = p.run_id AND c.seq = p.confirmation_seq
             LEFT JOIN events e ON e.run_id = p.run_id AND e.seq = p.end_seq
             ORDER BY p.recorded_at DESC, p.run_id DESC, p.seq DESC"
        ));
        Ok(sql.build_query_as().fetch_all(&self.read).await?)
    }
}
