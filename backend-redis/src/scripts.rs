//! The Lua operations, run as Redis Functions or, where a server has none, as scripts.
//!
//! **Functions (Redis ≥ 7.0).** `lua/lib.lua` and every operation form one library,
//! loaded once per server with `FUNCTION LOAD`; each call is an `FCALL`. The library's
//! helpers are then defined once per load, not once per call: a script runs the library's
//! chunk again on every call and so builds each helper's closure anew, which cost 2–3 µs
//! of the server's time a call (about 4 on a machine half as fast). The library's
//! name carries a hash of its source ([`LIBRARY`]), so two relayq versions on one
//! server each call their own functions. A server that lost the library (restarted
//! without persistence, `FUNCTION FLUSH`, a new cluster master) answers "Function not
//! found", and the caller loads it again: nothing ran, so the call is safe to repeat.
//!
//! **Scripts (Redis 6, or an ACL that refuses `FCALL` or `FUNCTION LOAD`).** Each
//! operation is the library followed by its body, sent with `EVALSHA`;
//! `redis::Script` loads it again on `NOSCRIPT`.

use std::sync::LazyLock;

use redis::Script;

/// One operation: its body, run after the library's `begin(KEYS, ARGV)`.
pub(crate) struct Op {
    /// The function's name: the library's name and the operation's.
    pub(crate) function: LazyLock<String>,
    /// The operation as a script, for servers without functions.
    pub(crate) script: LazyLock<Script>,
}

macro_rules! ops {
    ($($name:ident = $op:literal in $file:literal $(, $flag:literal)?;)*) => {
        $(
            pub(crate) static $name: Op = Op {
                function: LazyLock::new(|| format!("{}_{}", LIBRARY.name, $op)),
                script: LazyLock::new(|| {
                    Script::new(concat!(
                        include_str!("lua/lib.lua"),
                        "begin(KEYS, ARGV)\n",
                        include_str!(concat!("lua/", $file)),
                    ))
                }),
            };
        )*

        /// Every operation: its function's name, body and flags.
        const BODIES: &[(&str, &str, &str)] = &[
            $(($op, include_str!(concat!("lua/", $file)), ops!(@flags $($flag)?)),)*
        ];
    };
    (@flags) => { "" };
    (@flags $flag:literal) => { $flag };
}

ops! {
    ENQUEUE = "enqueue" in "enqueue.lua";
    CLAIM = "claim" in "claim.lua";
    SETTLE = "settle" in "settle.lua";
    HEARTBEAT = "heartbeat" in "heartbeat.lua";
    PROGRESS = "progress" in "progress.lua";
    CANCEL = "cancel" in "cancel.lua";
    BATCH = "batch" in "batch.lua";
    ADMIN = "admin" in "admin.lua";
    SCHEDULE = "schedule" in "schedule.lua";
    FIRE = "fire" in "fire.lua";
    // Functions that may write are refused up front when the server is out of memory
    // (or short of replicas, or failing to persist); scripts ran until their first
    // write. Reads are flagged, so they still answer then: the batch's reads
    // (`progress`, `reached`) run its body under this flag.
    BATCH_READ = "batch_read" in "batch.lua", "no-writes";
    READ = "read" in "read.lua", "no-writes";
    SCHEDULE_READ = "schedule_read" in "schedule.lua", "no-writes";
}

/// The functions library: its name and the source `FUNCTION LOAD` takes.
pub(crate) struct Library {
    /// `relayq_` and the first 16 hex digits of the SHA-1 of the library's source.
    pub(crate) name: String,
    pub(crate) source: String,
}

/// The library of this version of relayq.
pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    // Written with a stand-in for the name, which is a hash of all of it.
    const NAME: &str = "RELAYQ_LIBRARY_NAME";
    let mut source = format!("#!lua name={NAME}\n{}\n", include_str!("lua/lib.lua"));
    for (op, body, flags) in BODIES {
        let flags = if flags.is_empty() {
            String::new()
        } else {
            format!(", flags = {{'{flags}'}}")
        };
        // The body keeps the names KEYS and ARGV: they are the callback's parameters.
        source.push_str(&format!(
            "redis.register_function{{function_name = '{NAME}_{op}', \
             callback = function(KEYS, ARGV)\nbegin(KEYS, ARGV)\n{body}\nend{flags}}}\n"
        ));
    }
    let name = format!("relayq_{}", &Script::new(&source).get_hash()[..16]);
    Library {
        source: source.replace(NAME, &name),
        name,
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_is_a_function_of_the_library() {
        assert!(LIBRARY.name.starts_with("relayq_"), "{}", LIBRARY.name);
        assert_eq!(LIBRARY.name.len(), "relayq_".len() + 16);
        for op in [
            &ENQUEUE,
            &CLAIM,
            &SETTLE,
            &HEARTBEAT,
            &PROGRESS,
            &CANCEL,
            &BATCH,
            &ADMIN,
            &BATCH_READ,
            &READ,
            &SCHEDULE,
            &FIRE,
            &SCHEDULE_READ,
        ] {
            let registered = format!("function_name = '{}'", *op.function);
            assert!(LIBRARY.source.contains(&registered), "{registered}");
        }
        assert_eq!(BODIES.len(), 13);
    }

    #[test]
    fn the_halt_logs_the_core_s_words() {
        let halt = format!("'{}'", relayq_core::cancelled_by::HALT);
        assert!(include_str!("lua/lib.lua").contains(&halt), "{halt}");
    }

    /// SPEC D4: lib.lua writes a cancelled child's error as the core does, around the
    /// parent's id and state.
    #[test]
    fn a_cancelled_child_gets_the_core_s_words() {
        use relayq_core::{JobId, JobState, cancelled_by};
        let words = cancelled_by::after(JobId(7), JobState::Dead);
        let (head, tail) = words.split_once('7').expect("the id");
        let tail = tail.strip_suffix("dead").expect("the state");
        let lua = include_str!("lua/lib.lua");
        for part in [head, tail] {
            assert_eq!(lua.matches(&format!("'{part}'")).count(), 2, "{part}");
        }
    }
}
