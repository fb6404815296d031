//! Writes by primary key. Inside a transaction that holds its queue's lock, a write
//! first reads the ids of the rows it changes with a plain read (at READ COMMITTED, the
//! latest committed rows: no other writer of the queue runs meanwhile), then changes
//! them by id. An `UPDATE` through a secondary index's range would also lock the first
//! entry past the range until the transaction ends, and that entry may be another
//! queue's job: claims there, which skip locked rows, would pass over their earliest
//! job for as long (seen with a halt's `live_batch = ? AND stage > ?`, which locked
//! the first job of the next batch).

use relayq_core::Result;
use sqlx::{MySql, QueryBuilder};

use crate::{Conn, db};

/// The ids one statement names at most (a prepared statement takes 65,535
/// placeholders).
const CHUNK: usize = 10_000;

/// `set` (an `UPDATE ... SET ...` that `set` pushes) of the rows `ids`, in chunks;
/// returns the rows changed.
pub(crate) async fn update(
    c: &mut Conn,
    ids: &[i64],
    set: impl Fn(&mut QueryBuilder<MySql>),
) -> Result<u64> {
    let mut changed = 0;
    for chunk in ids.chunks(CHUNK) {
        let mut q = QueryBuilder::<MySql>::new("");
        set(&mut q);
        q.push(" WHERE id IN (");
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        list.push_unseparated(")");
        changed += q
            .build()
            .execute(&mut *c)
            .await
            .map_err(db)?
            .rows_affected();
    }
    Ok(changed)
}
