//! Wake-ups of the SQLite backend: an in-process broadcast fed after each
//! commit (one engine process per file, so no other process to tell;
//! PostgreSQL: `postgres/wakes.rs`), relayed by [`Lite::listen`].

use tokio::sync::broadcast;
use uuid::Uuid;

use super::Lite;
use crate::rows::StoreError;
use crate::transition::{Wake, Wakes};

impl Lite {
    pub(crate) async fn listen(
        &self,
        on_wake: &mut (dyn FnMut(Wake) + Send),
    ) -> Result<(), StoreError> {
        let mut rx = self.wake.subscribe();
        // Like PostgreSQL's listener, end with an error (`PoolClosed`) once
        // the store is closed, instead of waiting forever.
        let ended = self
            .write
            .close_event()
            .do_until(async {
                loop {
                    match rx.recv().await {
                        Ok(w) => on_wake(w),
                        // Fell behind: some wake-ups were dropped; everyone looks again.
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            self.tasks_seq.bump();
                            on_wake(Wake::Tasks)
                        }
                        Err(broadcast::error::RecvError::Closed) => {
                            return StoreError::Config("the store was closed".into());
                        }
                    }
                }
            })
            .await?;
        Err(ended)
    }

    pub(super) fn send_wakes(&self, run_id: Uuid, wakes: Wakes) {
        // No receiver (no coordinator listening) is fine.
        if wakes.tasks {
            self.tasks_seq.bump();
            let _ = self.wake.send(Wake::Tasks);
        }
        if wakes.events {
            let _ = self.wake.send(Wake::RunEvents(run_id));
        }
        if wakes.outbox {
            let _ = self.wake.send(Wake::Outbox);
        }
    }

    pub(crate) fn tasks_wake_seq(&self) -> u64 {
        self.tasks_seq.get()
    }
}
